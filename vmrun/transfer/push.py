"""A push of local files or folders onto one host (`vmrun push`, `train --data`): checked
first (the folder can be made and written, the disk has room for what will change), then
vmrun's verified upload (vmrun.transfer.upload) of only what is new or changed.

Each PATH arrives as DEST/<its name>. A manifest of what a host holds (each file's path,
size and mtime, which the upload sets exactly) is what `doctor` compares across nodes.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.errors import RemoteError, UsageError
from vmrun.ssh.connection import Connection
from vmrun.transfer.manifest import PART_SUFFIX, Entry
from vmrun.transfer.types import Options, Progress, Report, env_tuning

if TYPE_CHECKING:
    from vmrun.reporting import Reporter
    from vmrun.transfer.records import Opened
    from vmrun.transfer.upload import Scan

CHECK = "push_check.sh"  # vmrun/hostside: the folder can be written, the disk has room


@dataclass(frozen=True)
class Planned:
    """One PATH on one host: where it lands, and what a push would send (by size and mtime:
    files in doubt are settled by checksum only when sending)."""

    local: Path | str  # a path here, or a bucket address (`push s3://...`)
    remote: str
    files: int
    nbytes: int
    to_send: int
    bytes_to_send: int
    extra: tuple[str, ...] = ()  # files on the host under a pushed folder, not here


@dataclass
class HostPush:
    host: str
    via: str = ""  # the host it came from over the private network ("": from here)
    planned: list[Planned] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    free_kib: int | None = None
    deleted: list[str] = field(default_factory=list)  # --delete: removed from the host
    began: float | None = None  # seconds into the push when this host's copy began
    ended: float | None = None  # and when it ended (where the time goes: push --json)


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


def push_host(
    conn: Connection,
    paths: Sequence[Path],
    dest: str,
    progress: Progress | None = None,
    *,
    dry_run: bool = False,
    engine: str = "auto",
    delete: bool = False,
    bwlimit: float | None = None,
) -> HostPush:
    """Every PATH onto the host under `dest` (normalised remote folder); `delete`: files
    under a pushed folder there that are not in it here go (only when every file arrived)."""
    from vmrun.transfer.manifest import list_remote
    from vmrun.transfer.streams import PARALLEL_BYTES, prefetch_link_facts
    from vmrun.transfer.upload import run_over, scan, upload

    done = HostPush(conn.label)
    remotes = [posixpath.join(dest, p.resolve().name) for p in paths]
    scans = [scan(p) for p in paths]
    if not dry_run and sum(f.size for s in scans for f in s.files) >= PARALLEL_BYTES:
        prefetch_link_facts(conn)  # for planning the big files' streams, while we list
    wanted, streams = env_tuning()
    engine = wanted if engine == "auto" else engine
    options = Options(engine=engine, bwlimit=bwlimit, streams=streams)
    # the folder's check (made, writable, its free space) beside the listing: one round trip;
    # a big file's streams start as soon as the listing says it travels, so that their
    # logins overlap the check's answer
    opened = None
    try:
        with ThreadPoolExecutor(1) as pool:
            checked = pool.submit(_check, conn, dest)
            listing = list_remote(
                conn,
                [
                    posixpath.dirname(r) if p.is_file() else r
                    for p, r in zip(paths, remotes, strict=True)
                ],
            )
            for path, remote, root, tree in zip(paths, remotes, listing.roots, scans, strict=True):
                entries = root.entries if root.state == "ok" else []
                done.planned.append(_plan(path, remote, entries, tree))
            if not dry_run:
                opened = _open_early(conn, done.planned, options)
            done.free_kib = checked.result()
        _room(conn, dest, done.free_kib, sum(p.bytes_to_send for p in done.planned))
        if dry_run:
            return done
        for path, remote, root, tree in zip(paths, remotes, listing.roots, scans, strict=True):
            mine = opened if opened is not None and opened.source == str(path) else None
            report = upload(
                conn,
                path,
                remote,
                options,
                progress or Progress(),
                listing=root,
                scanned=tree,
                opened=mine,
            )
            done.reports.append(report)
    finally:
        if opened is not None:
            opened.close()
    if delete:
        for plan, report in zip(done.planned, done.reports, strict=True):
            if plan.extra and report.ok:
                run_over(conn, "transfer_drop.sh", plan.remote, list(plan.extra))
                done.deleted += [f"{plan.remote}/{rel}" for rel in plan.extra]
    return done


def push_data(
    conn: Connection,
    data: Sequence[tuple[Path, str | None]],
    base: str,
    out: Reporter,
    progress: Progress | None = None,
) -> list[dict[str, object]]:
    """A run's `--data PATH[:DIR]`s onto the host (a cluster's login node: its shared
    filesystem) under `base`, the run's work directory: checked, only what changed,
    verified. Returns what run.json records of each: where it is and its manifest."""
    from vmrun.transfer.manifest import normalize_remote

    done_data = []
    for local, where in data:
        dest = (
            normalize_remote(where, base=base, where="the project's work directory")
            if where
            else base
        )
        done = push_host(conn, [local], dest, progress)
        report, planned = done.reports[0], done.planned[0]
        if not report.ok:
            raise RemoteError(
                f"--data {local}: {len(report.failed)} file(s) did not arrive intact",
                host=conn.label,
                code="transfer-failed",
            )
        if report.fetched:
            out.info(
                f"{conn.label}: pushed {len(report.fetched)} file(s) of {local.name},"
                f" {report.wire_bytes / 2**20:.1f} MiB ({report.seconds:.1f} s) to {planned.remote}"
            )
        done_data.append(
            {
                "local": str(local),
                "remote": planned.remote,
                "files": planned.files,
                "bytes": planned.nbytes,
                "manifest": manifest(conn, planned.remote),
            }
        )
    return done_data


def _open_early(conn: Connection, planned: Sequence[Planned], options: Options) -> Opened | None:
    """The streams for the first PATH with PARALLEL_BYTES or more to send, started now."""
    from vmrun.transfer.records import Opened
    from vmrun.transfer.streams import PARALLEL_BYTES, plan_streams
    from vmrun.transfer.upload import remote_folder

    big = next((p for p in planned if p.bytes_to_send >= PARALLEL_BYTES), None)
    if big is None:
        return None
    engine, count = plan_streams(
        conn, wanted=options.engine, nbytes=big.bytes_to_send, streams=options.streams
    )
    return Opened.start(engine, str(big.local), remote_folder(Path(big.local), big.remote), count)


def _plan(local: Path, remote: str, entries: Sequence[Entry], tree: Scan) -> Planned:
    """What would be sent, by size and mtime against the host's listing."""
    there = {e.rel: (e.size, e.mtime_ns) for e in entries if e.kind in ("f", "l") and e.rel}
    files = nbytes = to_send = bytes_to_send = 0
    extra: tuple[str, ...] = ()
    if local.is_dir():
        here = {i.rel for i in tree.files}.union(tree.others)
        extra = tuple(sorted(r for r in there if r not in here and not r.endswith(PART_SUFFIX)))
    for item in tree.files:
        files += 1
        nbytes += item.size
        key = posixpath.basename(remote) if local.is_file() else item.rel
        if there.get(key) != (item.size, item.mtime_ns):
            to_send += 1
            bytes_to_send += item.size
    return Planned(local, remote, files, nbytes, to_send, bytes_to_send, extra)


