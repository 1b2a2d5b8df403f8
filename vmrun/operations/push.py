"""`vmrun push PATH...`: a file or a tree onto every selected host, each PATH arriving as
DIR/<its name> (DIR: `--to`, else the project's work directory there, so a script's `data/`
is where it looks). Each host's push is vmrun.transfer.push's: checked first, then only what
changed, verified and renamed into place when whole, so a cut push never leaves half a file
under its final name and the next push sends what is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun.config import Settings
from vmrun.errors import UsageError
from vmrun.operations.hostlist import Hosts, entries_for
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, Outcome, worst_exit_code
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.push import HostPush, check_sources, push_host
from vmrun.transfer.types import Progress

MakeProgress = Callable[[bool], Progress]


@dataclass(frozen=True)
class PushJob:
    settings: Settings
    paths: Sequence[Path]
    to: str | None = None  # the folder each PATH lands in; None: the project's work directory
    hosts: Hosts = None
    dry_run: bool = False
    engine: str = "auto"
    delete: bool = False  # files under a pushed folder there that are not here go
    bwlimit: float | None = None  # bytes per second, per host
    relay: bool = True  # folders cross the slow link once, then go host to host
    cluster: str | None = None  # a Slurm cluster: once, through its login node


@dataclass
class Pushed:
    dest: str
    outcomes: list[Outcome[HostPush]]
    dry_run: bool = False
    delete: bool = False

    @property
    def several(self) -> bool:
        return len(self.outcomes) > 1

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.outcomes)


def destination(job: PushJob) -> str:
    """The remote folder (normalised: `a/b` under the home, or `/abs`)."""
    from vmrun.remote_paths import remote_workdir
    from vmrun.transfer.manifest import normalize_remote

    workdir = remote_workdir(job.settings.project_dir or Path.cwd())
    if job.to is None:
        return workdir
    return normalize_remote(job.to, base=workdir, where="the project's work directory")


def push(job: PushJob, out: Reporter = QUIET, progress: MakeProgress | None = None) -> Pushed:
    """Every PATH onto every host. With several hosts that list a `private_addr` and only
    folders to send, the data crosses from here once, to the nearest host (by round trip),
    and from there host to host over the private addresses, doubling the senders each round
    (vmrun.transfer.relay: a key for that transfer alone, removed in every ending); a host
    that cannot be reached that way gets it from here."""
    paths = check_sources(job.paths)
    if job.cluster:
        return _to_cluster(job, paths, out, progress)
    dest = destination(job)
    entries = entries_for(job.hosts, job.settings)
    several = len(entries) > 1
    shown = progress(several) if progress is not None else Progress()

    def direct(entry: HostEntry, conn: Connection) -> HostPush:
        return push_host(
            conn, paths, dest, shown, dry_run=job.dry_run, engine=job.engine,
            delete=job.delete, bwlimit=job.bwlimit,
        )  # fmt: skip

    with Group(entries, job.settings) as group:
        private = [e for e in entries if e.vars.get("private_addr")]
        if job.dry_run or not job.relay or len(private) < 2 or not all(p.is_dir() for p in paths):
            return Pushed(dest, group.map(direct), job.dry_run, job.delete)
        relayed = _Relayed(group, paths, dest, shown, out, direct)
        outcomes = relayed.run(entries, private)
    return Pushed(dest, outcomes, job.dry_run, job.delete)


def _to_cluster(
    job: PushJob, paths: list[Path], out: Reporter, progress: MakeProgress | None
) -> Pushed:
    """Once, through the login node, onto the cluster's shared filesystem: by default the
    folder its jobs run the project in (`<workdir>/<project's work directory>`), where a
    job's `data/` is looked for; never once per compute node."""
    from vmrun.backends.slurm.backend import SlurmBackend
    from vmrun.backends.slurm.cluster import find_cluster
    from vmrun.remote_paths import remote_workdir
    from vmrun.transfer.manifest import normalize_remote

    if job.hosts:
        raise UsageError("-H and -C: push to hosts or to a cluster", code="flags-conflict")
    cluster = find_cluster(job.settings, job.cluster or "")
    shown = progress(False) if progress is not None else Progress()
    with Group([cluster.entry], job.settings) as group:
        conn = group.connections[cluster.entry.label]
        shared = SlurmBackend(conn, cluster).facts().workdir
        code = f"{shared}/{remote_workdir(job.settings.project_dir or Path.cwd())}"
        dest = (
            code
            if job.to is None
            else normalize_remote(job.to, base=code, where="the cluster's project folder")
        )

        def once(entry: HostEntry, conn: Connection) -> HostPush:
            return push_host(conn, paths, dest, shown, dry_run=job.dry_run, engine=job.engine,
                             delete=job.delete, bwlimit=job.bwlimit)  # fmt: skip

        return Pushed(dest, group.map(once), job.dry_run, job.delete)


