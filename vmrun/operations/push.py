"""`vmrun push PATH...`: a file or a tree onto every selected host, each PATH arriving as
DIR/<its name> (DIR: `--to`, else the project's work directory there, so a script's `data/`
is where it looks). Each host's push is vmrun.transfer.push's: checked first, then only what
changed, verified and renamed into place when whole, so a cut push never leaves half a file
under its final name and the next push sends what is missing.

A bucket prefix (`s3://BUCKET/PREFIX`) instead of paths: every host copies it straight from
the bucket, all at once (vmrun.stores.mover); this machine sends only commands.
"""

from __future__ import annotations

import functools
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun.backends.select import Target, landing, one_place, target_entries
from vmrun.config import Settings
from vmrun.errors import UsageError
from vmrun.operations.hostlist import Hosts
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, Outcome, worst_exit_code
from vmrun.ssh.inventory import HostEntry
from vmrun.store_url import StoreURL
from vmrun.transfer.push import HostPush, Planned, check_sources, push_host
from vmrun.transfer.types import Progress


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
    stores: Sequence[StoreURL] = ()  # bucket prefixes, instead of paths
    store_credentials: str = "auto"  # auto, host or mine (vmrun.stores.access)


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
        """0 when every host has everything; else the worst host's failure, or FAILED for
        files (objects) that did not arrive intact."""
        from vmrun.errors import ExitCode

        failed = any(r.failed for o in self.outcomes if o.value for r in o.value.reports)
        return max(worst_exit_code(self.outcomes), ExitCode.FAILED if failed else 0)


def push(job: PushJob, out: Reporter = QUIET) -> Pushed:
    """Every PATH onto every host. With several hosts and only folders to send, the data
    crosses from here once, to the nearest host (by round trip), and from there host to
    host, doubling the senders each round (vmrun.transfer.relay: a key for that transfer
    alone, removed in every ending), each host reached at its `private_addr`, else at the
    address vmrun itself reaches it (its ssh-config HostName): which host reaches which
    is asked once, beside the round-trip measure. A host that none reaches that way gets
    it from here, said in a line."""
    if job.stores:
        return _from_stores(job, out)
    paths = check_sources(job.paths)
    target, entries = _where(job)
    several = len(entries) > 1
    shown = out.progress(several=several)
    dest = ""

    clock = time.monotonic()

    def direct(entry: HostEntry, conn: Connection) -> HostPush:
        began = time.monotonic() - clock
        done = push_host(
            conn,
            paths,
            dest,
            shown,
            dry_run=job.dry_run,
            engine=job.engine,
            delete=job.delete,
            bwlimit=job.bwlimit,
        )
        done.began, done.ended = began, time.monotonic() - clock
        return done

    with Group(entries, job.settings) as group:
        dest, _ = landing(target, job.settings, group, job.to)  # a cluster: once, its login's
        relay = job.relay and target.capabilities.relay_push
        if job.dry_run or not relay or len(entries) < 2 or not all(p.is_dir() for p in paths):
            return Pushed(dest, group.map(direct), job.dry_run, job.delete)
        relayed = _Relayed(group, paths, dest, shown, out, direct, clock)
        outcomes = relayed.run(entries)
    return Pushed(dest, outcomes, job.dry_run, job.delete)


REACH_TIMEOUT_S = 2.0  # a host's TCP connect to another's sshd, in the reachability probe
# how many hosts one host sends to at once in a round of host-to-host copies: two 256 MiB
# hops on the hosts' own network took 1.2 + 1.5 s one after the other, 2.35 s side by side,
# after 11.6 s for the first copy over a 200 Mbit/s link (benchmarks/push.py --fan)
FAN_OUT = 2


def relay_addresses(group: Group, entries: Sequence[HostEntry]) -> dict[str, tuple[str, int]]:
    """Where the other hosts may reach each host's sshd: its `private_addr` (port 22), else
    the address and port vmrun's own connection went to (the ssh-config HostName, as
    resolved here). A host reached through a jump host or a proxy command has none (the
    others cannot reach it the way vmrun does)."""
    found: dict[str, tuple[str, int]] = {}
    for entry in entries:
        private = str(entry.vars.get("private_addr") or "")
        conn = group.connections.get(entry.label)
        target = conn.target if conn is not None else None
        if private:
            found[entry.label] = (private, 22)
        elif (
            conn is not None
            and target is not None
            and not target.proxy_jump
            and not target.proxy_command
        ):
            try:
                found[entry.label] = (str(conn.transport.getpeername()[0]), target.port)
            except (OSError, AttributeError, IndexError):
                continue
    return found


