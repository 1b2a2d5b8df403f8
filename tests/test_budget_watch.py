"""hostside/budget_watch.py run here against a run of its own (a shell and its child, as
run_supervise.sh and a rank are; quick tier): at the time left it records the cap, tells the
ranks that catch SIGUSR2 and leaves them their epoch; what catches nothing is stopped after
the grace, recorded as stopped; a run that ends first is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

from vmrun.hostside import HERE

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

CATCHES = """\
import pathlib, signal, sys, time
def note(*_):
    pathlib.Path(sys.argv[1]).write_text("usr2")
    sys.exit(0)
signal.signal(signal.SIGUSR2, note)
pathlib.Path(sys.argv[1] + ".ready").touch()
time.sleep(60)
"""
IGNORES = """\
import pathlib, sys, time
pathlib.Path(sys.argv[1] + ".ready").touch()
time.sleep(60)
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes], Path]]:
    """A record folder and the run's shell (its pid and pid_start as run_supervise.sh
    writes them); the rank's word arrives in `said`."""

    def start(script: str) -> tuple[Path, subprocess.Popen[bytes], Path]:
        rec, said = tmp_path / "rec", tmp_path / "said"
        rec.mkdir()
        (tmp_path / "rank.py").write_text(script)
        shell = subprocess.Popen(
            [
                "sh",
                "-c",
                f'{sys.executable} "$1" "$2"; echo ended',
                "sh",
                str(tmp_path / "rank.py"),
                str(said),
            ],
            start_new_session=True,
        )
        started.append(shell)
        stat = Path(f"/proc/{shell.pid}/stat").read_text().rsplit(")", 1)[1].split()
        (rec / "pid_start").write_text(stat[19] + "\n")
        (rec / "log").write_text("")
        wait_for(lambda: Path(f"{said}.ready").exists(), 30, "the rank's start")
        return rec, shell, said

    started: list[subprocess.Popen[bytes]] = []
    yield start  # type: ignore[misc]
    for shell in started:
        _end(shell)


def _end(shell: subprocess.Popen[bytes]) -> None:
    """The shell and its rank, by their session (the shell's pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(shell.pid, signal.SIGKILL)
    shell.wait()


def _watch(rec: Path, pid: int, seconds: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HERE / "budget_watch.py"), str(rec), str(pid), seconds, "$8.00"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_at_the_cap_the_ranks_that_catch_sigusr2_are_told_and_it_is_recorded(run) -> None:  # type: ignore[no-untyped-def]
    rec, shell, said = run(CATCHES)
    done = _watch(rec, shell.pid, "0.3")
    assert done.returncode == 0, done.stderr
    assert said.read_text() == "usr2"  # the rank's own handler: its epoch, its snapshot
    assert json.loads((rec / "budget").read_text())["cap"] == "$8.00"
    assert "the run has cost --max-cost $8.00: snapshot and stop" in (rec / "log").read_text()
    assert shell.wait(timeout=30) == 0 and not (rec / "stopped").exists()


def test_what_catches_nothing_is_stopped_after_the_grace_and_recorded_as_stopped(run) -> None:  # type: ignore[no-untyped-def]
    rec, shell, _ = run(IGNORES)
    done = _watch(rec, shell.pid, "0.2", VMRUN_BUDGET_STARTING_S="0.5", VMRUN_BUDGET_GRACE_S="0.5")
    assert done.returncode == 0, done.stderr
    assert (rec / "stopped").exists() and (rec / "budget").exists()
    assert "no process of the run catches SIGUSR2; stopping it" in (rec / "log").read_text()
    shell.wait(timeout=30)  # its rank gone, the shell ends


def test_a_run_that_ends_before_its_cap_is_left_alone(run) -> None:  # type: ignore[no-untyped-def]
    rec, shell, said = run(CATCHES)
    _end(shell)
    done = _watch(rec, shell.pid, "30")  # ends with the run, not after 30 s
    assert done.returncode == 0 and not (rec / "budget").exists() and not said.exists()
