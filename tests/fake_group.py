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
