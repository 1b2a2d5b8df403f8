"""Uploads with the download engine's guarantees: incremental, verified, atomic.

A local file or tree goes to a remote path: one walk here (or the caller's), one listing
round trip; files with the same size and mtime there are left alone (checksums settle the
ones in doubt); the rest travel as records (vmrun.transfer.records): each file hashed here
while read and on the host while written under a temporary name beside its final one, and
renamed into place there as soon as the two SHA-256 agree, with its mode and nanosecond
mtime (so the next comparison is exact). A far host gets several streams, big files in
ranges. A mismatch is sent once more, then reported. What a cut upload left is used: a
whole temporary copy is placed after the host hashes it, one cut in its middle continues.
A host without python3 gets one tar stream, then a checksum and a renaming round trip.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import stat
import tarfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.transfer.manifest import (
    PART_SUFFIX,
    Entry,
    RootListing,
    join_remote,
    list_remote,
    part_name,
    remote_arg,
    remote_hashes,
)
from vmrun.transfer.records import INLINE, Opened, Outgoing, place_whole, send_lanes
from vmrun.transfer.streams import CHUNK, Engine, capture, plan_streams
from vmrun.transfer.types import FetchSpec, Options, Progress, Report, selected


@dataclass
class Scan:
    """A local file or tree as one walk saw it (os.scandir: one lstat per file)."""

    files: list[Outgoing]  # regular files, folders' in walk order (each folder's names sorted)
    others: list[str]  # folders and symlinks, relative (what push --delete keeps there)
    skipped: list[str]  # symlinks not followed, files that vanished


def scan(local: Path) -> Scan:
    st = os.stat(local)
    if stat.S_ISREG(st.st_mode):
        return Scan([Outgoing(local.name, local, st.st_size, st.st_mtime_ns, st.st_mode)], [], [])
    found = Scan([], [], [])
    stack = [("", os.fspath(local))]
    while stack:
        prefix, folder = stack.pop()
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        below = []
        for entry in entries:
            rel = prefix + entry.name
            try:
                lst = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                found.skipped.append(f"{rel}: vanished before it could be sent")
                continue
            if stat.S_ISREG(lst.st_mode):
                item = Outgoing(rel, entry.path, lst.st_size, lst.st_mtime_ns, lst.st_mode)
                found.files.append(item)
                continue
            found.others.append(rel)
            if stat.S_ISDIR(lst.st_mode):
                below.append((rel + "/", entry.path))
            elif stat.S_ISLNK(lst.st_mode):
                found.skipped.append(f"{rel}: a symlink, not followed")
        stack.extend(reversed(below))
    return found


def _scan(
    local: Path,
    spec: FetchSpec,
    report: Report,
    files: Sequence[str] | None = None,
    scanned: Scan | None = None,
) -> list[Outgoing]:
    """The files to consider: `scanned` (the caller's walk), or `files` (the caller's list:
    no walk, vmrun.sync.project), or one walk here."""
    if files is None:
        tree = scanned if scanned is not None else scan(local)
        report.skipped += [s for s in tree.skipped if selected(s.split(": ", 1)[0], spec)]
        return [i for i in tree.files if not i.rel.endswith(PART_SUFFIX) and selected(i.rel, spec)]
    found: list[Outgoing] = []
    for rel in files:
        path = local / rel
        if path.name.endswith(PART_SUFFIX) or not selected(rel, spec):
            continue
        try:
            lst = os.lstat(path)
        except FileNotFoundError:
            report.skipped.append(f"{rel}: vanished before it could be sent")
            continue
        if stat.S_ISLNK(lst.st_mode):
            report.skipped.append(f"{rel}: a symlink, not followed")
            continue
        if stat.S_ISREG(lst.st_mode):
            found.append(Outgoing(rel, path, lst.st_size, lst.st_mtime_ns, lst.st_mode))
    return found


def _send_tar(
    conn: Connection,
    engine: Engine,
    remote_dir: str,
    items: list[Outgoing],
    progress: Progress,
    report: Report,
) -> None:
    """The path for a host without python3: one tar stream, then a checksum round trip and
    a renaming one (_check_tar)."""
    receive = [*hostside.command("transfer_receive.sh"), remote_dir]
    stream = engine.open(quoting.plain_command(receive))

    def drain_output() -> None:
        with contextlib.suppress(Exception):
            while stream.read(65536):
                pass

    reader = threading.Thread(target=drain_output, daemon=True)
    reader.start()
    try:
        for item in items:
            info = tarfile.TarInfo(item.temp)
            info.size = item.size
            info.mode = item.mode & 0o777
            info.mtime = item.mtime_ns // 1_000_000_000
            info.pax_headers = {"mtime": f"{item.mtime_ns // 10**9}.{item.mtime_ns % 10**9:09d}"}
            stream.send(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            progress.file_begin(conn.label, item.rel, item.size, 0)
            digest, shrank = hashlib.sha256(), False
            with open(item.path, "rb", buffering=0) as fh:
                while item.sent < item.size:
                    data = fh.read(min(CHUNK, item.size - item.sent))
                    if not data:  # shrank while being sent: pad the member, fail the check
                        data, shrank = b"\0" * min(CHUNK, item.size - item.sent), True
                    digest.update(data)
                    stream.send(data)
                    item.sent += len(data)
                    report.wire_bytes += len(data)
                    progress.advance(conn.label, len(data))
            item.digest = None if shrank else digest.hexdigest()
            stream.send(b"\0" * (-item.size % 512))
        stream.send(b"\0" * 1024)
    except OSError as exc:
        stream.kill()
        reader.join(timeout=10)
        status, err = stream.finish()
        if status == 255 or isinstance(exc, BrokenPipeError):
            raise RemoteError(
                f"the upload stream broke: {err.strip() or exc}",
                host=conn.label,
                code="transfer-failed",
            ) from None
        raise
    stream.close_input()
    reader.join()
    status, err = stream.finish()
    if status != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit status {status}"
        raise RemoteError(
            f"unpacking on the host failed: {last}",
            host=conn.label,
            hint="check free space and permissions of the destination",
            code="transfer-failed",
        )


def upload(
    conn: Connection,
    local: Path,
    remote: str,
    options: Options | None = None,
    progress: Progress | None = None,
    *,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    files: Sequence[str] | None = None,
    listing: RootListing | None = None,
    scanned: Scan | None = None,
    opened: Opened | None = None,
) -> Report:
    """Make `remote` (normalised remote path) hold what `local` (file or folder) holds;
    `files` (POSIX paths relative to a folder `local`) replaces the walk with a list;
    `listing`, the remote folder's as the caller listed it just now, saves a round trip;
    `scanned`, the caller's walk of `local` (scan), saves walking it again; `opened`,
    streams the caller started for it (the caller closes what is left of them)."""
    options = options or Options()
    progress = progress or Progress()
    started = time.monotonic()
    report = Report(host=conn.label)
    if not local.exists():
        raise UsageError(f"{local} does not exist")
    single = local.is_file()
    remote_dir = remote_folder(local, remote)
    spec = FetchSpec(remote, "", include=include, exclude=exclude)
    items = _scan(local, spec, report, files, scanned)
    if single:
        items[0].rel = posixpath.basename(remote)
    root = listing if listing is not None else list_remote(conn, [remote_dir]).roots[0]
    if root.state == "ok" and any(e.rel == "" and e.kind != "d" for e in root.entries):
        raise UsageError(f"{remote_dir} on the host is not a directory", host=conn.label)
    todo = _changed(conn, remote_dir, items, root, options, report)
    todo = _adopt_arrived(conn, remote_dir, todo, root, progress, report)
    _send_verified(conn, remote_dir, todo, options, progress, report, opened)
    report.seconds = time.monotonic() - started
    return report


def _changed(
    conn: Connection,
    remote_dir: str,
    items: list[Outgoing],
    root: RootListing,
    options: Options,
    report: Report,
) -> list[Outgoing]:
    """The files the host lacks or holds otherwise: a differing size says so at once, the
    same size and mtime say it holds them (unless `options.verify`), checksums settle the rest."""
    there: dict[str, Entry] = {e.rel: e for e in root.entries if e.kind == "f"}
    todo, check = [], []
    for item in items:
        entry = there.get(item.rel)
        if entry is None or entry.size != item.size:
            todo.append(item)
        elif entry.mtime_ns == item.mtime_ns and not options.verify:
            report.unchanged += 1
        else:
            check.append(item)
    if check:
        from vmrun.transfer.hashing import file_sha256

        theirs = remote_hashes(conn, [join_remote(remote_dir, i.rel) for i in check])
        for item in check:
            report.checked += 1
            if theirs.get(join_remote(remote_dir, item.rel)) == file_sha256(item.path):
                report.unchanged += 1
            else:
                todo.append(item)
    return todo


def _adopt_arrived(
    conn: Connection,
    remote_dir: str,
    todo: list[Outgoing],
    root: RootListing,
    progress: Progress,
    report: Report,
) -> list[Outgoing]:
    """What an upload cut short left on the host: a temporary copy of this very version (its
    name carries size and mtime) with every byte there is placed if its SHA-256 is this
    file's, and not sent again; one cut in its middle is continued from where it stopped
    (`resume`); the rest are still to send."""
    sizes = {e.rel: e.size for e in root.entries if e.kind == "f"}
    whole = []
    for item in todo:
        folder, name = posixpath.split(item.rel)
        part = posixpath.join(folder, part_name(name, item.size, item.mtime_ns))
        there = sizes.get(part, 0)
        if there == item.size:
            item.temp = part
            whole.append(item)
        elif 0 < there < item.size and item.size > INLINE:  # cut in its middle: continued
            item.resume = there
    if not whole:
        return todo
    from vmrun.transfer.hashing import many_sha256

    ours = many_sha256(Path(i.path) for i in whole)
    for item in whole:
        item.digest = ours.get(Path(item.path))
    if place_whole(conn, remote_dir, whole):  # the host hashed and placed them in one go
        good = [i for i in whole if not i.why]
        for item in whole:
            item.why = ""
    else:  # no python3 there
        sums = remote_hashes(conn, [join_remote(remote_dir, i.temp) for i in whole])
        good = [i for i in whole if sums.get(join_remote(remote_dir, i.temp)) == i.digest]
        pairs = [p for i in good for p in (i.temp, i.rel)]
        run_over(conn, "transfer_place.sh", remote_dir, pairs, hostside.path("transfer_place.py"))
    for item in good:
        report.fetched.append(item.rel)
        report.fetched_bytes += item.size
        report.resumed += 1
        progress.file_end(conn.label, item.rel, True)
    placed = {id(i) for i in good}  # by identity: comparing dataclasses is O(n) each
    return [i for i in todo if id(i) not in placed]


def _send_verified(
    conn: Connection,
    remote_dir: str,
    todo: list[Outgoing],
    options: Options,
    progress: Progress,
    report: Report,
    opened: Opened | None = None,
) -> None:
    """Send, and place each file whose SHA-256 on the host is the one read here; a file that
    fails is sent once more, then reported as failed. Records (vmrun.transfer.records) where
    the host has python3, else a tar stream. `opened`: streams started for it already."""
    if not todo:
        return
    nbytes = sum(i.size - i.resume for i in todo)
    engine, streams = _streams_for(conn, nbytes, options, opened)
    report.engine, report.streams = engine.name, streams
    progress.begin(conn.label, len(todo), nbytes)
    for item in todo:
        folder, name = posixpath.split(item.rel)
        item.temp = posixpath.join(folder, part_name(name, item.size, item.mtime_ns))
    records = True
    for attempt in (1, 2):
        if not todo:
            break
        if records:
            records = send_lanes(
                conn, engine, remote_dir, todo, streams, options.bwlimit, progress, report, opened
            )
        if not records:
            for item in todo:
                item.resume = 0  # the tar stream sends whole files
            _send_tar(conn, engine, remote_dir, todo, progress, report)
            _check_tar(conn, remote_dir, todo)
        for item in todo:
            if not item.why:
                report.fetched.append(item.rel)
                report.fetched_bytes += item.size
                report.resumed += bool(item.resume)
                progress.file_end(conn.label, item.rel, True)
            elif attempt == 2:
                report.failed[item.rel] = item.why
        bad = [i for i in todo if i.why]
        for item in bad:  # once more, whole
            item.why, item.sent, item.resume = "", 0, 0
        todo = bad


def _streams_for(
    conn: Connection, nbytes: int, options: Options, opened: Opened | None
) -> tuple[Engine, int]:
    """The engine and stream count: those of the streams the caller started, else planned."""
    if opened is not None:
        return opened.engine, opened.count
    return plan_streams(conn, wanted=options.engine, nbytes=nbytes, streams=options.streams)


def remote_folder(local: Path, remote: str) -> str:
    """The folder an upload of `local` (a file or a folder) to `remote` writes into."""
    return (posixpath.dirname(remote) or ".") if local.is_file() else remote


def _check_tar(conn: Connection, remote_dir: str, todo: list[Outgoing]) -> None:
    """After a tar stream: the host's SHA-256 of each temporary copy, then the good ones
    renamed into place and the others removed."""
    sums = remote_hashes(conn, [join_remote(remote_dir, i.temp) for i in todo])
    for item in todo:
        if sums.get(join_remote(remote_dir, item.temp)) != item.digest:
            item.why = "SHA-256 on the host differs from the one sent"
    pairs = [p for i in todo if not i.why for p in (i.temp, i.rel)]
    run_over(conn, "transfer_place.sh", remote_dir, pairs, hostside.path("transfer_place.py"))
    run_over(conn, "transfer_drop.sh", remote_dir, [i.temp for i in todo if i.why])


def run_over(conn: Connection, script: str, remote_dir: str, words: list[str], *extra: str) -> None:
    """Run the host-side `script` in `remote_dir` over `words` (NUL-separated on stdin)."""
    if not words:
        return
    data = b"".join(os.fsencode(remote_arg(w)) + b"\0" for w in words)
    argv = hostside.command(script, remote_dir, *extra)
    status, _out, err = capture(conn, quoting.plain_command(argv), stdin=data, what="renaming")
    if status != 0:
        raise RemoteError(
            f"placing files on the host failed: {err.strip()}",
            host=conn.label,
            code="transfer-failed",
        )
