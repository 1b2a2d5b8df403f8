"""The live progress of `vmrun fetch` (a terminal only): drawn into a rich console in memory.

The engine's callbacks are made by hand in the order a fetch makes them, with a clock the
test moves, so each frame (bytes, rate, ETA, per-file bar) is exact and nothing waits.
"""

from __future__ import annotations

import re
from io import StringIO

from rich.console import Console

from vmrun.cli.fetch_view import BIG_FILE, LiveProgress, human_bytes, summary
from vmrun.transfer.types import Report

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MiB = 1 << 20  # fetch and sync show IEC units only: bytes, bars, rates and summaries


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def frame(live: LiveProgress, out: StringIO) -> str:
    """Draw the bars now and return what this frame put on the terminal, without escapes."""
    start = out.tell()
    live.bars.refresh()
    return ANSI.sub("", out.getvalue()[start:])


def line_of(shown: str, *needles: str) -> list[str]:
    """The last drawn line holding each needle (a frame may hold earlier lines too)."""
    lines = shown.splitlines()
    found = []
    for needle in needles:
        hits = [ln for ln in lines if needle in ln]
        assert hits, (needle, shown)
        found.append(hits[-1])
    return found


def test_live_view_shows_bytes_rate_eta_and_a_line_per_big_file() -> None:
    out = StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    clock = Clock()
    big = 100 * MiB  # over BIG_FILE: a bar of its own, then a line when verified
    assert big >= BIG_FILE
    total = big + 2 * MiB
    with LiveProgress(console=console, get_time=clock) as live:
        live.begin("gpu1", 3, total)
        live.file_begin("gpu1", "results/r1/a.txt", 1 * MiB, 0)
        live.advance("gpu1", 1 * MiB)
        live.file_end("gpu1", "results/r1/a.txt", True)
        live.file_begin("gpu1", "results/r1/snapshot.pt", big, 0)
        for _ in range(2):  # 25 MiB a second, for 2 s: half the big file
            clock.now += 1.0
            live.advance("gpu1", 25 * MiB)
        host_line, file_line = line_of(frame(live, out), "gpu1: 3 files", "snapshot.pt")
        # bytes so far / total, the rate, the ETA (51 MiB to go at 25 MiB/s)
        assert "51.0/102.0 MiB" in host_line and "25.0 MiB/s" in host_line, host_line
        assert "0:00:03" in host_line, host_line
        # the big file's own bar, under its path
        assert file_line.startswith("  results/r1/snapshot.pt"), file_line
        assert "50.0/100.0 MiB" in file_line and "0:00:02" in file_line, file_line
        for _ in range(2):
            clock.now += 1.0
            live.advance("gpu1", 25 * MiB)
        live.file_end("gpu1", "results/r1/snapshot.pt", True)
        live.file_begin("gpu1", "results/r1/b.txt", 1 * MiB, 0)
        clock.now += 1.0
        live.advance("gpu1", 1 * MiB)
        live.file_end("gpu1", "results/r1/b.txt", True)
        (host_line,) = line_of(frame(live, out), "gpu1: 3 files")
        assert "102.0/102.0 MiB" in host_line, host_line
        assert "snapshot.pt" not in frame(live, out)  # its bar is gone once verified
    text = ANSI.sub("", out.getvalue())
    assert " MB" not in text and "MB/s" not in text  # one unit family: MiB, never MB
    line = f"[gpu1] results/r1/snapshot.pt ({human_bytes(big)}) verified"
    assert text.count(line) == 1, text
    assert "a.txt" not in text and "b.txt" not in text  # small files: no line, no bar


def test_a_second_round_reuses_the_hosts_bar_and_warnings_are_printed() -> None:
    out = StringIO()
    clock = Clock()
    with LiveProgress(Console(file=out, force_terminal=True, width=80), clock) as live:
        live.begin("gpu1", 1, 10 * MiB)
        clock.now += 1.0
        live.advance("gpu1", 10 * MiB)
        live.begin("gpu1", 2, 4 * MiB)  # the re-send of a failed file: the same bar, reset
        assert len(live.bars.tasks) == 1
        assert "gpu1: 2 files" in frame(live, out) and "0.0/4.0 MiB" in frame(live, out)
        live.warn("gpu1", "1 name could not be decoded")
        live.file_end("gpu1", "x.pt", False)  # a failure prints no "verified" line
    text = ANSI.sub("", out.getvalue())
    assert "warning: gpu1: 1 name could not be decoded" in text
    assert "verified" not in text


def test_summary_names_files_bytes_rate_and_what_was_not_fetched() -> None:
    report = Report(host="gpu1", fetched=["a", "b"], fetched_bytes=300 << 20)
    report.wire_bytes, report.seconds, report.unchanged = 200 * MiB, 2.0, 7
    report.resumed, report.replaced = 1, 1
    report.failed = {"c": "SHA-256 differs"}
    line = summary(report, prefix=True)
    assert line == (
        "[gpu1] fetched 2 files (300.0 MiB; 200.0 MiB moved, 100.0 MiB/s), 1 resumed,"
        " 7 unchanged, 1 replaced (bytes differed), 1 FAILED in 2.00 s"
    )
    assert summary(Report(host="h", unchanged=3), prefix=False) == (
        "fetched 0 files, 3 unchanged in 0.00 s"
    )
    bucket = Report(host="s3://bkt/runs/r1", fetched=["x"], unchanged=1)
    assert summary(bucket, prefix=True).startswith("fetched 1 file from s3://bkt/runs/r1/ (")