def reaches(conn: Connection, others: dict[str, tuple[str, int]]) -> set[str]:
    """Which of `others` (label: address, port) this host opens a TCP connection to and
    hears an SSH server's banner from (hostside/netprobe.py `sshd`, all at once); none when
    the host cannot say (no python3)."""
    import json

    from vmrun import hostside
    from vmrun.errors import VmrunError
    from vmrun.ssh.quoting import plain_command

    if not others:
        return set()
    labels = list(others)
    targets = [f"{others[k][0]}:{others[k][1]}" for k in labels]
    argv = hostside.command("netprobe.py", "sshd", f"{REACH_TIMEOUT_S:g}", *targets)
    try:
        status, said, _ = conn.capture(
            plain_command(argv, activity=False), what="the host-to-host reachability probe"
        )
        results = json.loads(said.decode(errors="replace").strip().splitlines()[-1])
    except (VmrunError, ValueError, IndexError):
        return set()
    if status != 0 or not isinstance(results, list):
        return set()
    return {k for k, r in zip(labels, results, strict=False) if isinstance(r, dict) and r.get("ok")}


def _from_stores(job: PushJob, out: Reporter) -> Pushed:
    """Every host copies each prefix from the bucket at once (a cluster: once, from its
    login node onto the shared filesystem), each arriving as DIR/<its last part>."""
    from vmrun.stores.access import resolve
    from vmrun.stores.mover import copy_from_store

    if job.paths:
        raise UsageError(
            "push files here and bucket prefixes in separate commands", code="bad-store"
        )
    if job.delete:
        raise UsageError("--delete is for pushes from here, not from a bucket", code="bad-store")
    access = resolve(job.store_credentials)
    target, entries = _where(job)
    shown = out.progress(several=len(entries) > 1)
    clock = time.monotonic()
    with Group(entries, job.settings) as group:
        # a cluster: on the login connection the copy then uses; "": each host's python
        dest, python = landing(target, job.settings, group, job.to)

        def one(entry: HostEntry, conn: Connection) -> HostPush:
            done = HostPush(conn.label, began=time.monotonic() - clock)
            where = str(entry.vars.get("python") or python)
            for url in job.stores:
                remote = posixpath.join(dest, url.name)
                got = copy_from_store(
                    conn,
                    url,
                    remote,
                    access.on(entry.vars),
                    shown,
                    python=where,
                    dry_run=job.dry_run,
                )
                wanted = got.would if job.dry_run else [(k, 0) for k in got.report.fetched]
                sizes = sum(size for _, size in wanted)
                done.planned.append(
                    Planned(str(url), remote, got.objects, got.nbytes, len(wanted), sizes)
                )
                done.reports.append(got.report)
            done.ended = time.monotonic() - clock
            return done

        return Pushed(dest, group.map(one), job.dry_run)