def _check(conn: Connection, dest: str) -> int | None:
    """The folder made and writable, and the transfer keys a killed push left removed (one
    round trip); its filesystem's free KiB (None: not known)."""
    from vmrun import hostside
    from vmrun.transfer.manifest import remote_arg
    from vmrun.transfer.relay import STALE_S, STATE

    result = conn.run(
        [*hostside.command(CHECK), remote_arg(dest), "0", STATE, str(STALE_S)],
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
    return int(words[1]) if len(words) > 1 and words[1].isdigit() else None


def _room(conn: Connection, dest: str, free_kib: int | None, needed: int) -> None:
    """Refused before a byte is sent when what must travel does not fit."""
    need_kib = (needed + 1023) // 1024
    if free_kib is not None and free_kib < need_kib:
        raise RemoteError(
            f"{dest} has {free_kib // 1024} MiB free, the push needs {need_kib // 1024} MiB",
            host=conn.label,
            hint="free space there, or push --to another disk",
            code="no-space-left",
        )


def manifest(conn: Connection, remote: str) -> str:
    """A digest of what the host holds under `remote`: every file's path, size and mtime
    ("" when there is nothing). Equal on two hosts: the same data, as a push leaves it."""
    from vmrun.transfer.manifest import list_remote

    root = list_remote(conn, [remote]).roots[0]
    if root.state != "ok":
        return ""
    lines = sorted(
        f"{e.rel}\0{e.size}\0{e.mtime_ns}"
        for e in root.entries
        if e.kind == "f" and not e.rel.endswith(PART_SUFFIX)  # a cut push's leftovers
    )
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()[:16]
