"""The hosts backend over its contract's fakes: each "host" is a home of its own on this
machine, where vmrun's host scripts run by `sh` as they would over SSH (LocalHost, a
STAND-IN for a Connection), and the project's sync is a copy (STAND-IN for rsync over SSH).
Everything else (preflight, records, the run's supervisor, logs, stop) is the real code."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import install_hostlib, local_argv
from contract_harness import PYTHON, Gate, pid_alive

from vmrun.backends.api import RunRef
from vmrun.backends.hosts.backend import HostsBackend
from vmrun.runs.plan import Plan
from vmrun.ssh.group import Outcome
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.inventory import HostEntry
from vmrun.ssh.result import CommandResult


class LocalHost:
    """STAND-IN for a Connection: each command runs here, in `home`, as this user."""

    def __init__(self, label: str, home: Path) -> None:
        self.label = label
        self.home = home
        self.env = {"HOME": str(home), "PATH": os.environ["PATH"], "LANG": "C.UTF-8"}

    def open(self) -> LocalHost:
        return self

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        on_output: Callable[[str, bytes], None] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        **_: Any,
    ) -> CommandResult:
        started = time.monotonic()
        proc = subprocess.Popen(local_argv(argv, self.home), env={**self.env, **(env or {})},
                                cwd=self.home, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        out, err = proc.communicate(stdin or b"", timeout=timeout or 120)
        if on_output is not None and out:
            on_output("out", out)
        result = CommandResult(self.label, tuple(argv), proc.returncode, out.decode(),
                               err.decode(), time.monotonic() - started)  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv}: {err.decode()}")
        return result

    def capture(
        self, command: str, *, stdin: bytes = b"", what: str = "", **_: Any
    ) -> tuple[int, bytes, str]:
        done = subprocess.run(["sh", "-c", command], env=self.env, cwd=self.home, input=stdin,
                              capture_output=True, timeout=120, check=False)  # fmt: skip
        return done.returncode, done.stdout, done.stderr.decode()


class LocalGroup:
    """vmrun.ssh.group.Group's `entries`, `connections` and `map`, in this thread."""

    def __init__(self, hosts: dict[str, LocalHost]) -> None:
        self.entries = [HostEntry(HostSpec(label)) for label in hosts]
        self.connections = hosts

    def map(
        self, fn: Callable[[HostEntry, Any], Any], only: Collection[str] | None = None
    ) -> list[Outcome[Any]]:
        outcomes: list[Outcome[Any]] = []
        for entry in self.entries:
            if only is not None and entry.label not in only:
                continue
            try:
                value = fn(entry, self.connections[entry.label])
                outcomes.append(Outcome(entry.label, value, None, 0.0))
            except Exception as exc:
                outcomes.append(Outcome(entry.label, None, exc, 0.0))
        return outcomes


class HostsHarness(Gate):
    resumes = True

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        home = tmp_path / "host-home"
        install_hostlib(home)
        (home / ".vmrun" / "host.json").write_text(json.dumps({"python": PYTHON}))  # as setup
        self.homes = {"accA": home}
        self.group = LocalGroup({"accA": LocalHost("accA", home)})
        self.backend = HostsBackend(self.group)  # type: ignore[arg-type]
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr("vmrun.sync.project.sync_project", self._copy)

    def _copy(self, conn: LocalHost, project: Path, workdir: str, **_: Any) -> Any:
        """STAND-IN for the project's sync over SSH: a copy into the host's home."""
        from vmrun.sync.plan import SyncReport

        shutil.copytree(project, conn.home / workdir, dirs_exist_ok=True)
        return SyncReport(conn.label, engine="copy")

    def __enter__(self) -> HostsHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.undo()
        for home in self.homes.values():  # every run's process group, whatever happened
            for pid_file in home.glob(".vmrun/runs/*/pid"):
                with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                    os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)

    def plan(self) -> Plan:
        return super().plan()

    def began(self, ref: RunRef) -> bool:
        return super().began()

    def alive(self, ref: RunRef) -> bool:
        pids = [int(self.began_file.read_text())] if self.began_file.exists() else []
        for home in self.homes.values():
            pid_file = home / ".vmrun" / "runs" / ref.run_id / "pid"
            if pid_file.exists():
                pids.append(int(pid_file.read_text().strip()))
        return any(pid_alive(pid) for pid in pids)

    def exists(self, path: str) -> bool:
        home = next(iter(self.homes.values()))
        return (home / path).exists()
