"""How `vmrun fetch` looks: live progress on a terminal, plain lines elsewhere, summaries.

Imported only when a fetch runs (rich is imported only for the live view).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vmrun.cli.output import say
from vmrun.store_url import is_store
from vmrun.transfer.types import Progress, Report

if TYPE_CHECKING:
    from rich.console import Console

BIG_FILE = 64 << 20  # files at least this big get a line of their own


def human_bytes(n: float) -> str:
    """IEC units (KiB, MiB...) everywhere fetch and sync print sizes and rates."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def summary(report: Report, *, prefix: bool) -> str:
    """One line: files fetched (from a bucket: named), bytes, time, rate, and what was not
    fetched and why."""
    bucket = f" from {report.host}/" if is_store(report.host) else ""
    head = f"[{report.host}] " if prefix and not bucket else ""
    count = len(report.fetched)
    parts = [f"fetched {count} file{'s' if count != 1 else ''}{bucket}"]
    if report.fetched:
        rate = report.wire_bytes / report.seconds if report.seconds > 0 else 0.0
        parts[0] += (
            f" ({human_bytes(report.fetched_bytes)}; {human_bytes(report.wire_bytes)} moved,"
            f" {human_bytes(rate)}/s)"
        )
    if report.resumed:
        parts.append(f"{report.resumed} resumed")
    parts.append(f"{report.unchanged} unchanged")
    if report.replaced:
        parts.append(f"{report.replaced} replaced (bytes differed)")
    if report.links:
        parts.append(f"{report.links} symlinks made")
    if report.skipped:
        parts.append(f"{len(report.skipped)} skipped")
    if report.settling:
        parts.append(f"{report.settling} still being written")
    if report.failed:
        parts.append(f"{len(report.failed)} FAILED")
    if report.missing:
        parts.append(f"{len(report.missing)} not found")
    return f"{head}{', '.join(parts)} in {report.seconds:.2f} s"


class PlainProgress(Progress):
    """No live view: a line when a big file is done, warnings as they come."""

    def __init__(self, *, prefix: bool):
        self.prefix = prefix
        self.sizes: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()

    def file_begin(self, host: str, path: str, size: int, offset: int) -> None:
        if size >= BIG_FILE:
            with self.lock:
                self.sizes[(host, path)] = size

    def file_end(self, host: str, path: str, ok: bool) -> None:
        with self.lock:
            size = self.sizes.pop((host, path), None)
        if size is not None and ok:
            head = f"[{host}] " if self.prefix else ""
            say(f"{head}{path} ({human_bytes(size)}) verified", err=True)
            sys.stderr.flush()

    def warn(self, host: str, text: str) -> None:
        from vmrun.cli.output import warn_line

        warn_line(f"{host}: {text}")


def _speed_column() -> Any:
    """rich's TransferSpeedColumn counts in MB/s; this one in MiB/s, as the rest of the view."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class SpeedColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(
                "?" if speed is None else f"{human_bytes(speed)}/s", style="progress.data.speed"
            )

    return SpeedColumn()


class LiveProgress(Progress):
    """rich bars: one per host (bytes, rate, ETA) and one per big file while it moves."""

    def __init__(
        self, console: Console | None = None, get_time: Callable[[], float] | None = None
    ) -> None:
        """`console` and `get_time` (the clock that rates and ETAs are measured by) default
        to rich's own; tests pass theirs to read exact frames."""
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import (
            Progress as RichProgress,
        )

        self.bars = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            _speed_column(),
            TimeRemainingColumn(),
            transient=True,
            console=console,
            get_time=get_time,
        )
        self.tasks: dict[str, Any] = {}
        self.files: dict[str, Any] = {}  # host -> the bar of the big file in flight
        self.big: dict[tuple[str, str], int] = {}  # big files not yet verified
        self.lock = threading.Lock()

    def __enter__(self) -> LiveProgress:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

    def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
        with self.lock:
            hop = f" (from {via})" if via else ""
            text = f"{host}{hop}: {files} file{'s' if files != 1 else ''}"
            if host in self.tasks:
                self.bars.update(self.tasks[host], description=text, total=nbytes, completed=0)
            else:
                self.tasks[host] = self.bars.add_task(text, total=nbytes)

    def file_begin(self, host: str, path: str, size: int, offset: int) -> None:
        with self.lock:
            self._close_file(host)
            if size >= BIG_FILE:
                self.files[host] = self.bars.add_task(f"  {path}", total=size, completed=offset)
                self.big[(host, path)] = size

    def _close_file(self, host: str) -> None:
        task = self.files.pop(host, None)
        if task is not None:
            self.bars.remove_task(task)

    def advance(self, host: str, nbytes: int) -> None:
        with self.lock:
            if host in self.tasks:
                self.bars.advance(self.tasks[host], nbytes)
            if host in self.files:
                self.bars.advance(self.files[host], nbytes)

    def file_end(self, host: str, path: str, ok: bool) -> None:
        with self.lock:
            self._close_file(host)
            size = self.big.pop((host, path), None)
            if size is not None and ok:
                line = f"[{host}] {path} ({human_bytes(size)}) verified"
                self.bars.console.print(line, highlight=False, markup=False)

    def warn(self, host: str, text: str) -> None:
        with self.lock:
            self.bars.console.print(f"warning: {host}: {text}", highlight=False, markup=False)

    def step(self, host: str, what: str, done: int, total: int | None) -> None:
        key = f"{host}\0step"  # a bar of its own, beside the host's transfer bar
        with self.lock:
            text = f"{host}: {what}"
            if key in self.tasks:
                self.bars.update(self.tasks[key], description=text, total=total, completed=done)
            else:
                self.tasks[key] = self.bars.add_task(text, total=total, completed=done)


def make_progress(*, prefix: bool, live: bool) -> Progress:
    return LiveProgress() if live else PlainProgress(prefix=prefix)
