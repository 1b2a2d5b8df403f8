"""The local backend over its contract: runs on this machine, under the project's
results/<run-id>/. A run here lives in the terminal that started it (no `detach`), so the
scenarios that need a run going on meanwhile start it in another terminal: `vmrun train
--local` in a child process, as a user would, and the backend under test finds, follows and
stops it from here. `start` itself runs a run to its end (tests/test_backend_contract.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from contract_harness import Gate, pid_alive, wait_for

from vmrun.backends.api import RunRef, StartOptions
from vmrun.backends.local.backend import LocalBackend
from vmrun.config import load_settings


class LocalHarness(Gate):
    resumes = False  # a run here is not continued (its capabilities: no resume)

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env = {**os.environ, "HOME": str(self.home), "VMRUN_HOSTS": ""}
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.backend = LocalBackend(
            load_settings({}, cwd=self.project, environ={"HOME": str(self.home)})
        )
        self.backend.project = self.project
        self.terminals: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> LocalHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        for terminal in self.terminals:  # whatever happened: nothing left running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(terminal.pid, signal.SIGKILL)
            terminal.wait()

    def start_elsewhere(self, how: StartOptions) -> RunRef:
        """`vmrun train --local` in a terminal of its own; the run once its record is here."""
        assert how == StartOptions(), how
        plan = self.plan()
        argv = [sys.executable, "-m", "vmrun", "train", "--local", "--launcher", "python"]
        terminal = subprocess.Popen(
            [*argv, plan.script.name],
            cwd=self.project,
            env={**self.env, **plan.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.terminals.append(terminal)
        wait_for(lambda: any((self.project / "results").glob("*/run.json")), 60, "a record")
        return self.backend.find(None)

    def began(self, ref: RunRef) -> bool:
        return super().began()

    def alive(self, ref: RunRef) -> bool:
        pids = [int(self.began_file.read_text())] if self.began_file.exists() else []
        return any(pid_alive(pid) for pid in pids)

    def exists(self, path: str) -> bool:
        return Path(path).exists()
