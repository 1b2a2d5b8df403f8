"""The hosts backend over its contract's fakes: each "host" is a home of its own on this
machine, where vmrun's host scripts run by `sh` as they would over SSH (LocalConnection, a
STAND-IN for a Connection), and the project's sync is a copy (STAND-IN for rsync over SSH).
Everything else (preflight, records, the run's supervisor, logs, stop) is the real code."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from conftest import install_hostlib
from contract_harness import PYTHON, Gate, pid_alive
from local_connection import LocalConnection

from vmrun.backends.api import RunRef
from vmrun.backends.hosts.backend import HostsBackend
from vmrun.runs.plan import Plan
from vmrun.ssh.group import Outcome
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.inventory import HostEntry


class LocalGroup:
    """vmrun.ssh.group.Group's `entries`, `connections` and `map`, in this thread."""

    def __init__(self, hosts: dict[str, LocalConnection]) -> None:
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
        self.group = LocalGroup({"accA": LocalConnection("accA", home)})
        self.backend = HostsBackend(self.group)  # type: ignore[arg-type]
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr("vmrun.sync.project.sync_project", self._copy)

    def _copy(self, conn: LocalConnection, project: Path, workdir: str, **_: Any) -> Any:
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
