"""Fast, verified, incremental, atomic downloads of files and trees (uploads: transfer_upload).

How one host's fetch goes:

1. One round trip lists every requested root (vmrun.transfer.manifest): size, mtime, mode, type.
2. Each file is compared with the local copy: same size and mtime -> unchanged, nothing
   moves; same size, other mtime -> "in doubt", settled by SHA-256 on both sides in one more
   round trip (`verify=True` does this for every unchanged file too).
3. What is left is streamed in ONE connection by `tar` on the host (OpenSSH's client, or a
   paramiko channel: vmrun.transfer.streams), each file into a temporary name beside its final one
   that carries the remote file's identity: `.NAME.<size>-<mtime>.vmrun-part`. A file whose
   temporary copy survived an earlier, interrupted run continues from where it stopped
   (`tail -c +N`); a fetch stopped from elsewhere (`Options.cancel`) kills its streams at
   once, leaving exactly such copies. Meanwhile the host computes the SHA-256 of the same
   files, and each file is hashed here as it arrives.
4. Only a file whose two checksums match is given its mode and mtime and renamed over the
   final name; a mismatch is fetched once more from scratch, then reported. An interrupted
   fetch therefore never leaves a partial file under a final name.

Symlinks on the host are recreated when they point inside the fetched directory (resolved
through its other links, as the OS would) and skipped (never followed) when they point
outside it. Nothing here prints: progress goes to a `Progress` object, results to a `Report`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun.errors import VmrunError
from vmrun.ssh.connection import Connection
from vmrun.transfer.hashing import file_sha256, many_sha256
from vmrun.transfer.manifest import (
    PART_SUFFIX,
    RootListing,
    join_remote,
    links_inside,
    list_remote,
    part_name,
    part_owner,
    remote_hashes,
    safe_rel,
)
from vmrun.transfer.receive import Item, NoPython, Receiver
from vmrun.transfer.streams import PARALLEL_BYTES, plan_streams
from vmrun.transfer.types import FetchSpec, Options, Progress, Report, selected


def _umask() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


_UMASK = _umask()


# -- planning --------------------------------------------------------------------------


@dataclass(frozen=True)
class Listed:
    """One file (or symlink) a download would bring: where it is on the host, its size
    (-1: a symlink, to `link`)."""

    remote: str
    size: int
    link: str = ""
    mtime_ns: int = 0  # when it was last written, by the host's clock


def _plan(
    listing_roots: Sequence[tuple[FetchSpec, RootListing]],
    remote_now: int,
    dest: Path,
    options: Options,
    report: Report,
) -> tuple[list[Item], list[tuple[str, Path, str]]]:
    files: list[Item] = []
    links: list[tuple[str, Path, str]] = []
    seen: set[Path] = set()
    for spec, root in listing_roots:
        for item in _choose(spec, root, dest, report, links):
            if options.settle and remote_now * 1e9 - item.entry.mtime_ns < options.settle * 1e9:
                report.settling += 1
                continue
            if item.local not in seen:
                seen.add(item.local)
                files.append(item)
    return files, links


def _choose(
    spec: FetchSpec,
    root: RootListing,
    dest: Path,
    report: Report,
    links: list[tuple[str, Path, str]],
) -> list[Item]:
    """The files of one listed root that `spec` selects (its `latest` newest, if it says);
    the symlinks that stay inside the root go to `links`, to be made after the files."""
    name = spec.label or root.root
    top = next((e for e in root.entries if e.rel == ""), None)
    if root.state in ("missing", "dangling") or top is None:
        report.missing.append(name)
        return []
    entries = [top] if top.kind == "f" else root.entries
    base = dest / spec.local if spec.local else dest
    inside = links_inside({e.rel: e.link for e in entries if e.kind == "l" and safe_rel(e.rel)})
    chosen: list[Item] = []
    for entry in entries:
        rel = entry.rel
        match_path = rel or posixpath.basename(root.root)
        if not safe_rel(rel):
            report.skipped.append(f"{name}/{rel}: unsafe name from the host")
            continue
        if entry.kind == "d" or posixpath.basename(match_path).endswith(PART_SUFFIX):
            continue
        if not selected(match_path, spec):
            continue
        local = base / rel if rel else base
        shown = os.path.relpath(local, dest)
        if entry.kind == "l" and rel in inside:
            links.append((entry.link, local, shown))
        elif entry.kind == "l":
            report.skipped.append(
                f"{shown}: symlink to {entry.link!r} outside the directory, not followed"
            )
        elif entry.kind == "f" and entry.mtime_ns >= spec.newer_than_ns:
            remote = join_remote(root.root, rel)
            chosen.append(Item(remote=remote, local=local, entry=entry, display=shown))
    if spec.latest is not None:
        chosen.sort(key=lambda it: it.entry.mtime_ns, reverse=True)
        chosen = chosen[: spec.latest]
    return chosen


def _local_state(item: Item, options: Options) -> str:
    """ "unchanged", "check" (compare checksums) or "send"."""
    try:
        st = os.lstat(item.local)
    except FileNotFoundError:
        return "send"
    except NotADirectoryError:
        item.why = "a file is in the way of its directory here"
        return "fail"
    if stat.S_ISDIR(st.st_mode):
        item.why = "a directory with that name is in the way here"
        return "fail"
    if not stat.S_ISREG(st.st_mode) or st.st_size != item.entry.size:
        return "send"
    if st.st_mtime_ns == item.entry.mtime_ns and not options.verify:
        return "unchanged"
    return "check"


def _place_links(links: list[tuple[str, Path, str]], report: Report) -> None:
    for target, local, shown in links:
        try:
            if os.path.islink(local) and os.readlink(local) == target:
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            tmp = local.parent / part_name(local.name, 0, 0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(target, tmp)
            os.replace(tmp, local)
            report.links += 1
        except OSError as exc:
            report.failed[shown] = f"cannot create the symlink here: {exc.strerror}"


# -- checksums of files that look unchanged --------------------------------------------


class _RemoteHashes(threading.Thread):
    """The host's SHA-256 of these files, computed while this side does its own work (hashing
    its copies, or receiving the bytes)."""

    def __init__(self, conn: Connection, remotes: list[str]):
        super().__init__(daemon=True, name="vmrun-remote-hash")
        self.conn, self.remotes = conn, remotes
        self.hashes: dict[str, str] = {}
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.hashes = remote_hashes(self.conn, self.remotes)
        except BaseException as exc:  # raised by result(), in the caller's thread
            self.error = exc

    def result(self) -> dict[str, str]:
        self.join()
        if self.error is not None:
            raise self.error
        return self.hashes


def _settle_by_checksum(
    conn: Connection, items: list[Item], options: Options, report: Report
) -> list[Item]:
    """Compare both sides' SHA-256; return the items whose bytes differ (to be sent)."""
    remote = _RemoteHashes(conn, [it.remote for it in items])
    local = many_sha256(it.local for it in items)
    hashes = remote.result()
    differ = []
    for it in items:
        theirs, ours = hashes.get(it.remote), local.get(it.local)
        if theirs is None:
            report.warnings.append(f"{it.display}: vanished from the host while checking")
            continue
        report.checked += 1
        if theirs == ours:
            report.unchanged += 1
            with contextlib.suppress(OSError):
                st = os.stat(it.local)
                if st.st_mtime_ns != it.entry.mtime_ns:
                    os.utime(it.local, ns=(st.st_atime_ns, it.entry.mtime_ns))
            continue
        if options.verify:
            with contextlib.suppress(OSError):
                if os.stat(it.local).st_mtime_ns == it.entry.mtime_ns:
                    report.replaced += 1
        differ.append(it)
    return differ


