"""setup's live view: one line per host with its own clocks, rendered without a terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from vmrun.cli.setup_view import Watch, _Status


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _render(status: _Status) -> dict[str, list[str]]:
    """The view as an 80-column, colourless console shows it: the cells of each host's row."""
    out = io.StringIO()
    Console(file=out, width=80, color_system=None, force_terminal=False).print(status.render())
    lines = [line.split("  ") for line in out.getvalue().splitlines()]
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line if c.strip()]
        rows[cells[0]] = cells[1:]
    return rows


def test_each_host_has_its_own_step_and_total_clock() -> None:
    clock = Clock(1000.0)
    status = _Status(["h1", "h2", "h3"], live=True, clock=clock)
    assert _render(status) == {
        "host": ["now", "step", "total"],
        "h1": ["connecting", "0 s", "0 s"],
        "h2": ["connecting", "0 s", "0 s"],
        "h3": ["connecting", "0 s", "0 s"],
    }
    clock.now = 1002.0
    status.event("h1", "reading host facts")
    clock.now = 1005.0
    status.event("h2", "reading host facts")
    clock.now = 1010.0
    status.event("h1", "torch: applying")
    clock.now = 1012.0
    status.event("h3", "reading host facts")
    clock.now = 1020.0
    status.event("h3", "failed")
    clock.now = 1040.0
    status.event("h2", "done")
    status.event("h2", "verify: applying")  # nothing after the end counts
    clock.now = 1095.0
    status.event("h1", "torch: applying")  # the same step again keeps its start
    assert _render(status) == {
        "host": ["now", "step", "total"],
        "h1": ["torch: applying", "1:25", "1:35"],  # on torch since 1010, started at 1000
        "h2": ["done", "40 s"],  # its clocks stopped when it finished
        "h3": ["failed", "20 s"],
    }
    assert status.rows()[0] == ("h1", "torch: applying", 85.0, 95.0)
    clock.now = 1100.0
    assert status.rows()[1:] == [("h2", "done", 0.0, 40.0), ("h3", "failed", 0.0, 20.0)]


def test_plain_output_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    status = _Status(["h1"], live=False, clock=Clock(0.0))
    status.event("h1", "checking 3 step(s)")
    assert capsys.readouterr().out == "[h1] checking 3 step(s)\n"


def test_a_downloads_progress_shows_on_its_hosts_row_until_the_step_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock(0.0)
    status = _Status(["h1", "h2"], live=True, clock=clock)
    status.event("h1", "torch: applying")
    status.progress("h1", "torch: 91.8/182.9 MiB 36.7 MiB/s", False)
    clock.now = 3.0
    assert _render(status)["h1"] == [
        "torch: applying | torch: 91.8/182.9 MiB 36.7 MiB/s",
        "3 s",
        "3 s",
    ]
    assert _render(status)["h2"] == ["connecting", "3 s", "3 s"]
    status.event("h1", "verify: applying")  # the next step: the download is over
    assert _render(status)["h1"][0] == "verify: applying"
    assert capsys.readouterr().out == ""  # live: nothing printed


def test_without_a_terminal_only_notable_progress_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = _Status(["h1"], live=False, clock=Clock(0.0))
    status.progress("h1", "torch: 0.2/182.9 MiB", False)
    status.progress("h1", "torch: 182.9 MiB downloaded at 40.5 MiB/s", True)
    assert capsys.readouterr().out == "[h1] torch: 182.9 MiB downloaded at 40.5 MiB/s\n"


def test_the_watch_shows_a_cluster_as_plain_lines_and_hosts_through_their_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = Watch(live=True)  # a cluster's setup never calls watching: plain lines
    cluster.event("c1", "python-env: applying")
    cluster.progress("c1", "torch: 0.2/182.9 MiB", False)
    cluster.progress("c1", "torch: 182.9 MiB downloaded", True)
    said = capsys.readouterr().out.splitlines()
    assert said == ["[c1] python-env: applying", "[c1] torch: 182.9 MiB downloaded"]
    hosts = Watch(live=False)
    with hosts.watching(["h1", "h2"]):
        hosts.event("h1", "done")
    assert hosts.status is not None and [row[:2] for row in hosts.status.rows()] == [
        ("h1", "done"),
        ("h2", "connecting"),
    ]
    assert capsys.readouterr().out == "[h1] done\n"


def test_64_hosts_in_a_short_terminal_show_failures_and_slowest_steps_first() -> None:
    """More hosts than lines: the view keeps to the room it has (it never scrolls, so it
    never flickers), failed hosts first, then the longest steps, and counts the rest."""
    clock = Clock(0.0)
    labels = [f"h{i:02d}" for i in range(64)]
    status = _Status(labels, live=True, clock=clock)
    for i, label in enumerate(labels):
        clock.now = float(i)
        status.event(label, "done" if i < 40 else "torch: applying")
    clock.now = 100.0
    status.event("h50", "failed")
    status.event("h62", "failed")
    shown, summary = status.visible(12)
    assert len(shown) == 10
    assert [r[0] for r in shown[:2]] == ["h50", "h62"]
    assert [r[0] for r in shown[2:5]] == ["h40", "h41", "h42"]  # on their step longest
    assert summary is not None and summary.startswith("64 hosts: 2 failed, 22 working, 40 done")
    assert "54 not shown" in summary
    assert status.visible(70) == (status.rows(), None)  # room for all: every host, in order
