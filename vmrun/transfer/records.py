"""Uploads as records for the host's transfer_recv.py: verified and placed in one pass, over
one stream or several at once.

A whole file travels as an F record (header, names, bytes, then the SHA-256 computed here
while reading it): the host hashes it while writing and renames it into place at once, so
nothing reads it back and no round trip follows. Small files are packed into 1 MiB writes.
On a far host a big file is cut into ranges (R records) spread over several streams, each
with its own SSH window (one stream moves 2 MiB per round trip whatever the bandwidth);
each range is hashed on both ends as it travels (its SHA-256 follows its bytes), and once
every stream has ended well with no range refused, M records place those files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun import hostside
from vmrun.errors import RemoteError, VmrunError
from vmrun.ssh import quoting
from vmrun.transfer.hashing import Throttle
from vmrun.transfer.streams import CHUNK, PARALLEL_BYTES, Engine, Stream, capture

if TYPE_CHECKING:
    from collections.abc import Iterator

    from vmrun.ssh.connection import Connection
    from vmrun.transfer.types import Progress, Report

# kind, len(temp), len(final), offset, length, size, mtime_ns, mode (transfer_recv.py's)
HEADER = struct.Struct(">cIIQQQqI")
BATCH = 1 << 20  # small records are gathered into writes of about this size
INLINE = 256 << 10  # files up to this size are read whole (one read, one hash call)
PIECES_PER_STREAM = 4  # a big file's ranges: about this many for each stream

NO_PYTHON = 127  # the host's shell could not find python3: the tar path serves it


@dataclass(eq=False)
class Outgoing:
    """One file to upload, and what became of it."""

    rel: str  # relative to the remote directory
    path: Path | str
    size: int
    mtime_ns: int
    mode: int
    temp: str = ""
    digest: str | None = None  # hex SHA-256 of what was read here (None: it changed meanwhile)
    sent: int = 0
    why: str = ""  # why the host did not place it
    resume: int = 0  # bytes a cut upload left on the host (its temporary copy): sent from there


@dataclass(eq=False)
class Piece:
    """An R record: `length` bytes of a big file from `offset`."""

    item: Outgoing
    offset: int
    length: int


@dataclass
class Lane:
    """What one stream carries, and how it ended."""

    work: list[Outgoing] = field(default_factory=list)
    nbytes: int = 0  # of `work`
    shared: deque[Piece] = field(default_factory=deque)  # ranges any stream takes when free
    results: dict[bytes, str] = field(default_factory=dict)  # final name -> why ("" placed)
    status: int = 0
    err: str = ""
    error: BaseException | None = None


def _names(item: Outgoing) -> tuple[bytes, bytes]:
    return os.fsencode(item.temp), os.fsencode(item.rel)


def header(kind: bytes, item: Outgoing, offset: int, length: int) -> bytes:
    temp, final = _names(item)
    fields = (len(temp), len(final), offset, length, item.size, item.mtime_ns, item.mode)
    return HEADER.pack(kind, *fields) + temp + final


def lanes_for(items: list[Outgoing], count: int) -> list[Lane]:
    """Spread the work over `count` streams: with more than one, every file of PARALLEL_BYTES
    or more is cut into ranges of whole MiBs, about PIECES_PER_STREAM per stream, that the
    streams take in turn as each gets free (so a slower stream does not hold up the end:
    eight fixed shares of a 256 MiB file at 80 ms ended 0.35 s apart); the other files go
    to the streams in runs of their order, each about as many bytes (a folder's files to
    one stream: several receivers creating files in one folder wait for each other on its
    lock)."""
    lanes = [Lane() for _ in range(max(1, count))]
    pieces: deque[Piece] = deque()
    rest: list[Outgoing] = []
    for item in items:
        if count > 1 and item.size >= PARALLEL_BYTES and not item.resume:
            step = max(-(-item.size // (count * PIECES_PER_STREAM) // CHUNK), 1) * CHUNK
            starts = range(0, item.size, step)
            pieces += (Piece(item, at, min(step, item.size - at)) for at in starts)
        else:
            rest.append(item)
    share = sum(w.size for w in rest) / len(lanes)
    index = 0
    for w in rest:  # the files in order, each stream filled up to its share
        while index < len(lanes) - 1 and lanes[index].nbytes + w.size / 2 > share:
            index += 1
        lanes[index].work.append(w)
        lanes[index].nbytes += w.size
    if pieces:
        for lane in lanes:
            lane.shared = pieces
        return lanes
    return [lane for lane in lanes if lane.work] or lanes[:1]


class _Pacer:
    """Progress, wire bytes and --bwlimit for all of one host's streams."""

    def __init__(self, label: str, progress: Progress, report: Report, bwlimit: float | None):
        self.label, self.progress, self.report = label, progress, report
        self.throttle = Throttle(bwlimit)
        self.lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self.lock:
            self.report.wire_bytes += nbytes
            self.progress.advance(self.label, nbytes)
            self.throttle(nbytes)