def _prepare_parts(items: list[Item], fresh: bool, report: Report) -> list[Item]:
    """Pick each item's temporary name; keep a partial copy of the same version to resume
    from, remove stale ones (of older versions). Returns the items that can be received."""
    listings: dict[Path, list[str]] = {}
    ready = []
    for it in items:
        folder = it.local.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if folder not in listings:
                listings[folder] = [n for n in os.listdir(folder) if n.endswith(PART_SUFFIX)]
        except OSError as exc:
            report.failed[it.display] = f"cannot create its folder here: {exc.strerror}"
            continue
        it.part = folder / part_name(it.local.name, it.entry.size, it.entry.mtime_ns)
        mine = part_owner(it.part.name)
        it.offset = 0
        for other in listings[folder]:
            owner = part_owner(other)
            if owner is None or mine is None or owner[0] != mine[0]:
                continue
            if other == it.part.name and not fresh:
                with contextlib.suppress(OSError):
                    st = os.lstat(it.part)
                    if stat.S_ISREG(st.st_mode) and st.st_size <= it.entry.size:
                        it.offset = st.st_size
                        continue
            with contextlib.suppress(OSError):
                os.unlink(folder / other)
        ready.append(it)
    return ready


def _finalize(it: Item) -> None:
    assert it.part is not None
    mode = (0o666 | (it.entry.mode & 0o111)) & ~_UMASK
    os.chmod(it.part, mode)
    os.utime(it.part, ns=(it.entry.mtime_ns, it.entry.mtime_ns))
    os.replace(it.part, it.local)


