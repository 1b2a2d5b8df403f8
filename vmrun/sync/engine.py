"""The vmrun sync engine: what differs by one listing, files by `vmrun.transfer.upload`,
symlinks by one host-side script; all on the open connection (nothing but SSH on the host).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun import hostside
from vmrun.errors import RemoteError
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.sync.plan import Plan, SyncReport, warn
from vmrun.transfer.manifest import RootListing, list_remote, remote_arg
from vmrun.transfer.streams import capture
from vmrun.transfer.types import Options, Progress


def make_links(conn: Connection, workdir: str, links: Sequence[tuple[str, str]]) -> int:
    """Create the symlinks that are not there yet, in one round trip; how many were made."""
    if not links:
        return 0
    data = b"".join(
        os.fsencode(target) + b"\0" + os.fsencode(remote_arg(rel)) + b"\0" for rel, target in links
    )
    argv = hostside.command("sync_links.sh", hostside.path("sync_links.sh"), remote_arg(workdir))
    status, out, err = capture(conn, quoting.plain_command(argv), stdin=data, what="symlinks")
    if status != 0:
        raise RemoteError(f"creating symlinks on the host failed: {err.strip()}", host=conn.label)
    return out.count(b"L\n")


def vmrun_send(
    conn: Connection,
    project: Path,
    workdir: str,
    files: Sequence[str],
    links: Sequence[tuple[str, str]],
    progress: Progress,
    report: SyncReport,
    listing: RootListing | None = None,
) -> None:
    """Send `files` and `links`; `listing`, the work directory's listed just now by
    `changed`, spares upload a second listing round trip."""
    from vmrun.transfer.upload import upload

    if files:
        up = upload(conn, project, workdir, Options(), progress, files=files, listing=listing)
        if up.failed:
            rel, why = next(iter(up.failed.items()))
            raise RemoteError(
                f"{len(up.failed)} file(s) failed verification on the host ({rel}: {why})",
                host=conn.label,
                hint="run the sync again",
                code="transfer-failed",
            )
        report.sent += len(up.fetched)
        report.sent_bytes += up.fetched_bytes
        report.unchanged += up.unchanged
        warn(report, progress, up.skipped + up.warnings)
    made = make_links(conn, workdir, links)
    report.sent += made
    report.unchanged += len(links) - made


@dataclass
class Difference:
    """What `changed` found: the part of the plan to send, how many entries are the same,
    the size of the biggest changed file the host has another version of (what rsync's
    delta transfer would save), and the listing itself (for upload to reuse)."""

    todo: Plan
    same: int
    biggest_old: int
    listing: RootListing


def changed(conn: Connection, workdir: str, plan: Plan) -> Difference:
    """One listing round trip: the part of `plan` that differs on the host (size or mtime of a
    file, target of a symlink)."""
    root = list_remote(conn, [workdir]).roots[0]
    there = {e.rel: e for e in root.entries}
    todo, same, biggest_old = Plan(), 0, 0
    for rel in plan.regular:
        entry = there.get(rel)
        size, mtime = plan.sizes[rel], plan.mtimes[rel]
        if entry is not None and entry.kind == "f":
            if entry.size == size and entry.mtime_ns == mtime:
                same += 1
                continue
            biggest_old = max(biggest_old, min(size, entry.size))
        todo.regular.append(rel)
        todo.sizes[rel], todo.mtimes[rel] = size, mtime
    for rel, target in plan.links:
        entry = there.get(rel)
        if entry is not None and entry.kind == "l" and entry.link == target:
            same += 1
        else:
            todo.links.append((rel, target))
    return Difference(todo, same, biggest_old, root)
