"""A stand-in for vmrun.ssh.group.Group: the same `entries`, `connections` and
`map(fn, only=)`, run in this thread on connections that are never opened; hosts named in
`down` fail as an unreachable host does, before fn runs (quick-tier tests of the fan-out
logic, no sshd)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from vmrun.config import load_settings
from vmrun.errors import UnreachableError
from vmrun.results.record import RunRecord
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Outcome
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.inventory import HostEntry


class FakeGroup:
    def __init__(self, labels: Iterable[str], tmp_path: Path, down: Collection[str] = ()):
        settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
        self.entries = [HostEntry(HostSpec(label)) for label in labels]
        self.connections = {e.label: Connection(e.spec, settings) for e in self.entries}
        self.down = set(down)
        self.calls: list[tuple[str, ...]] = []  # the hosts each map() reached for

    def map(
        self, fn: Callable[[HostEntry, Any], Any], only: Collection[str] | None = None
    ) -> list[Outcome[Any]]:
        chosen = [e for e in self.entries if only is None or e.label in only]
        self.calls.append(tuple(e.label for e in chosen))
        outcomes = []
        for entry in chosen:
            try:
                if entry.label in self.down:
                    raise UnreachableError("connection refused", host=entry.label)
                value = fn(entry, self.connections[entry.label])
                outcomes.append(Outcome(entry.label, value, None, 0.0))
            except Exception as exc:
                outcomes.append(Outcome(entry.label, None, exc, 0.0))
        return outcomes

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


RUN_NODES = ["accA", "accB"]


def run_on_two_nodes_one_down(tmp_path: Path, monkeypatch: Any) -> FakeGroup:
    """accA and accB, both listed; accB refuses connections. Run r1 ran on both. Every
    place that opens a group or selects hosts gets this one (`monkeypatch`: pytest's)."""
    import vmrun.operations.fetch
    import vmrun.ssh.group
    import vmrun.ssh.inventory
    from vmrun.backends.hosts import records

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VMRUN_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    fake = FakeGroup(RUN_NODES, tmp_path, down={"accB"})
    for module in (vmrun.ssh.group, vmrun.operations.fetch):
        monkeypatch.setattr(module, "Group", lambda entries, settings: fake)
    monkeypatch.setattr(vmrun.ssh.inventory, "select_hosts", lambda *a, **k: fake.entries)

    def list_runs(conn: Connection, run_ids: Any = ()) -> list[records.RunRecord]:
        meta = {"nodes": RUN_NODES, "started": 1.0, "workdir": "w", "template": True}
        return [
            records.RunRecord(r, conn.label, record=RunRecord.from_json(meta), alive=True)
            for r in run_ids or ["r1"]
            if r == "r1"
        ]

    monkeypatch.setattr(records, "list_runs", list_runs)
    return fake