def _transfer(
    conn: Connection,
    items: list[Item],
    options: Options,
    progress: Progress,
    report: Report,
    *,
    fresh: bool = False,
) -> list[Item]:
    """Fetch, verify and place `items`; return the ones that failed verification."""
    # Small files first, in the stream and in the host's checksum run alike: they are created
    # before gigabytes of big files are dirty in the page cache (ext4 then makes each create
    # wait for writeback), and the host hashes each big file while it is being sent.
    items = sorted(_prepare_parts(items, fresh, report), key=lambda it: it.entry.size)
    if not items:
        return []
    remaining = sum(it.entry.size - it.offset for it in items)
    engine, streams = plan_streams(
        conn, wanted=options.engine, nbytes=remaining, streams=options.streams
    )
    report.engine, report.streams = engine.name, streams
    progress.begin(conn.label, len(items), remaining)
    hasher = _RemoteHashes(conn, [it.remote for it in items])
    cancel = options.cancel
    receiver = Receiver(conn.label, engine, options.bwlimit, progress, report, cancel)
    try:
        whole = [it for it in items if it.offset == 0]
        big = [it for it in whole if streams > 1 and it.entry.size >= PARALLEL_BYTES]
        if big:
            try:
                receiver.ranges(big, streams)
                ranged = {id(it) for it in big}
                whole = [it for it in whole if id(it) not in ranged]
            except NoPython:
                pass
        if whole:
            receiver.tar(whole)
        for it in items:
            if 0 < it.offset < it.entry.size:
                receiver.tail(it)
            elif it.offset and it.offset == it.entry.size:
                it.received = it.offset
                it.digest = file_sha256(it.part)  # type: ignore[arg-type]
    except BaseException:
        if cancel is not None:
            cancel.check()  # stopped from elsewhere: that, not the broken stream, is the news
        raise
    finally:
        hasher.join(0 if cancel is not None and cancel.event.is_set() else None)
    if cancel is not None:
        cancel.check()
    hashes = hasher.result()
    return [it for it in items if not _place(conn.label, it, hashes, progress, report)]


def _place(host: str, it: Item, hashes: dict[str, str], progress: Progress, report: Report) -> bool:
    """Put a received file in its place if its hash is the host's; False: it failed."""
    if not it.arrived_as(hashes.get(it.remote)):
        return False
    try:
        _finalize(it)
    except OSError as exc:
        it.why = f"cannot place the file: {exc.strerror}"
        return False
    report.fetched.append(it.display)
    report.fetched_bytes += it.entry.size
    report.resumed += bool(it.offset)
    progress.file_end(host, it.display, True)
    return True


