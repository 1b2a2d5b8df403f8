"""Whether a run is alive has one rule on a host, its pid and the start time of that pid
(hostside/run_alive.sh; run_marks.py's Python says the same): the listing (`status`), the
start's busy check, the stop (is the pid still the run's session?), the autostop watchdog and
the log-time marker agree on every case, run here by sh and python3 against a home of their
own (quick tier)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import install_hostlib
from test_autostop import _home, _now
from testbed import wait_until

from vmrun.hostside import source
from vmrun.runs.launch_spec import LaunchSpec

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


# case: (what pid holds, what pid_start holds), and whether the run is alive
CASES = {
    "live": ("the process", "its start time", True),
    "reused": ("the process", "another start time", False),  # the number names a stranger
    "older": ("the process", None, False),  # no pid_start: nothing proves it is the run's
    "ended": ("a reaped pid", "some start time", False),
    "zombie": ("an unreaped process", "its start time", False),  # ended, not waited for yet
    "no-pid": (None, None, False),
}


@pytest.fixture
def record(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, dict, int, int]]:
    """A home whose one run record is the case's; the process it may name (its own session,
    as a run's supervising shell is, and without the run's id in its environment)."""
    home, env = _home(tmp_path)
    rec = home / ".vmrun" / "runs" / "r1"
    rec.mkdir()
    (rec / "run.json").write_text("{}\n")
    (rec / "log").write_text("")
    pid_is, start_is, _ = CASES[request.param]
    command = ["true"] if pid_is == "an unreaped process" else ["sleep", "60"]
    proc = subprocess.Popen(command, start_new_session=True)
    if pid_is == "an unreaped process":
        wait_until(lambda: _state(proc.pid) == "Z", 10, "the process to end")
    pid = proc.pid if pid_is in ("the process", "an unreaped process") else _dead_pid()
    if pid_is is not None:
        (rec / "pid").write_text(f"{pid}\n")
    if start_is is not None:
        start = _start_time(proc.pid)
        (rec / "pid_start").write_text(f"{start if start_is == 'its start time' else 1}\n")
    try:
        yield rec, env, proc.pid, pid
    finally:
        proc.kill()
        proc.wait()


def _listed(env: dict) -> bool:
    out = subprocess.run(
        ["sh", "-c", source("run_list.sh"), "vmrun-list", ".vmrun/runs", "r1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    (alive,) = [line for line in out.splitlines() if line.startswith("ALIVE ")]
    return alive == "ALIVE 1"


def _stopped_as_its_session(env: dict, pid: int) -> bool:
    out = subprocess.run(
        ["sh", "-c", source("run_stop.sh"), "vmrun-stop", ".vmrun/runs", "r1", "50"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    term = [line for line in out.splitlines() if line.startswith("TERM ")]  # none: none to stop
    return any(str(pid) in line.split()[1:] for line in term)


def _start_refused(env: dict) -> bool:
    """run_start.sh's check under its lock: a second run (r2) is refused while r1 is alive,
    and started (with vmrun's host-side files in place) when it is not."""
    lib = install_hostlib(Path(env["HOME"]))
    spec = LaunchSpec(
        rec=".vmrun/runs/r2",
        workdir=env["HOME"],
        run_id="r2",
        argv=("true",),
        out="r2-out",
        alone=True,
    )
    done = subprocess.run(
        ["sh", str(lib / "run_start.sh")],
        env={**env, **spec.header()},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode == 0:
        return False
    assert done.returncode == 3, done.stderr  # refused, not failed
    return done.stdout.split() == ["BUSY", "r1"]


def _keeps_marking(rec: Path, env: dict, pid: int) -> bool:
    """run_marks.py beside the pid: still marking after a line more, or done at once."""
    marks = subprocess.Popen(
        [sys.executable, "-c", source("run_marks.py"), str(rec), str(pid)], env=env
    )
    try:
        times = rec / "log.times"
        wait_until(lambda: times.exists() and times.read_text(), 10, "the first mark")
        if marks.poll() is not None or _ended_within(marks, 1.0):
            return False
        with open(rec / "log", "a") as log:
            log.write("a line\n")
        wait_until(
            lambda: times.read_text().startswith("0 ") and "\n1 " in times.read_text(),
            10,
            "a mark for the new line",
        )
        return marks.poll() is None
    finally:
        marks.kill()
        marks.wait()


def _ended_within(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.parametrize("record", list(CASES), indirect=True)
def test_every_alive_check_on_the_host_agrees(
    record: tuple[Path, dict, int, int], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    rec, env, pid, recorded = record
    expected = CASES[request.node.callspec.params["record"]][2]
    busy = _now(tmp_path, env)
    watchdog = busy.returncode == 3 and "run r1 is still running" in busy.stdout
    if not watchdog:
        (Path(env["HOME"]) / "calls").unlink(missing_ok=True)
    seen = {
        "list": _listed(env),
        "watchdog": watchdog,
        "marks": _keeps_marking(rec, env, recorded),
        "start": _start_refused(env),
        "stop": _stopped_as_its_session(env, pid),  # last: it ends the process
    }
    assert seen == dict.fromkeys(seen, expected)
