"""Receiving one host's files: a tar stream (or `tail -c +N` to resume) into temporary names.

Small files pass through memory and are hashed on the way; big ones are spliced from the
stream into their file (no copy through Python) and hashed by a thread reading behind the
writer. Nothing here decides what to fetch or whether a file is good: see vmrun.transfer.download.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.errors import AuthError, ConnectionLostError, HostKeyError, RemoteError, VmrunError
from vmrun.ssh import quoting
from vmrun.transfer.hashing import Follower, Throttle, file_sha256
from vmrun.transfer.manifest import Entry, remote_arg
from vmrun.transfer.streams import CHUNK, Engine, Stream, read_exact
from vmrun.transfer.tar import TAR_CREATE, TruncatedStream, drain, members, skip

if TYPE_CHECKING:
    from vmrun.transfer.types import Cancel, Progress, Report

SMALL = 4 << 20  # files up to this size go through memory; larger ones are spliced


@dataclass
class Item:
    """One file to fetch, and what became of it."""

    remote: str
    local: Path
    entry: Entry
    display: str
    offset: int = 0
    part: Path | None = None
    received: int = -1  # bytes of the file now in `part` (-1: nothing arrived)
    digest: str | None = None
    why: str = ""
    mismatch: bool = False  # all of it arrived, but not the host's bytes (SHA-256 differs)

    def arrived_as(self, theirs: str | None) -> bool:
        """Whether all of it arrived and matches the host's SHA-256 (`theirs`); else why not."""
        if self.received != self.entry.size or self.digest is None:
            self.why = self.why or "changed on the host during the transfer"
        elif theirs is None:
            self.why = "vanished or became unreadable on the host"
        elif theirs != self.digest:
            self.why = f"SHA-256 differs (host {theirs[:16]}..., here {self.digest[:16]}...)"
            self.mismatch = True
        else:
            return True
        return False


class _Held:
    """A stream registered with a Cancel until it has finished."""

    def __init__(self, stream: Stream, cancel: Cancel):
        self.stream, self.cancel = stream, cancel
        self.token = cancel.hold(stream.kill)

    def send(self, data: bytes | bytearray | memoryview) -> None:
        self.stream.send(data)

    def close_input(self) -> None:
        self.stream.close_input()

    def read(self, size: int) -> bytes:
        return self.stream.read(size)

    def copy_to(self, fd: int, count: int, on_chunk: Callable[[int], None]) -> int:
        return self.stream.copy_to(fd, count, on_chunk)

    def finish(self) -> tuple[int, str]:
        try:
            return self.stream.finish()
        finally:
            self.cancel.release(self.token)

    def kill(self) -> None:
        self.stream.kill()


class Cancellable:
    """An engine whose open streams a Cancel can kill from another thread."""

    def __init__(self, engine: Engine, cancel: Cancel):
        self.engine, self.cancel, self.name = engine, cancel, engine.name

    def open(self, command: str) -> Stream:
        return _Held(self.engine.open(command), self.cancel)


def stream_error(status: int, err: str, label: str, doing: str) -> VmrunError:
    last = err.strip().splitlines()[-1] if err.strip() else f"exit status {status}"
    if status not in (255, -1):
        return RemoteError(f"the sending command failed {doing}: {last}", host=label)
    if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION" in err:
        return HostKeyError(f"ssh refused the host key {doing}: {last}", host=label)
    if "Permission denied" in err and status == 255:
        return AuthError(f"ssh could not log in {doing}: {last}", host=label)
    return ConnectionLostError(
        f"the data stream broke {doing}: {last}",
        host=label,
        hint="check the host and the network, then run the same command again (it resumes)",
    )