def _work(lane: Lane) -> Iterator[Outgoing | Piece]:
    """The lane's own files, then ranges from the shared queue until none is left."""
    yield from lane.work
    while True:
        try:
            yield lane.shared.popleft()  # one taker per range: deque.popleft is atomic
        except IndexError:
            return


def _send_lane(stream: Stream, lane: Lane, pace: _Pacer) -> None:
    buf = bytearray()
    pending = 0  # file bytes in `buf`

    def flush() -> None:
        nonlocal pending
        if buf:
            stream.send(buf)
            buf.clear()
            pace(pending)
            pending = 0

    for w in _work(lane):
        item = w.item if isinstance(w, Piece) else w
        try:
            fd = os.open(item.path, os.O_RDONLY)
        except OSError as exc:  # never sent: the host has nothing to report about it
            item.why = f"cannot read it here: {exc.strerror or exc}"
            continue
        try:
            if item.size <= INLINE and not isinstance(w, Piece):
                data = os.read(fd, item.size + 1) if item.size else b""
                good = len(data) == item.size  # else it changed while being sent
                data = data if good else (data + bytes(item.size))[: item.size]
                item.digest = hashlib.sha256(data).hexdigest() if good else None
                buf += header(b"F", item, 0, item.size)
                buf += data
                buf += bytes.fromhex(item.digest) if item.digest else bytes(32)
                pending += item.size  # file bytes, as Report.wire_bytes counts them
                if len(buf) >= BATCH:
                    flush()
                continue
            if isinstance(w, Piece):
                if w.offset == 0:
                    pace.progress.file_begin(pace.label, item.rel, item.size, 0)
                buf += header(b"R", item, w.offset, w.length)
                flush()
                digest = hashlib.sha256()
                if _send_bytes(stream, fd, w.offset, w.length, digest, pace):
                    item.digest = None  # shorter now: the zero digest fails the check
                stream.send(digest.digest() if item.digest is not None else bytes(32))
                continue
            pace.progress.file_begin(pace.label, item.rel, item.size, item.resume)
            buf += header(b"F", item, item.resume, item.size - item.resume)
            flush()
            digest = _prefix_digest(fd, item.resume)
            shrank = _send_bytes(stream, fd, item.resume, item.size - item.resume, digest, pace)
            item.digest = None if shrank else digest.hexdigest()
            stream.send(digest.digest() if item.digest else bytes(32))
        finally:
            os.close(fd)
    flush()


def _prefix_digest(fd: int, length: int) -> hashlib._Hash:
    """SHA-256 of the file's first `length` bytes (what the host holds of a resumed file)."""
    digest, at = hashlib.sha256(), 0
    while at < length:
        data = os.pread(fd, min(4 * CHUNK, length - at), at)
        if not data:
            break  # shorter now: the digest will not match, the file is sent again whole
        digest.update(data)
        at += len(data)
    return digest


def _send_bytes(
    stream: Stream,
    fd: int,
    offset: int,
    length: int,
    digest: hashlib._Hash | None,
    pace: _Pacer,
) -> bool:
    """Send `length` bytes of the file from `offset`; True if it was shorter (zeros sent:
    the digest then fails the host's check)."""
    shrank = False
    at, left = offset, length
    while left:
        data = os.pread(fd, min(CHUNK, left), at)
        if not data:
            data, shrank = bytes(min(CHUNK, left)), True
        if digest is not None:
            digest.update(data)
        stream.send(data)
        left -= len(data)
        at += len(data)
        pace(len(data))
    return shrank


def _read_results(stream: Stream, lane: Lane) -> None:
    """What transfer_recv.py says, once its output ends."""
    parts = []
    with contextlib.suppress(Exception):
        while data := stream.read(65536):
            parts.append(data)
    parse_results(b"".join(parts), lane)


def receive_command(remote_dir: str) -> str:
    return quoting.plain_command(hostside.command("transfer_recv.py", remote_dir))


