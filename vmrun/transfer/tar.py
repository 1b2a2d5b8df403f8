"""Many files in one stream: GNU tar framing, read and written member by member.

One `tar` on the host sends every file that is needed in a single stream (one connection,
no per-file round trips: 2,000 small files in well under a second); the reader here hands
each member's bytes to the caller, who writes them where it decides. Only the names the
caller asked for are ever written, so a member name can never place a file anywhere else.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from vmrun.transfer.streams import Stream, read_exact

BLOCK = 512
# -P keeps names exactly as given; --hard-dereference sends hard-linked files in full;
# --verbatim-files-from: a name starting with `-` is a name, never an option.
TAR_CREATE = [
    "tar",
    "-c",
    "-f",
    "-",
    "-b",
    "2048",
    "--format=gnu",
    "--null",
    "--verbatim-files-from",
    "--no-recursion",
    "--hard-dereference",
    "-P",
    "-T",
    "-",
]


class TruncatedStream(Exception):
    """The stream ended inside the archive: the connection or the remote tar died."""


@dataclass
class Member:
    name: str
    size: int
    regular: bool
    mode: int
    mtime: int


def _padding(size: int) -> int:
    return -size % BLOCK


def members(stream: Stream) -> Iterator[Member]:
    """Yield each member; the caller must consume exactly `member.size` bytes of data
    (with stream.read/copy_to, or `skip`) before asking for the next one."""
    long_name: str | None = None
    pending_pad = 0
    while True:
        if pending_pad and len(read_exact(stream, pending_pad)) != pending_pad:
            raise TruncatedStream("the stream ended inside a member's padding")
        header = read_exact(stream, BLOCK)
        if len(header) != BLOCK:
            raise TruncatedStream("the stream ended before the end of the archive")
        if header == b"\0" * BLOCK:
            return
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.TarError as exc:
            raise TruncatedStream(f"bad tar header from the host: {exc}") from None
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            data = read_exact(stream, info.size + _padding(info.size))
            if len(data) != info.size + _padding(info.size):
                raise TruncatedStream("the stream ended inside a long name")
            if info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = data[: info.size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            pending_pad = 0
            continue
        name = long_name if long_name is not None else info.name
        long_name = None
        size = info.size if info.type in tarfile.REGULAR_TYPES else 0
        yield Member(name, size, info.type in tarfile.REGULAR_TYPES, info.mode, int(info.mtime))
        pending_pad = _padding(size)


def skip(stream: Stream, size: int) -> None:
    left = size
    while left:
        data = stream.read(min(left, 1 << 20))
        if not data:
            raise TruncatedStream("the stream ended inside a member")
        left -= len(data)


def drain(stream: Stream) -> None:
    """Read to the end (tar pads its last record); lets the sender exit cleanly."""
    while stream.read(1 << 20):
        pass