class _Relayed:
    """One push in rounds: here -> the nearest host, then host -> host."""

    def __init__(
        self,
        group: Group,
        paths: list[Path],
        dest: str,
        progress: Progress,
        out: Reporter,
        direct: Callable[[HostEntry, Connection], HostPush],
    ) -> None:
        self.group, self.paths, self.dest = group, paths, dest
        self.progress, self.out, self.direct = progress, out, direct
        self.done: dict[str, Outcome[HostPush]] = {}
        self.checked: dict[str, HostPush] = {}  # each host's plan, from the checks

    def run(self, entries: list[HostEntry], private: list[HostEntry]) -> list[Outcome[HostPush]]:
        from vmrun.transfer.streams import measure_rtt

        # every host checked first (folder, free space): nothing moves while one cannot take it
        checked = self.group.map(
            lambda e, c: push_host(c, self.paths, self.dest, dry_run=True)
        )  # fmt: skip
        self.checked = {o.host: o.value for o in checked if o.value is not None}
        failed = {o.host: o for o in checked if o.error is not None}
        self.done.update(failed)
        ready = [e for e in private if e.label not in failed]
        others = [e for e in entries if e not in ready and e.label not in failed]
        if ready:
            rtts = self.group.map(lambda e, c: measure_rtt(c), only={e.label for e in ready})
            rtt = {o.host: o.value if o.value is not None else float("inf") for o in rtts}
            first = min(ready, key=lambda e: rtt[e.label])
            self.done.update({o.host: o for o in self.group.map(self.direct, only={first.label})})
            if self.done[first.label].ok:
                self._rounds(first, [e for e in ready if e is not first])
            else:
                others += [e for e in ready if e is not first]
        if others:
            self.done.update({o.host: o for o in self.group.map(
                self.direct, only={e.label for e in others})})  # fmt: skip
        return [self.done[e.label] for e in entries]

    def _rounds(self, first: HostEntry, targets: list[HostEntry]) -> None:
        senders, pending, fallback = [first], list(targets), []
        while pending:
            batch, pending = pending[: len(senders)], pending[len(senders) :]
            source = {dst.label: src for src, dst in zip(senders, batch, strict=False)}
            results = self.group.map(functools.partial(self._relay_from, source), only=set(source))
            for result in results:
                if result.ok:
                    self.done[result.host] = result
                    senders.append(next(e for e in batch if e.label == result.host))
                elif _falls_back(result.error):
                    self.out.warn(f"{result.host}: not reachable host to host"
                                  f" ({result.error}); sending from here")  # fmt: skip
                    fallback.append(result.host)
                else:
                    self.done[result.host] = result
        if fallback:
            self.done.update({o.host: o for o in self.group.map(self.direct, only=set(fallback))})

    def _relay_from(
        self, source: dict[str, HostEntry], dst: HostEntry, conn: Connection
    ) -> HostPush:
        return self._relay_to(source[dst.label], dst, conn)

    def _relay_to(self, src: HostEntry, dst: HostEntry, conn: Connection) -> HostPush:
        from vmrun.transfer.relay import relay
        from vmrun.transfer.types import Report

        key = conn.transport.get_remote_server_key()
        done = HostPush(dst.label, via=src.label, planned=list(self.checked[dst.label].planned))
        for path in self.paths:
            remote = f"{self.dest.rstrip('/')}/{path.resolve().name}"
            got = relay(
                self.group.connections[src.label], conn, str(dst.vars["private_addr"]),
                remote, remote, dst_host_key=f"{key.get_name()} {key.get_base64()}",
                out=self.out, progress=self.progress,
                src_addr=str(src.vars.get("private_addr") or "") or None,
            )  # fmt: skip
            done.reports.append(Report(
                host=dst.label, engine=f"from {src.label}", fetched=list(got.sent),
                fetched_bytes=got.sent_bytes, wire_bytes=got.sent_bytes,
                unchanged=got.unchanged, skipped=list(got.skipped), seconds=got.seconds,
            ))  # fmt: skip
        return done


def _falls_back(error: BaseException | None) -> bool:
    """A host the first one cannot reach on its private address (or is refused by: NAT
    changes the source address the key allows) gets the data from here instead."""
    from vmrun.errors import AuthError

    return getattr(error, "code", "") == "relay-unreachable" or isinstance(error, AuthError)