def _where(job: PushJob) -> tuple[Target, list[HostEntry]]:
    """The push's target (hosts, or a cluster: once, through its login node) and the
    machines it reaches."""
    one_place(job.hosts, job.cluster, "-H and -C: push to hosts or to a cluster", "flags-conflict")
    names = [h if isinstance(h, str) else h.label for h in job.hosts or ()]
    target = Target.of(hosts=names, cluster=job.cluster)
    return target, target_entries(target, job.settings, job.hosts)


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
        clock: float,
    ) -> None:
        self.group, self.paths, self.dest = group, paths, dest
        self.progress, self.out, self.direct = progress, out, direct
        self.clock = clock  # the push's start (time.monotonic()): each hop's times from it
        self.done: dict[str, Outcome[HostPush]] = {}
        self.checked: dict[str, HostPush] = {}  # each host's plan, from the checks
        self.addrs: dict[str, tuple[str, int]] = {}  # where the others reach each host
        self.reach: dict[str, set[str]] = {}  # which hosts each host reaches there

    def run(self, entries: list[HostEntry]) -> list[Outcome[HostPush]]:
        from vmrun.transfer.streams import measure_rtt

        # every host checked first (folder, free space): nothing moves while one cannot take it
        checked = self.group.map(lambda e, c: push_host(c, self.paths, self.dest, dry_run=True))
        self.checked = {o.host: o.value for o in checked if o.value is not None}
        failed = {o.host: o for o in checked if o.error is not None}
        self.done.update(failed)
        live = [e for e in entries if e.label not in failed]
        self.addrs = relay_addresses(self.group, live)
        ready = [e for e in live if e.label in self.addrs]
        others = [e for e in live if e not in ready]
        if len(ready) > 1:
            labels = {e.label for e in ready}

            def measure(entry: HostEntry, conn: Connection) -> tuple[float, set[str]]:
                peers = {k: v for k, v in self.addrs.items() if k != entry.label and k in labels}
                return measure_rtt(conn), reaches(conn, peers)

            measured = {o.host: o.value for o in self.group.map(measure, only=labels)}
            rtt = {h: v[0] if v else float("inf") for h, v in measured.items()}
            self.reach = {h: v[1] if v else set() for h, v in measured.items()}
            senders = [e for e in ready if self.reach.get(e.label)]
            if not senders:
                self.out.info(
                    "the hosts do not reach each other's SSH at the addresses vmrun"
                    " uses (a private network: private_addr in vmrun.toml); each"
                    " gets the data from here"
                )
                others += ready
            else:
                first = min(senders, key=lambda e: rtt[e.label])
                self.done.update(
                    {o.host: o for o in self.group.map(self.direct, only={first.label})}
                )
                if self.done[first.label].ok:
                    others += self._rounds(first, [e for e in ready if e is not first])
                else:
                    others += [e for e in ready if e is not first]
        else:
            others += ready
        if others:
            self.done.update(
                {o.host: o for o in self.group.map(self.direct, only={e.label for e in others})}
            )
        return [self.done[e.label] for e in entries]

    def _rounds(self, first: HostEntry, targets: list[HostEntry]) -> list[HostEntry]:
        """Host to host in rounds, each host that has the data sending to up to FAN_OUT
        that lack it and that it reaches (so 1, 3, 9... hosts have it: 3 hosts take one
        round after the first copy, where one at a time took two); the hosts left to send
        from here (no host reached them)."""
        senders, pending, fallback = [first], list(targets), []
        while pending:
            source: dict[str, HostEntry] = {}
            free = [s for s in senders for _ in range(FAN_OUT)]
            for dst in list(pending):
                src = next((s for s in free if dst.label in self.reach.get(s.label, ())), None)
                if src is not None:
                    source[dst.label] = src
                    free.remove(src)
                    pending.remove(dst)
            if not source:  # none of the hosts that have it reaches these
                for dst in pending:
                    addr = self.addrs[dst.label][0]
                    self.out.warn(
                        f"{dst.label}: no other host reaches its SSH at {addr}; sending from here"
                    )
                fallback += pending
                break
            results = self.group.map(functools.partial(self._relay_from, source), only=set(source))
            for result in results:
                dst = next(e for e in targets if e.label == result.host)
                if result.ok:
                    self.done[result.host] = result
                    senders.append(dst)
                elif _falls_back(result.error):
                    self.out.warn(
                        f"{result.host}: not reachable host to host"
                        f" ({result.error}); sending from here"
                    )
                    fallback.append(dst)
                else:
                    self.done[result.host] = result
        return fallback

    def _relay_from(
        self, source: dict[str, HostEntry], dst: HostEntry, conn: Connection
    ) -> HostPush:
        return self._relay_to(source[dst.label], dst, conn)

    def _relay_to(self, src: HostEntry, dst: HostEntry, conn: Connection) -> HostPush:
        from vmrun.transfer.relay import relay
        from vmrun.transfer.types import Report

        key = conn.transport.get_remote_server_key()
        done = HostPush(dst.label, via=src.label, planned=list(self.checked[dst.label].planned))
        done.began = time.monotonic() - self.clock
        addr, port = self.addrs[dst.label]
        for path in self.paths:
            remote = f"{self.dest.rstrip('/')}/{path.resolve().name}"
            got = relay(
                self.group.connections[src.label],
                conn,
                addr,
                remote,
                remote,
                dst_host_key=f"{key.get_name()} {key.get_base64()}",
                out=self.out,
                progress=self.progress,
                dst_port=port,
                src_addr=str(src.vars.get("private_addr") or "") or None,
            )
            done.reports.append(
                Report(
                    host=dst.label,
                    engine=f"from {src.label}",
                    fetched=list(got.sent),
                    fetched_bytes=got.sent_bytes,
                    wire_bytes=got.sent_bytes,
                    unchanged=got.unchanged,
                    skipped=list(got.skipped),
                    seconds=got.seconds,
                )
            )
        done.ended = time.monotonic() - self.clock
        return done


def _falls_back(error: BaseException | None) -> bool:
    """A host the first one cannot reach on its private address (or is refused by: NAT
    changes the source address the key allows) gets the data from here instead."""
    from vmrun.errors import AuthError

    return getattr(error, "code", "") == "relay-unreachable" or isinstance(error, AuthError)
