"""`vmrun push PATH...`: a file or a tree onto every selected host, each PATH arriving as
DIR/<its name> (DIR: `--to`, else the project's work directory there, so a script's `data/`
is where it looks).

Each host is checked before anything is sent (the folder can be made and written, its disk
has room for what will change), then gets vmrun's verified upload
(vmrun.transfer.upload): only files new or changed by size and mtime, one tar stream, each
file's SHA-256 checked on the host, written under a temporary name and renamed into place
only when whole, so a cut push never leaves half a file under its final name and the next
push sends what is missing.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vmrun.config import Settings
from vmrun.errors import RemoteError, UsageError
from vmrun.operations.hostlist import Hosts, entries_for
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Outcome, worst_exit_code
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.types import Options, Progress, Report

CHECK = "push_check.sh"  # vmrun/hostside: the folder can be written, the disk has room
MakeProgress = Callable[[bool], Progress]


@dataclass(frozen=True)
class PushJob:
    settings: Settings
    paths: Sequence[Path]
    to: str | None = None  # the folder each PATH lands in; None: the project's work directory
    hosts: Hosts = None
    dry_run: bool = False
    engine: str = "auto"


@dataclass(frozen=True)
class Planned:
    """One PATH on one host: where it lands, and what a push would send (by size and mtime:
    files in doubt are settled by checksum only when sending)."""

    local: Path
    remote: str
    files: int
    nbytes: int
    to_send: int
    bytes_to_send: int


@dataclass
class HostPush:
    host: str
    planned: list[Planned] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    free_kib: int | None = None


@dataclass
class Pushed:
    dest: str
    outcomes: list[Outcome[HostPush]]
    dry_run: bool = False

    @property
    def several(self) -> bool:
        return len(self.outcomes) > 1

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.outcomes)


def check_sources(paths: Sequence[Path]) -> list[Path]:
    """Every PATH exists and is a file or a folder (one line for the first that is not)."""
    if not paths:
        raise UsageError("nothing to push: give a file or a folder", hint="vmrun push data/")
    found = []
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path} does not exist", code="source-not-found")
        if not (path.is_file() or path.is_dir()):
            raise UsageError(f"{path} is neither a file nor a folder", code="source-not-found")
        found.append(path)
    names = [p.resolve().name for p in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(
            f"two paths would land as the same name: {', '.join(twice)}",
            hint="push them one at a time with different --to folders",
            code="flags-conflict",
        )
    return found


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
        return _push_host(conn, paths, dest, job, shown)

    with Group(entries, job.settings) as group:
        outcomes = group.map(one)
    return Pushed(dest, outcomes, job.dry_run)


def _push_host(
    conn: Connection, paths: list[Path], dest: str, job: PushJob, progress: Progress
) -> HostPush:
    from vmrun.transfer.manifest import list_remote
    from vmrun.transfer.upload import upload

    done = HostPush(conn.label)
    remotes = [posixpath.join(dest, p.resolve().name) for p in paths]
    listing = list_remote(conn, [posixpath.dirname(r) if p.is_file() else r
                                 for p, r in zip(paths, remotes, strict=True)])  # fmt: skip
    for path, remote, root in zip(paths, remotes, listing.roots, strict=True):
        done.planned.append(_plan(path, remote, root.entries if root.state == "ok" else []))
    needed = sum(p.bytes_to_send for p in done.planned)
    done.free_kib = _check(conn, dest, needed)
    if job.dry_run:
        return done
    options = Options(engine=job.engine)
    for path, remote, root in zip(paths, remotes, listing.roots, strict=True):
        report = upload(conn, path, remote, options, progress,
                        listing=root if path.is_dir() else None)  # fmt: skip
        done.reports.append(report)
    return done


def _plan(local: Path, remote: str, entries: Sequence[object]) -> Planned:
    """What would be sent, by size and mtime against the host's listing."""
    there: dict[str, tuple[int, int]] = {}
    for entry in entries:
        rel, kind = getattr(entry, "rel", ""), getattr(entry, "kind", "")
        if kind == "f":
            there[rel] = (getattr(entry, "size", -1), getattr(entry, "mtime_ns", -1))
    files = nbytes = to_send = bytes_to_send = 0
    for rel, size, mtime_ns in _walk(local):
        files += 1
        nbytes += size
        key = posixpath.basename(remote) if local.is_file() else rel
        if there.get(key) != (size, mtime_ns):
            to_send += 1
            bytes_to_send += size
    return Planned(local, remote, files, nbytes, to_send, bytes_to_send)


def _walk(local: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of each regular file; symlinks are not followed."""
    st = local.stat()
    if stat.S_ISREG(st.st_mode):
        return [(local.name, st.st_size, st.st_mtime_ns)]
    found = []
    for folder, dirs, names in os.walk(local):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            lst = os.lstat(path)
            if stat.S_ISREG(lst.st_mode):
                found.append((path.relative_to(local).as_posix(), lst.st_size, lst.st_mtime_ns))
    return found


def _check(conn: Connection, dest: str, needed: int) -> int | None:
    """The folder made and writable, with room for `needed` bytes (one round trip)."""
    from vmrun import hostside
    from vmrun.transfer.manifest import remote_arg

    need_kib = (needed + 1023) // 1024
    result = conn.run(
        [*hostside.command(CHECK), remote_arg(dest), str(need_kib)],
        check=True,
        what="the push check",
    )
    words = result.stdout_tail.split()
    if words[:1] == ["nowrite"]:
        raise UsageError(
            f"cannot make or write {dest} on the host",
            host=conn.label,
            hint="push --to a folder under your home, or make it yours there (sudo chown)",
            code="target-not-writable",
        )
    if words[:1] == ["nospace"]:
        free = int(words[1])
        raise RemoteError(
            f"{dest} has {free // 1024} MiB free, the push needs {need_kib // 1024} MiB",
            host=conn.label,
            hint="free space there, or push --to another disk",
            code="no-space-left",
        )
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else None