class Receiver:
    """Moves one host's files through an engine into their temporary names."""

    def __init__(
        self,
        host: str,
        engine: Engine,
        bwlimit: float | None,
        progress: Progress,
        rep: Report,
        cancel: Cancel | None = None,
    ):
        self.cancel = cancel
        self.engine = Cancellable(engine, cancel) if cancel is not None else engine
        self.progress = progress
        self.report = rep
        self.throttle = Throttle(bwlimit)
        self.host = host

    def _on_chunk(self, nbytes: int) -> None:
        if self.cancel is not None:
            self.cancel.check()
        self.report.wire_bytes += nbytes
        self.progress.advance(self.host, nbytes)
        self.throttle(nbytes)

    def _write(self, stream: Stream, item: Item, size: int, fd: int, start: int) -> None:
        """`size` bytes from the stream into fd (positioned at `start`); sets the digest."""
        assert item.part is not None
        if size <= SMALL and start == 0:
            data = read_exact(stream, size)
            if len(data) != size:
                raise TruncatedStream("the stream ended inside a file")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            item.digest = hashlib.sha256(data).hexdigest()
            item.received = size
            self._on_chunk(size)
            return
        follower = Follower(item.part, start)
        written = start

        def on_chunk(n: int) -> None:
            nonlocal written
            written += n
            follower.grow(written)
            self._on_chunk(n)

        try:
            got = stream.copy_to(fd, size, on_chunk)
        except BaseException:
            follower.cancel()
            raise
        item.received = start + got
        if got != size:
            follower.cancel()
            raise TruncatedStream("the stream ended inside a file")
        item.digest = follower.finish(start + size)

    def tar(self, items: list[Item]) -> None:
        wanted = {remote_arg(it.remote): it for it in items}
        stream = self.engine.open(quoting.plain_command(TAR_CREATE))
        names = b"".join(os.fsencode(name) + b"\0" for name in wanted)

        def feed() -> None:
            with contextlib.suppress(Exception):
                stream.send(names)
            stream.close_input()

        sender = threading.Thread(target=feed, daemon=True)
        sender.start()
        try:
            for member in members(stream):
                item = wanted.pop(member.name, None)
                if item is None or not member.regular:
                    skip(stream, member.size)
                    continue
                assert item.part is not None
                self.progress.file_begin(self.host, item.display, member.size, 0)
                fd = os.open(item.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    self._write(stream, item, member.size, fd, 0)
                finally:
                    os.close(fd)
            drain(stream)
        except TruncatedStream:
            sender.join(timeout=10)
            status, err = stream.finish()
            raise stream_error(status, err, self.host, "while fetching files") from None
        except BaseException:
            stream.kill()
            sender.join(timeout=10)
            stream.finish()
            raise
        sender.join(timeout=10)
        status, err = stream.finish()
        if status == 255:
            raise stream_error(status, err, self.host, "while fetching files")
        for item in wanted.values():
            item.why = _tar_complaint(err, item.remote) or "could not be read on the host"

    def ranges(self, items: list[Item], count: int) -> None:
        """Big files over `count` streams at once; NoPython if the host cannot run them."""
        _Ranges(self, items, count).run()

    def tail(self, item: Item) -> None:
        """Continue a partial copy from its end."""
        assert item.part is not None
        size, start = item.entry.size, item.offset
        command = quoting.plain_command(["tail", "-c", f"+{start + 1}", remote_arg(item.remote)])
        self.progress.file_begin(self.host, item.display, size, start)
        stream = self.engine.open(command)
        fd = os.open(item.part, os.O_WRONLY)
        try:
            os.ftruncate(fd, start)
            os.lseek(fd, start, os.SEEK_SET)
            self._write(stream, item, size - start, fd, start)
            if stream.read(1):  # more than expected: the file grew since it was listed
                item.digest, item.why = None, "changed on the host during the transfer"
                drain(stream)
        except TruncatedStream:
            status, err = stream.finish()
            if status == 255:
                raise stream_error(
                    status, err, self.host, f"while fetching {item.display}"
                ) from None
            item.why = err.strip() or "changed on the host during the transfer"
            return
        except BaseException:
            stream.kill()
            stream.finish()
            raise
        finally:
            os.close(fd)
        status, err = stream.finish()
        if status == 255:
            raise stream_error(status, err, self.host, f"while fetching {item.display}")


class NoPython(Exception):
    """The host could not run python3 (exit 127): the caller fetches in one tar stream."""


REQUEST = struct.Struct(">QQI")  # hostside/transfer_send.py's: offset, length, len(path)
COUNT = struct.Struct(">q")


@dataclass(eq=False)
class _Range:
    item: Item
    offset: int
    length: int
    done: int = 0


class _Ranges:
    """Big files in ranges over several streams at once (hostside/transfer_send.py on the
    host, one request per range, all sent up front), each range written at its offset."""

    def __init__(self, receiver: Receiver, items: list[Item], count: int):
        self.receiver = receiver
        self.items = items
        self.lanes: list[list[_Range]] = [[] for _ in range(count)]
        self.loads = [0] * count
        self.lock = threading.Lock()
        for item in items:
            size = item.entry.size
            step = -(-size // count // CHUNK) * CHUNK or size
            for at in range(0, size, step):
                lane = self.loads.index(min(self.loads))
                self.lanes[lane].append(_Range(item, at, min(step, size - at)))
                self.loads[lane] += min(step, size - at)
        self.errors: list[BaseException] = []
        self.statuses: list[tuple[int, str]] = []

    def run(self) -> None:
        for item in self.items:
            assert item.part is not None
            fd = os.open(item.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            self.receiver.progress.file_begin(self.receiver.host, item.display, item.entry.size, 0)
        threads = [
            threading.Thread(target=self._lane, args=(lane,), daemon=True)
            for lane in self.lanes
            if lane
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.errors or any(status != 0 for status, _ in self.statuses):
            self._keep_prefixes()
        if self.statuses and all(status == 127 for status, _ in self.statuses):
            raise NoPython
        for error in self.errors:
            raise error
        for status, err in self.statuses:
            if status != 0:
                raise stream_error(status, err, self.receiver.host, "while fetching big files")
        for item in self.items:
            assert item.part is not None
            item.received = item.entry.size
            item.digest = file_sha256(item.part)

    def _lane(self, ranges: list[_Range]) -> None:
        from vmrun import hostside

        command = quoting.plain_command(hostside.command("transfer_send.py"))
        try:
            stream = self.receiver.engine.open(command)
        except BaseException as exc:
            self.errors.append(exc)
            return
        requests = b"".join(
            REQUEST.pack(r.offset, r.length, len(os.fsencode(remote_arg(r.item.remote))))
            + os.fsencode(remote_arg(r.item.remote))
            for r in ranges
        )

        def feed() -> None:
            with contextlib.suppress(Exception):
                stream.send(requests)
            stream.close_input()

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            for r in ranges:
                self._one(stream, r)
        except BaseException as exc:
            stream.kill()
            if not isinstance(exc, TruncatedStream):
                self.errors.append(exc)
        feeder.join(timeout=10)
        status, err = stream.finish()
        with self.lock:
            self.statuses.append((status, err))

    def _one(self, stream: Stream, r: _Range) -> None:
        head = read_exact(stream, COUNT.size)
        if len(head) != COUNT.size:
            raise TruncatedStream("the stream ended before a range")
        (count,) = COUNT.unpack(head)
        if count != r.length:
            r.item.why = "vanished or changed on the host during the transfer"
        if count <= 0:
            return
        assert r.item.part is not None
        fd = os.open(r.item.part, os.O_WRONLY)
        try:
            os.lseek(fd, r.offset, os.SEEK_SET)

            def on_chunk(n: int) -> None:
                r.done += n
                with self.lock:
                    self.receiver._on_chunk(n)

            got = stream.copy_to(fd, count, on_chunk)
        finally:
            os.close(fd)
        if got != count:
            raise TruncatedStream("the stream ended inside a range")

    def _keep_prefixes(self) -> None:
        """After a failure: each file cut back to the bytes that arrived from its start, so
        the next fetch resumes from there (`tail`), never past a hole."""
        for item in self.items:
            ranges = sorted(
                (r for lane in self.lanes for r in lane if r.item is item), key=lambda r: r.offset
            )
            prefix = 0
            for r in ranges:
                prefix += r.done
                if r.done < r.length:
                    break
            with contextlib.suppress(OSError):
                os.truncate(item.part, prefix)  # type: ignore[arg-type]


def _tar_complaint(err: str, remote: str) -> str:
    for line in err.splitlines():
        if remote in line or remote_arg(remote) in line:
            return line.split(": ", 1)[-1].strip()
    return ""