def _relist(conn: Connection, items: list[Item], report: Report) -> list[Item]:
    listing = list_remote(conn, [it.remote for it in items])
    again = []
    for it, root in zip(items, listing.roots, strict=True):
        top = next((e for e in root.entries if e.rel == ""), None)
        if root.state != "ok" or top is None or top.kind != "f":
            report.failed[it.display] = "vanished from the host"
            continue
        again.append(Item(remote=it.remote, local=it.local, entry=top, display=it.display))
    return again


# -- the entry point -------------------------------------------------------------------


def listed(
    conn: Connection, specs: Sequence[FetchSpec], dest: Path, options: Options | None = None
) -> dict[str, Listed]:
    """What a download of `specs` would bring from the host, by local path (relative to
    `dest`), nothing moved: one listing round trip (none for no specs)."""
    if not specs:
        return {}
    items, links = _listing_plan(conn, specs, dest, options or Options(), Report(conn.label))
    found = {it.display: Listed(it.remote, it.entry.size, "", it.entry.mtime_ns) for it in items}
    found.update({shown: Listed("", -1, target) for target, _local, shown in links})
    return found


def _listing_plan(
    conn: Connection,
    specs: Sequence[FetchSpec],
    dest: Path,
    options: Options,
    report: Report,
    progress: Progress | None = None,
) -> tuple[list[Item], list[tuple[str, Path, str]]]:
    roots = list(dict.fromkeys(s.remote for s in specs))  # `results` lists one folder twice
    listing = list_remote(conn, roots)
    for text in listing.warnings:
        report.warnings.append(text)
        if progress is not None:
            progress.warn(conn.label, text)
    by_root = dict(zip(roots, listing.roots, strict=True))
    return _plan([(s, by_root[s.remote]) for s in specs], listing.remote_now, dest, options, report)


def download(
    conn: Connection,
    specs: Sequence[FetchSpec],
    dest: Path,
    options: Options | None = None,
    progress: Progress | None = None,
    *,
    only: Collection[str] | None = None,
) -> Report:
    """Fetch `specs` from the host into `dest`; see the module docstring for the steps.
    `only`: just these local paths (relative to `dest`; a merged fetch's share of this
    node), the rest of what the specs select left on the host."""
    options = options or Options()
    progress = progress or Progress()
    started = time.monotonic()
    report = Report(host=conn.label)
    items, links = _listing_plan(conn, specs, dest, options, report, progress)
    if only is not None:
        items = [it for it in items if it.display in only]
        links = [link for link in links if link[2] in only]
    _place_links(links, report)
    to_send, to_check = [], []
    for it in items:
        state = _local_state(it, options)
        if state == "unchanged":
            report.unchanged += 1
        elif state == "check":
            to_check.append(it)
        elif state == "fail":
            report.failed[it.display] = it.why
        else:
            to_send.append(it)
    if to_check:
        to_send += _settle_by_checksum(conn, to_check, options, report)
    if options.cancel is not None:
        options.cancel.check()
    try:
        failed = _transfer(conn, to_send, options, progress, report) if to_send else []
        if failed:  # once more from scratch, with what the host has now
            retry = _relist(conn, failed, report)
            for it in _transfer(conn, retry, options, progress, report, fresh=True):
                report.failed[it.display] = it.why
                if it.mismatch:
                    report.mismatched.append(it.display)
                progress.file_end(conn.label, it.display, False)
                with contextlib.suppress(OSError, TypeError):
                    os.unlink(it.part)  # type: ignore[arg-type]
    except OSError as exc:  # writing here: no space, no permission...
        raise VmrunError(
            f"cannot write the fetched files under {dest}: {exc.strerror or exc}",
            host=conn.label,
            hint="check free space and permissions there; run again to resume",
            code="write-failed",
        ) from None
    report.seconds = time.monotonic() - started
    return report
