"""`vmrun push PATH...`: a file or a tree onto every selected host, each PATH arriving as
DIR/<its name> (DIR: `--to`, else the project's work directory there, so a script's `data/`
is where it looks). Each host's push is vmrun.transfer.push's: checked first, then only what
changed, verified and renamed into place when whole, so a cut push never leaves half a file
under its final name and the next push sends what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun.config import Settings
from vmrun.operations.hostlist import Hosts, entries_for
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Outcome, worst_exit_code
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
    from vmrun.ssh.group import Group

    paths = check_sources(job.paths)
    dest = destination(job)
    entries = entries_for(job.hosts, job.settings)
    several = len(entries) > 1
    shown = progress(several) if progress is not None else Progress()

    def one(entry: HostEntry, conn: Connection) -> HostPush:
        return push_host(
            conn,
            paths,
            dest,
            shown,
            dry_run=job.dry_run,
            engine=job.engine,
            delete=job.delete,
            bwlimit=job.bwlimit,
        )

    with Group(entries, job.settings) as group:
        outcomes = group.map(one)
    return Pushed(dest, outcomes, job.dry_run, job.delete)
