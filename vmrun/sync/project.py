"""The project directory goes to a per-project work directory on each host, incrementally.

What goes: `vmrun.sync.files.project_files` (git's view, .gitignore, the defaults and
`.vmrunignore`). Where: `remote_workdir`, stable per local project. How: `sync_project`
(this module), with one of two engines:

- "rsync" (vmrun.sync.rsync): `rsync -a --files-from=-` over OpenSSH with vmrun's exact
  connection settings, when both ends have rsync. Its delta transfer sends only the changed
  blocks of a changed big file.
- "vmrun" (vmrun.sync.engine): `vmrun.transfer.upload` on the open connection: one listing,
  size+mtime compare, one tar stream, SHA-256 on both ends, atomic renames. Needs nothing
  on the host but a POSIX shell, GNU find and tar.

Both compare size and mtime to the nanosecond (rsync gets `--modify-window=-1`; its default
compares whole seconds and misses a same-size edit within a second), both set mtimes, and
neither deletes a remote file that is not in the list: what a run wrote into the work
directory (results/, checkpoints) survives every sync.

`auto` is chosen by measurement (benchmarks/sync.py: NetnsBed host, 2 CPUs shared by both
ends, medians of 5 rounds; seconds, and x plain `rsync -a -e ssh`; vmrun rows include
project_files and reuse the open connection, as `vmrun train` does):

                             2,000 x 10 KiB tree           one 200 MiB file
                             first   same    one edit      first   same    1 MiB edited
    rsync -a -e ssh by hand  1.83 s  0.27 s  0.27 s        1.08 s  0.25 s  0.76 s
    rsync engine             1.05x   1.25x   1.30x         0.81x   1.07x   0.94x
    vmrun engine             1.15x   0.26x   0.35x         0.99x   0.07x   2.01x
    auto                     1.04x   0.21x   0.43x         0.94x   0.08x   1.24x

rsync pays a second SSH handshake and a process pair every time (~0.25 s here), even when
nothing changed; the vmrun engine answers "nothing changed" with one listing on the open
connection (0.21x rsync; 0.46x with a fresh connection), and sends a few changed files
faster too (probes: 1,000 new small files 0.40 s vs 0.68 s). rsync wins a first sync of
thousands of files (pipelined file list, no per-file hashing and renaming) and an edit of a
big file (delta transfer; the two are even at 32-64 MiB). So `auto` is a hybrid: the vmrun
engine's listing decides what differs; nothing -> done; then rsync sends the difference when
both ends have rsync and it is at least RSYNC_FILES files, RSYNC_BYTES bytes, or holds a
file of RSYNC_DELTA bytes that the host has another version of; else the vmrun engine does.
`VMRUN_SYNC_ENGINE=rsync|vmrun` forces one engine for the whole sync. A host reached
through a jump host in a command on several hosts never gets rsync from `auto`: its ssh
would log in to the jump host again, once per host (see vmrun.transfer.streams).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.sync.engine import changed, vmrun_send
from vmrun.sync.files import project_files
from vmrun.sync.plan import SyncReport, classify, warn
from vmrun.sync.rsync import HostRsync, Rsync, parse_version, rsync_command, rsync_send
from vmrun.transfer.manifest import normalize_remote, remote_arg
from vmrun.transfer.streams import capture, shares_a_jump
from vmrun.transfer.types import BIG_TRANSFER, Progress

# auto sends changes with rsync from here on (benchmarks/sync.py; module docstring)
RSYNC_FILES = 1000  # changed files: rsync's pipelined file list beats per-file tar+hash+rename
RSYNC_BYTES = BIG_TRANSFER  # bytes: vmrun would start an `ssh` too, and hash everything twice
RSYNC_DELTA = 64 << 20  # one file this big that the host has another version of: delta transfer
ENGINES = ("auto", "rsync", "vmrun")


def _prepare(conn: Connection, workdir: str) -> HostRsync | None:
    """One round trip: create the work dir, and learn whether (and which) rsync is there."""
    argv = [*hostside.command("sync_prepare.sh"), remote_arg(workdir)]
    status, out, err = capture(conn, quoting.plain_command(argv), what="preparing the workdir")
    if status != 0:
        raise RemoteError(
            f"cannot create the work directory {workdir}: {err.strip() or f'exit {status}'}",
            host=conn.label,
            hint="check free space and permissions in the home directory on the host",
        )
    lines = os.fsdecode(out).splitlines()
    if len(lines) < 2:
        return None
    version = parse_version(lines[1])
    return HostRsync(lines[0], version) if version else None


def _wanted(engine: str) -> str:
    if engine == "auto":
        engine = os.environ.get("VMRUN_SYNC_ENGINE", "").strip().lower() or "auto"
    if engine not in ENGINES:
        raise UsageError(
            f"unknown sync engine {engine!r}", hint="VMRUN_SYNC_ENGINE is rsync or vmrun"
        )
    return engine


def sync_project(
    conn: Connection,
    project: Path,
    workdir: str,
    *,
    files: list[str] | None = None,
    engine: str = "auto",
    progress: Progress | None = None,
) -> SyncReport:
    """Make workdir on the host hold the project's files (never deletes remote files that
    are not in the list: outputs a previous run wrote there must survive).

    `engine`: "auto" (see the module docstring), "rsync" or "vmrun"; with "auto",
    VMRUN_SYNC_ENGINE decides when set.
    """
    started = time.monotonic()
    progress = progress or Progress()
    project = Path(os.path.abspath(project))
    workdir = normalize_remote(workdir)  # `~/x` is `x`; `../x` is refused
    wanted = _wanted(engine)
    if files is None:
        files = project_files(project)
    plan = classify(project, files)
    report = SyncReport(host=conn.label, files=len(files))
    warn(report, progress, plan.warnings)
    host_rsync = _prepare(conn, workdir)
    rsync: Rsync | str = "not wanted"
    if wanted == "auto" and shares_a_jump(conn):
        rsync = "its jump host is shared with other hosts (one login there)"
    elif wanted != "vmrun":
        rsync = rsync_command(conn, workdir, host_rsync)
        if wanted == "rsync" and isinstance(rsync, str):
            raise UsageError(
                f"the rsync engine was asked for, but {rsync}",
                host=conn.label,
                hint="VMRUN_SYNC_ENGINE=vmrun needs nothing but SSH",
            )
    if wanted == "rsync":
        assert isinstance(rsync, Rsync)
        report.engine = "rsync"
        everything = sorted([*plan.regular, *(rel for rel, _ in plan.links)])
        progress.begin(conn.label, len(everything), sum(plan.sizes.values()))
        rsync_send(conn, project, workdir, rsync, everything, progress, report)
    elif wanted == "vmrun":
        report.engine = "vmrun"
        vmrun_send(conn, project, workdir, plan.regular, plan.links, progress, report)
    else:
        diff = changed(conn, workdir, plan)
        todo = diff.todo
        report.unchanged += diff.same
        nbytes = sum(todo.sizes.values())
        if isinstance(rsync, Rsync) and (
            len(todo.regular) >= RSYNC_FILES
            or nbytes >= RSYNC_BYTES
            or diff.biggest_old >= RSYNC_DELTA
        ):
            report.engine = "rsync"
            entries = sorted([*todo.regular, *(rel for rel, _ in todo.links)])
            progress.begin(conn.label, len(entries), nbytes)
            rsync_send(conn, project, workdir, rsync, entries, progress, report)
        else:
            report.engine = "vmrun"
            vmrun_send(
                conn, project, workdir, todo.regular, todo.links, progress, report, diff.listing
            )
    report.seconds = time.monotonic() - started
    return report
