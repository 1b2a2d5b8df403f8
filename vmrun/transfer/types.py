"""What a transfer is asked for and what it reports: the types shared by download, upload,
receive and their callers, kept apart so none of them imports another for its vocabulary."""

from __future__ import annotations

import fnmatch
import os
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from vmrun.errors import Interrupted, UsageError
from vmrun.reporting import Progress as Progress  # the transfers' own name for it

BIG_TRANSFER = 128 << 20  # from here on OpenSSH's client pays for its own handshake


@dataclass(frozen=True)
class FetchSpec:
    """One thing to fetch: a remote root and where it lands under the destination."""

    remote: str  # normalised (vmrun.transfer.manifest.normalize_remote): `a/b` (home) or `/abs`
    local: str  # POSIX path relative to the destination; "" is the destination itself
    select: tuple[str, ...] = ()  # a category (checkpoints...): files must match one of these
    include: tuple[str, ...] = ()  # the user's --include: and one of these
    exclude: tuple[str, ...] = ()
    latest: int | None = None  # keep only the newest N files (after include/exclude)
    label: str = ""  # what the user asked for, for messages
    newer_than_ns: int = 0  # only files modified since (a run's outputs among synced code)


class Cancel:
    """Stops a transfer from another thread at once (detaching from `train --fetch-every`):
    `set` kills the streams it has open, and its next step raises Interrupted. Files cut
    short stay under their temporary names, and resume next time."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._kills: dict[int, Callable[[], None]] = {}
        self._next = 0

    def hold(self, kill: Callable[[], None]) -> int:
        """Register how to kill an open stream (killed at once if already set)."""
        with self._lock:
            self._next += 1
            self._kills[self._next] = kill
            token = self._next
        if self.event.is_set():
            kill()
        return token

    def release(self, token: int) -> None:
        with self._lock:
            self._kills.pop(token, None)

    def set(self) -> None:
        self.event.set()
        with self._lock:
            kills = list(self._kills.values())
        for kill in kills:
            kill()

    def check(self) -> None:
        if self.event.is_set():
            raise Interrupted("the transfer was stopped")


@dataclass(frozen=True)
class Options:
    verify: bool = False  # compare checksums of unchanged files too
    settle: float = 0.0  # skip files modified less than this many seconds ago (--watch)
    engine: str = "auto"  # "auto", "openssh" or "paramiko"
    bwlimit: float | None = None  # bytes per second
    streams: int = 0  # streams at once for big transfers (0: chosen from the round trip)
    cancel: Cancel | None = field(default=None, compare=False)  # stops it from elsewhere


def env_tuning() -> tuple[str, int]:
    """VMRUN_TRANSFER_ENGINE (auto, openssh, paramiko) and VMRUN_TRANSFER_STREAMS (a count;
    0 or unset: chosen from the round trip), checked."""
    engine = os.environ.get("VMRUN_TRANSFER_ENGINE", "auto").strip().lower() or "auto"
    if engine not in ("auto", "openssh", "paramiko"):
        raise UsageError("VMRUN_TRANSFER_ENGINE must be auto, openssh or paramiko")
    streams = os.environ.get("VMRUN_TRANSFER_STREAMS", "").strip() or "0"
    if not streams.isdigit() or not 0 <= int(streams) <= 64:
        raise UsageError("VMRUN_TRANSFER_STREAMS must be a number of streams from 0 to 64")
    return engine, int(streams)


@dataclass
class Report:
    host: str
    engine: str = ""
    streams: int = 1  # streams at once (several for big files on a far host)
    fetched: list[str] = field(default_factory=list)  # local paths, relative to the dest
    fetched_bytes: int = 0  # sizes of the fetched files
    wire_bytes: int = 0  # file bytes actually moved (less than fetched_bytes on resume)
    resumed: int = 0
    unchanged: int = 0
    checked: int = 0  # settled by checksum (in doubt, or --verify)
    replaced: int = 0  # --verify found a local copy with other bytes
    links: int = 0
    skipped: list[str] = field(default_factory=list)  # not followed / not a regular file
    settling: int = 0  # still being written on the host (--watch); next round
    missing: list[str] = field(default_factory=list)  # requested, not on the host
    failed: dict[str, str] = field(default_factory=dict)  # local path -> why
    mismatched: list[str] = field(default_factory=list)  # of failed: SHA-256 differed
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed and not self.missing


def selected(path: str, spec: FetchSpec) -> bool:
    def hit(pattern: str) -> bool:
        target = path if "/" in pattern.strip("/") else posixpath.basename(path)
        return fnmatch.fnmatchcase(target, pattern.strip("/"))

    for patterns in (spec.select, spec.include):
        if patterns and not any(hit(p) for p in patterns):
            return False
    return not any(hit(p) for p in spec.exclude)