@dataclass
class Opened:
    """Streams started before an upload needs them (a push starts them while its check of the
    host is still out: their logins overlap it), for the upload of `source`."""

    source: str
    engine: Engine
    count: int
    streams: list[Stream] = field(default_factory=list)
    unused: list[Stream] = field(default_factory=list)  # input closed; reaped by close()

    @classmethod
    def start(cls, engine: Engine, source: str, remote_dir: str, count: int) -> Opened:
        opened = cls(source, engine, count)
        try:
            for _ in range(count):
                opened.streams.append(engine.open(receive_command(remote_dir)))
        except BaseException:
            opened.close()
            raise
        return opened

    def take(self, count: int) -> list[Stream]:
        """Up to `count` of the streams, once; the others get their input closed (their
        receivers end with nothing done), and are waited for only by close(), so that their
        logins, maybe still under way, hold up nothing."""
        taken, rest = self.streams[:count], self.streams[count:]
        self.streams = []
        for stream in rest:
            with contextlib.suppress(Exception):
                stream.close_input()
        self.unused += rest
        return taken

    def close(self) -> None:
        """The streams not taken, ended (their receivers saw an empty input)."""
        self.take(0)
        unused, self.unused = self.unused, []
        for stream in unused:
            with contextlib.suppress(Exception):
                stream.finish()


class _Closer:
    """The ranged files placed by the first stream's receiver, with M records sent on it once
    every other stream has ended well and refused none of their ranges (its own refusals
    its receiver knows): no round trip of its own after the data."""

    def __init__(self, lanes: list[Lane], ranged: list[Outgoing]):
        self.lanes, self.ranged = lanes, ranged
        self.left = len(lanes) - 1
        self.ended = threading.Condition()
        self.moved: list[Outgoing] = []

    def lane_ended(self) -> None:
        with self.ended:
            self.left -= 1
            self.ended.notify_all()

    def place(self, stream: Stream) -> None:
        with self.ended:
            self.ended.wait_for(lambda: self.left <= 0)
        others = self.lanes[1:]
        if any(lane.status != 0 or lane.error is not None for lane in others):
            return  # send_lanes says why
        refused = {name for lane in others for name, why in lane.results.items() if why}
        ready = [
            i
            for i in self.ranged
            if i.digest is not None and not i.why and _names(i)[1] not in refused and _unchanged(i)
        ]
        if ready:
            stream.send(b"".join(header(b"M", i, 0, 0) for i in ready))
            self.moved = ready


def _unchanged(item: Outgoing) -> bool:
    """The file here has the size and mtime it was sent with (an edit in place while its
    ranges were read would else be placed half old, half new); `why` says so otherwise."""
    try:
        st = os.stat(item.path)
    except OSError as exc:
        item.why = f"cannot read it here: {exc.strerror or exc}"
        return False
    if (st.st_size, st.st_mtime_ns) != (item.size, item.mtime_ns):
        item.why = "changed here while it was being sent"
        return False
    return True


def _run_lane(
    engine: Engine,
    remote_dir: str,
    lane: Lane,
    pace: _Pacer,
    stream: Stream | None = None,
    closer: _Closer | None = None,
) -> None:
    try:
        _carry(stream or engine.open(receive_command(remote_dir)), lane, pace, closer)
    except BaseException as exc:  # the stream could not start: the lane failed
        lane.error, lane.status = exc, lane.status or 255
    finally:
        if closer is not None and closer.lanes[0] is not lane:
            closer.lane_ended()


def _carry(stream: Stream, lane: Lane, pace: _Pacer, closer: _Closer | None) -> None:
    reader = threading.Thread(target=_read_results, args=(stream, lane), daemon=True)
    reader.start()
    try:
        _send_lane(stream, lane, pace)
        if closer is not None and closer.lanes[0] is lane:
            closer.place(stream)
    except BaseException as exc:  # the host's side ended first: its status says why
        lane.error = exc
        stream.kill()
    stream.close_input()
    reader.join()
    lane.status, lane.err = stream.finish()


