"""Download progress read from a step's output lines, for the live view and the host's log.

What the tools print when their output is not a terminal (recorded lines are in
tests/test_setup_progress.py):
* pip: `Downloading NAME-VERSION-....whl (191.8 MB)` always (sizes in decimal units); with
  `--progress-bar raw` (pip 24.1 and later; the `vmrun_pip_install` helper passes it where the
  pip has it) a `Progress CUR of TOTAL` line (bytes) every quarter second; older pips print one
  finished bar line, `━━━━ 191.8/191.8 MB 517.4 MB/s eta 0:00:00`, at the end;
* uv: `Downloading NAME (33.7MiB)`, then ` Downloaded NAME` (downloads run in parallel);
* curl: its progress meter, one row per second (`vmrun_fetch` turns its carriage returns into
  newlines and says `Downloading NAME` first); sizes in binary units (k, M, G: 1024-based).

The rate of pip's raw lines is measured here, over the last few seconds. Sizes and rates are
shown in MiB, as everywhere in vmrun.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

MIB = 2**20
_DECIMAL = {"B": 1, "bytes": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BINARY = {
    "": 1,
    "B": 1,
    "k": 2**10,
    "K": 2**10,
    "KiB": 2**10,
    "M": 2**20,
    "MiB": 2**20,
    "G": 2**30,
    "GiB": 2**30,
    "T": 2**40,
    "TiB": 2**40,
}
_RATE_WINDOW = 3.0  # seconds of raw progress lines the rate is measured over

# pip and uv: "Downloading NAME (SIZE)"; vmrun_fetch: "Downloading NAME" (curl's meter follows)
_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \((\d+(?:\.\d+)?) ?([kMGT]?i?B|bytes)\))?\s*$")
_UV_DONE = re.compile(r"^\s*Downloaded (\S+)\s*$")
_PIP_RAW = re.compile(r"^Progress (\d+) of (\d+)\s*$")
_PIP_BAR = re.compile(
    r"^[\s━╸╺╺━-]*(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) (kB|MB|GB|bytes) (\d+(?:\.\d+)?) (kB|MB|GB)/s"
)
_CURL_SIZE = r"(\d+(?:\.\d+)?[kMGT]?)"
_CURL_ROW = re.compile(
    rf"^\s*\d+\s+{_CURL_SIZE}\s+\d+\s+{_CURL_SIZE}\s+\d+\s+\S+\s+\S+\s+\S+"
    rf"\s+[\d:-]+\s+[\d:-]+\s+[\d:-]+\s+{_CURL_SIZE}\s*$"
)


@dataclass
class Progress:
    """One download as last seen: bytes so far and in all (None: not said), bytes a second."""

    name: str
    done: int | None = None
    total: int | None = None
    rate: float | None = None
    finished: bool = False
    meter: bool = False  # the line was a meter row only: not worth a line of the log each

    def text(self) -> str:
        """e.g. `torch: 180.3/512.0 MiB 45.2 MiB/s`."""
        if self.finished:
            size = f"{_mib(self.total)} MiB " if self.total else ""
            rate = f" at {self.rate / MIB:.1f} MiB/s" if self.rate else ""
            return f"{self.name}: {size}downloaded{rate}"
        if self.done is None:
            size = f" {_mib(self.total)} MiB" if self.total else ""
            return f"{self.name}: downloading{size}"
        total = f"/{_mib(self.total)}" if self.total else ""
        rate = f" {self.rate / MIB:.1f} MiB/s" if self.rate is not None else ""
        return f"{self.name}: {_mib(self.done)}{total} MiB{rate}"


def _mib(n: int | None) -> str:
    return f"{(n or 0) / MIB:.1f}"


def _size(number: str, unit: str, units: dict[str, int]) -> int:
    return int(float(number) * units[unit])


def _curl_size(text: str) -> int:
    unit = text[-1] if text[-1].isalpha() else ""
    return _size(text[: len(text) - len(unit)], unit, _BINARY)


def package_name(shown: str) -> str:
    """What pip or uv downloads, as a person names it: `torch` for a URL or file name of
    `torch-2.13.0%2Bcpu-cp311-...whl`, `Miniconda3-latest-Linux-x86_64.sh` as it is."""
    base = unquote(shown.rstrip("/").rsplit("/", 1)[-1])
    if base.endswith((".whl", ".tar.gz", ".zip")) and "-" in base:
        return base.split("-", 1)[0]
    return base


class DownloadWatch:
    """Reads one step's output, a line at a time; `feed` returns the download's progress when
    the line says something about it, else None."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.current: Progress | None = None
        self._samples: deque[tuple[float, int]] = deque()
        self._sizes: dict[str, int | None] = {}  # uv's sizes, said before its parallel downloads

    def feed(self, line: str) -> Progress | None:
        if match := _PIP_RAW.match(line):
            return self._raw(int(match[1]), int(match[2]))
        if match := _CURL_ROW.match(line):
            now = self._current()
            now.total = _curl_size(match[1]) or None
            now.done, now.rate = _curl_size(match[2]), float(_curl_size(match[3]))
            now.finished = bool(now.total) and now.done == now.total
            now.meter = True
            return now
        if match := _DOWNLOADING.match(line):
            total = _size(match[2], match[3], _DECIMAL | _BINARY) if match[2] else None
            self.current = Progress(package_name(match[1]), total=total)
            self._sizes[self.current.name] = total
            self._samples.clear()
            return self.current
        if match := _UV_DONE.match(line):
            self.current = Progress(match[1], total=self._sizes.get(match[1]), finished=True)
            return self.current
        if (match := _PIP_BAR.match(line)) and self.current is not None:
            now = self.current
            now.done = now.total = _size(match[2], match[3], _DECIMAL)
            now.rate, now.finished = float(_size(match[4], match[5], _DECIMAL)), True
            return now
        return None

    def _current(self) -> Progress:
        if self.current is None:
            self.current = Progress("download")
        self.current.meter = False
        return self.current

    def _raw(self, done: int, total: int) -> Progress:
        """pip's `Progress CUR of TOTAL`: the rate over the last few seconds of them."""
        now, at = self._current(), self.clock()
        if done < (now.done or 0):
            self._samples.clear()  # a new file (a retry, or the next package)
        self._samples.append((at, done))
        while at - self._samples[0][0] > _RATE_WINDOW and len(self._samples) > 2:
            self._samples.popleft()
        first_at, first_done = self._samples[0]
        if at > first_at:
            now.rate = (done - first_done) / (at - first_at)
        now.done, now.total = done, total or now.total
        now.finished = bool(total) and done == total
        now.meter = True
        return now
