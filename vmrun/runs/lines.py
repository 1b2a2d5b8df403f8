"""A torchrun run's output as whole lines, each prefixed with its rank, torchrun's noise out.

torchrun (`--tee 3`, launch.RANK_PREFIX_TEMPLATE) copies each worker's output from its file
to its own output a chunk at a time, each chunk after a `\\x1e[rankN]:` header. A chunk is
what the worker had written when torchrun looked: a line written in pieces (print(a, b) under
PYTHONUNBUFFERED is several writes) can arrive as two chunks with another rank's chunk in
between. The header's record separator (\\x1e) marks where each chunk starts, so its
line can be put back together here, whole, before anyone sees it.

Shown as `[host rankN] text` (several hosts) or `[rankN] text` (one host: no host name to
tell apart); torchrun's own lines as `[host] text`, or as they are on one host. Unless
verbose, lines that only torchrun's machinery prints are dropped: its OMP_NUM_THREADS
banner, and c10d's warnings that a host name has no IPv6 address or cannot be looked up
(harmless: the run talks over the addresses vmrun checked). The log on the host keeps them.
"""

from __future__ import annotations

import re
import threading

from vmrun.reporting import Passing, Reporter
from vmrun.runs.launch import RANK_PREFIX

_MARK = b"\x1e"
_HEADER = re.compile(rb"\x1e\[rank(\d+)\]:")
_STARS = rb"\*{20,}"
_BANNER = [  # torchrun's lines, one pattern each, when OMP_NUM_THREADS is unset
    re.compile(rb"|WARNING:torch\.distributed\.run:"),
    re.compile(_STARS),
    re.compile(rb"Setting OMP_NUM_THREADS environment variable for each process to be .*"),
    re.compile(_STARS),
]
# torch's C++ warning prefix (`[W1123 19:34:13.502671302 socket.cpp:764] [c10d] `), then the
# messages a host without a resolvable name or IPv6 address gets at every connect
_C10D_NOISE = re.compile(
    rb"\[W\d{4} [\d:.]+ (?:socket|TCPStore)\.cpp:\d+\] \[c10d\] "
    rb"(?:The IPv6 network addresses of \(.*\) cannot be retrieved"
    rb"|The hostname of the client socket cannot be retrieved)"
)


def is_c10d_noise(text: bytes) -> bool:
    """c10d's warnings that a host name has no IPv6 address or cannot be looked up: shown
    only with --verbose, whatever launched the process."""
    return _C10D_NOISE.match(text) is not None


class Prefixer(Passing):
    """Cuts one node's output into whole lines, each prefixed, and hands them to `out`;
    `host` None on one host. A Reporter itself, so a log reader can stream into it: its
    `output` takes the bytes as they come (any cut); the rest passes on to `out`."""

    def __init__(self, host: str | None, out: Reporter, *, verbose: bool = True):
        super().__init__(out)
        self.host = host.encode() if host else None
        self.verbose = verbose
        self.rest = b""
        self.pending: dict[int | None, bytes] = {}  # each rank's line so far
        self.held: list[bytes] = []  # torchrun's lines so far that may be its banner
        self.lock = threading.Lock()

    def output(self, data: bytes) -> None:
        self.feed(data)

    def feed(self, data: bytes) -> None:
        with self.lock:
            buf = self.rest + data
            pos = 0
            while pos < len(buf):
                header = _HEADER.match(buf, pos)
                rank = int(header.group(1)) if header else None
                start = header.end() if header else pos
                newline = buf.find(b"\n", start)
                mark = buf.find(_MARK, start if header else pos + 1)
                if newline < 0 and mark < 0:
                    break  # the segment is not over yet
                if newline >= 0 and (mark < 0 or newline < mark):
                    self._line(rank, self.pending.pop(rank, b"") + buf[start:newline])
                    pos = newline + 1
                else:  # a chunk that stops mid-line; the rest comes after another header
                    self.pending[rank] = self.pending.get(rank, b"") + buf[start:mark]
                    pos = mark
            self.rest = buf[pos:]

    def flush(self) -> None:
        """The end of the output: whatever is left is shown, each rank's part as a line."""
        with self.lock:
            if self.rest:
                header = _HEADER.match(self.rest)
                rank = int(header.group(1)) if header else None
                text = self.rest[header.end() :] if header else self.rest
                self.pending[rank] = self.pending.get(rank, b"") + text
                self.rest = b""
            for rank, text in sorted(self.pending.items(), key=lambda kv: (kv[0] is None, kv)):
                self._line(rank, text)
            self.pending.clear()
            self._release()

    def _line(self, rank: int | None, text: bytes) -> None:
        if rank is None:  # torchrun's own, or a log written before the \x1e header
            match = RANK_PREFIX.match(text)
            if match:
                rank, text = int(match.group(1)), text[match.end() :]
        if rank is None:
            self._own(text)
            return
        self._release()
        if self.verbose or not _C10D_NOISE.match(text):
            where = self.host + b" " if self.host else b""
            self.out.output(b"[" + where + b"rank" + str(rank).encode() + b"] " + text + b"\n")

    def _own(self, text: bytes) -> None:
        """torchrun's own line. Its banner (an empty line or `WARNING:torch.distributed.run:`,
        stars, the OMP_NUM_THREADS notice, stars) is held until it is whole, then dropped
        unless verbose; lines that only look like a part of it are shown as they were."""
        if self.verbose:
            self._show(text)
            return
        if _C10D_NOISE.match(text):
            return
        step = len(self.held)
        expected = _BANNER[step] if step < len(_BANNER) else None
        if expected is not None and expected.fullmatch(text.rstrip()):
            self.held.append(text)
            if len(self.held) == len(_BANNER):
                self.held = []  # the whole banner: dropped
            return
        self._release()
        if _BANNER[0].fullmatch(text.rstrip()):
            self.held.append(text)
        else:
            self._show(text)

    def _show(self, text: bytes) -> None:
        self.out.output((b"[" + self.host + b"] " if self.host else b"") + text + b"\n")

    def _release(self) -> None:
        """Lines held as a possible banner that did not go on as one: shown after all."""
        held, self.held = self.held, []
        for text in held:
            self._show(text)
