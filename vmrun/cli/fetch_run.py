"""Running `vmrun fetch`: every host in parallel, once or (--watch) round after round."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmrun.backends.api import RunRef
from vmrun.cli import output
from vmrun.config import Settings
from vmrun.errors import ExitCode, Interrupted, UsageError, exit_code_for
from vmrun.remote_paths import remote_workdir
from vmrun.runs.outputs import RunLocation
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry

WATCH_SETTLE = 2.0  # --watch leaves files alone until they are this old (still being written)


@dataclass
class FetchJob:
    items: list[str]
    run: str | None
    to: str | None
    hosts: list[str] | None
    all_hosts: bool
    latest: int | None
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    verify: bool
    watch: bool
    interval: float
    bwlimit: float | None
    settings: Settings
    cluster: str | None = None  # -C: from the cluster's shared filesystem


def _entries(job: FetchJob) -> list[HostEntry]:
    from vmrun.ssh.inventory import project_hosts, select_hosts

    if job.cluster:
        from vmrun.backends.slurm.cluster import find_cluster

        return [find_cluster(job.settings, job.cluster).entry]
    if job.all_hosts:
        entries = project_hosts(job.settings)
        if not entries:
            raise UsageError("--all-hosts: vmrun.toml lists no hosts", code="no-hosts")
        return entries
    return select_hosts(job.hosts, job.settings)


def _destination(job: FetchJob) -> Path:
    if job.to is not None:
        return Path(job.to).expanduser()
    return job.settings.project_dir or Path.cwd()


def run_fetch(job: FetchJob) -> int:
    import os

    from vmrun.cli.fetch_view import LiveProgress, make_progress
    from vmrun.runs.outputs import WHATS, specs_for
    from vmrun.transfer.download import download
    from vmrun.transfer.streams import stop_all_streams
    from vmrun.transfer.types import Options

    entries = _entries(job)
    dest = _destination(job)
    options = Options(
        verify=job.verify,
        settle=WATCH_SETTLE if job.watch else 0.0,
        engine=os.environ.get("VMRUN_TRANSFER_ENGINE", "auto").strip().lower() or "auto",
        bwlimit=job.bwlimit,
    )
    if options.engine not in ("auto", "openssh", "paramiko"):
        raise UsageError("VMRUN_TRANSFER_ENGINE must be auto, openssh or paramiko")
    live = sys.stderr.isatty() and not job.watch
    workdir = remote_workdir(job.settings.project_dir or Path.cwd())
    stop = threading.Event()
    code = incomplete = 0
    with Group(entries, job.settings) as group:
        run, only = job.run, None
        where: dict[str, RunLocation] = {}
        slurm = _cluster_backend(job, group)
        if slurm is not None:  # the code's folder on the cluster's shared filesystem
            workdir = f"{slurm.facts().workdir}/{workdir}"
        if run is not None or any(item in WHATS for item in job.items):
            run, where, ref = _the_run(group, run, slurm)
            only = set(where)
            # its nodes that did not answer: named now, and the exit status says so
            incomplete = output.unreached(ref, "has no files fetched from there")
        multi = job.all_hosts or len(only or entries) > 1
        progress = make_progress(prefix=multi, live=live)

        def work(entry, conn):
            specs = specs_for(
                conn,
                job.items,
                run=run,
                location=where.get(entry.label),
                workdir=workdir,
                host_dir=entry.label.replace("/", "_") if multi else None,
                include=job.include,
                exclude=job.exclude,
                latest=job.latest,
            )
            return download(conn, specs, dest, options, progress)

        if job.watch:
            _note(f"watching {len(entries)} host(s) every {job.interval:g} s; Ctrl-C to stop")
        while True:
            try:
                if isinstance(progress, LiveProgress):
                    with progress:
                        outcomes = group.map(work, only=only)
                else:
                    outcomes = group.map(work, only=only)
            except Interrupted:
                stop_all_streams()  # partial copies stay, under temporary names: resumable
                if not job.watch:
                    raise
                _note("stopped watching (the interrupted files resume next time)")
                return code
            code = max(incomplete, _report(outcomes, prefix=multi, quiet=job.watch))
            if not job.watch:
                return code
            try:
                stop.wait(job.interval)
            except KeyboardInterrupt:
                _note("stopped watching")
                return code


def _cluster_backend(job: FetchJob, group: Group) -> Any:
    if not job.cluster:
        return None
    from vmrun.backends.slurm.backend import SlurmBackend
    from vmrun.backends.slurm.cluster import find_cluster

    cluster = find_cluster(job.settings, job.cluster)
    return SlurmBackend(group.connections[cluster.entry.label], cluster)


def _the_run(
    group: Group, run: str | None, slurm: Any = None
) -> tuple[str, dict[str, RunLocation], RunRef]:
    """The run (the newest across the hosts unless named) and where its files are on each
    node it ran on, as the run's backend says: a run's files come from its nodes alone,
    every node agrees on which run that is, and this one listing replaces a lookup per host."""
    from vmrun.backends.hosts.backend import HostsBackend

    backend = slurm or HostsBackend(group)
    try:
        ref = backend.find(run)
    except UsageError as exc:
        raise UsageError(
            f"no record of {f'run {run}' if run else 'any run'}"
            f" on {', '.join(e.label for e in group.entries)}",
            hint="`vmrun status` lists the runs; or fetch an explicit path",
            code="run-not-found",
        ) from exc
    return ref.run_id, backend.outputs(ref), ref


def _note(text: str) -> None:
    sys.stderr.write(f"vmrun: {text}\n")
    sys.stderr.flush()


def _report(outcomes: list, *, prefix: bool, quiet: bool) -> int:
    from vmrun.cli.fetch_view import summary
    from vmrun.cli.output import error_line, report, warn_line

    codes = [0]
    for outcome in outcomes:
        if outcome.error is not None:
            report(outcome.error)
            codes.append(exit_code_for(outcome.error))
            continue
        rep = outcome.value
        busy = rep.fetched or rep.failed or rep.missing or rep.replaced
        if not quiet or busy:
            print(summary(rep, prefix=prefix), flush=True)
        if not quiet:
            for text in rep.skipped:
                warn_line(f"{rep.host}: skipped {text}")
        for path, why in rep.failed.items():
            if path in rep.mismatched:
                error_line(f"{rep.host}: {path}: {why}", code="checksum-mismatch")
            else:
                error_line(f"{rep.host}: {path}: {why}", code="file-not-fetched")
            codes.append(ExitCode.FAILED)
        for name in rep.missing:
            error_line(
                f"{rep.host}: {name}: not found on the host{_tilde_hint(name)}",
                code="remote-path-not-found",
            )
            codes.append(ExitCode.REMOTE)
    return max(codes)


def _tilde_hint(name: str) -> str:
    """`vmrun fetch ~/x` unquoted reaches vmrun as this machine's home: say how to quote it."""
    home = str(Path.home()).rstrip("/")
    if not home or not (name == home or name.startswith(home + "/")):
        return ""
    rel = name[len(home) :].lstrip("/")
    return (
        f" (your shell turned `~` into this machine's home, {home}; for the host's home,"
        f" quote it: vmrun fetch '~/{rel}')"
    )