def send_lanes(
    conn: Connection,
    engine: Engine,
    remote_dir: str,
    items: list[Outgoing],
    streams: int,
    bwlimit: float | None,
    progress: Progress,
    report: Report,
    opened: Opened | None = None,
) -> bool:
    """Send `items` over `streams` streams at once and place what arrived whole; each item's
    `why` says what went wrong with it. False: the host has no python3 (nothing was sent).
    `opened`: streams started earlier, used first."""
    lanes = lanes_for(items, streams)
    early = opened.take(len(lanes)) if opened is not None else []
    pace = _Pacer(conn.label, progress, report, bwlimit)
    ranged = list({id(p.item): p.item for p in lanes[0].shared}.values())
    for item in ranged:
        item.digest = ""  # "": not read yet; None: it changed while being read
    closer = _Closer(lanes, ranged) if ranged else None
    threads = [
        threading.Thread(
            target=_run_lane,
            args=(engine, remote_dir, lane, pace, early[i] if i < len(early) else None, closer),
            daemon=True,
        )
        for i, lane in enumerate(lanes)
    ]
    _start_all(threads, closer, early)
    for thread in threads:
        thread.join()
    if all(lane.status == NO_PYTHON for lane in lanes):
        return False
    _check_lanes(conn, lanes)
    results = {name: why for lane in lanes for name, why in lane.results.items()}
    silent = {id(i) for i in ranged}  # a range that arrived well is not reported
    for item in items:
        if not item.why:  # else it could not be read here
            quiet = "" if id(item) in silent else "the host did not report it"
            item.why = results.get(_names(item)[1], quiet)
    for item in ranged:
        if item.digest is None and not item.why:
            item.why = "changed here while it was being sent"
    moved = {id(i) for i in closer.moved} if closer is not None else set()
    _move(conn, remote_dir, [i for i in ranged if not i.why and id(i) not in moved])
    return True


def _start_all(
    threads: list[threading.Thread], closer: _Closer | None, early: list[Stream]
) -> None:
    """Start every lane; when one cannot start (no thread to be had), the ones not started
    count as ended for the first lane, their early streams are killed, and the started ones
    are waited for before the error goes up."""
    for i, thread in enumerate(threads):
        try:
            thread.start()
        except BaseException:
            for j in range(i, len(threads)):
                if closer is not None and j > 0:
                    closer.lane_ended()
                if j < len(early):
                    early[j].kill()
                    early[j].finish()
            for started in threads[:i]:
                started.join()
            raise


def _check_lanes(conn: Connection, lanes: list[Lane]) -> None:
    for lane in lanes:
        if lane.status == 0 and lane.error is None:
            continue
        if isinstance(lane.error, VmrunError):  # the connection went: that says it best
            raise lane.error
        err = lane.err.strip()
        last = err.splitlines()[-1] if err else f"exit status {lane.status}"
        if not err and lane.error is not None:
            last += f" ({type(lane.error).__name__}: {lane.error})"
        broke = lane.status == 255 or isinstance(lane.error, (BrokenPipeError, ConnectionError))
        raise RemoteError(
            f"the upload stream broke: {last}"
            if broke
            else f"receiving on the host failed: {last}",
            host=conn.label,
            hint="check the network, free space and permissions there; run the same command "
            "again (what arrived whole is kept)",
            code="transfer-failed",
        )


def _move(conn: Connection, remote_dir: str, items: list[Outgoing]) -> None:
    """M records: files whose every range the host verified, given their mode and mtime and
    placed, in one round trip."""
    if items:
        _ask(conn, remote_dir, b"".join(header(b"M", i, 0, 0) for i in items), items)


def parse_results(out: bytes, lane: Lane) -> None:
    """transfer_recv.py's answers (`+FINAL\\0`, `-FINAL\\0WHY\\0`) into `lane.results`."""
    words = out.split(b"\0")
    at = 0
    while at < len(words):
        word = words[at]
        if word.startswith(b"+"):
            lane.results[word[1:]] = ""
        elif word.startswith(b"-"):
            why = words[at + 1] if at + 1 < len(words) else b""
            lane.results[word[1:]] = why.decode("utf-8", "replace")
            at += 1
        at += 1


def place_whole(conn: Connection, remote_dir: str, items: list[Outgoing]) -> bool:
    """P records: temporary copies an earlier, cut upload left whole on the host, hashed
    there and placed when each is what `digest` says (in one round trip); `why` says what
    became of each. False: the host has no python3 (nothing was done)."""
    data = b"".join(
        header(b"P", i, 0, 0) + (bytes.fromhex(i.digest) if i.digest else bytes(32)) for i in items
    )
    return _ask(conn, remote_dir, data, items) != NO_PYTHON


def _ask(conn: Connection, remote_dir: str, data: bytes, items: list[Outgoing]) -> int:
    """One receiver run over `data` (M or P records); each item's `why` from its answer.
    Its exit status (NO_PYTHON: nothing was done)."""
    status, out, err = capture(conn, receive_command(remote_dir), stdin=data, what="placing files")
    if status == NO_PYTHON:
        return status
    lane = Lane()
    parse_results(out, lane)
    if status != 0:
        _check_lanes(conn, [Lane(status=status, err=err)])
    for item in items:
        item.why = lane.results.get(_names(item)[1], "the host did not report it")
    return status
