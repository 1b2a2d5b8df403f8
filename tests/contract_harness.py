"""What tests/test_backend_contract.py asks of a backend's harness: the backend over its
fakes, a plan whose script the test steps through, and ways to look at the "machines"."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from vmrun.backends.api import Backend, RunRef, StartOptions
from vmrun.runs.plan import Plan

# The run's script: says it began, waits for its gate file (bounded), exits with the code in
# it. `step 1` is its first line; `done` its last before the exit.
SCRIPT = """\
import os, sys, time
from pathlib import Path
print("step 1", flush=True)
Path(os.environ["CONTRACT_BEGAN"]).write_text(str(os.getpid()))
gate = Path(os.environ["CONTRACT_GATE"])
deadline = time.monotonic() + 60
while not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
print("done", flush=True)
sys.exit(int(gate.read_text() or 0) if gate.exists() else 9)
"""


class Harness(Protocol):
    backend: Backend
    project: Path
    resumes: bool  # False: `start(resume=...)` is refused up front (flags-conflict)

    def plan(self) -> Plan: ...
    def began(self, ref: RunRef) -> bool: ...  # the script printed its first line
    def release(self, code: int) -> None: ...  # let the waiting script exit with `code`
    def reset_gate(self) -> None: ...  # the next attempt waits again
    def alive(self, ref: RunRef) -> bool: ...  # any process of the run left
    def exists(self, path: str) -> bool: ...  # a path as the backend names it, on its machine
    # a run going on, started where it lives (a backend that cannot detach: its terminal)
    def start_elsewhere(self, how: StartOptions) -> RunRef: ...


class Gate:
    """The files the script and the test share (all on this machine)."""

    def __init__(self, root: Path):
        self.root = root
        self.project = root / "project"
        self.project.mkdir(parents=True, exist_ok=True)
        (self.project / "train.py").write_text(SCRIPT)
        self.gate = root / "gate"
        self.began_file = root / "began"

    def plan(self) -> Plan:
        env = {"CONTRACT_GATE": str(self.gate), "CONTRACT_BEGAN": str(self.began_file)}
        return Plan(
            script=self.project / "train.py",
            is_template=False,
            name="contract",
            args=[],
            launcher="python",
            nproc=None,
            max_restarts=0,
            env=env,
            project=self.project,
        )

    def began(self) -> bool:
        return self.began_file.exists()

    def release(self, code: int) -> None:
        tmp = self.gate.with_suffix(".tmp")
        tmp.write_text(str(code))
        tmp.rename(self.gate)

    def reset_gate(self) -> None:
        self.gate.unlink(missing_ok=True)
        self.began_file.unlink(missing_ok=True)

    def start_elsewhere(self, how: StartOptions) -> RunRef:
        raise AssertionError("a backend that detaches starts its runs itself")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds:g} s")
        time.sleep(0.02)


PYTHON = sys.executable
