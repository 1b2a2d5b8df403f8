"""What a run's supervisor (`train --recover`, vmrun.operations.supervise) is asked and
what it has done, as its folder keeps them, so a supervisor started again goes on from
there. The supervisor: vmrun itself, on a host that outlives the
laptop (`--supervisor HOST`, else the master), started there by vmrun.recovery.deploy and
reaching the run's nodes and spares with a key of its own. It follows the run; when the run
fails it finds which nodes still answer, decides (vmrun.recovery.policy) and resumes the
run (`train --resume`, the lost nodes replaced by spares, the outputs from the run's bucket
when the master is gone), again and again within the limits; when the run ends, either way,
it takes its key off the hosts and stops.

Its folder (DIR, `~/.vmrun/supervisor/runs/RUN_ID/`): spec.json (what it was asked),
events.jsonl (each failure and what was decided: a supervisor started again goes on from
there), pid, log, and the settings it runs with (config.toml, project/vmrun.toml)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vmrun.recovery.policy import DEFAULT_MAX_RECOVERIES, Failure

TAG = "vmrun-supervisor:{run}"  # the comment of its key, on every host that allows it


@dataclass(frozen=True)
class Spec:
    """What the supervisor is asked (spec.json, written by the deploy)."""

    run_id: str
    nodes: list[str]  # master first
    spares: list[str] = field(default_factory=list)
    max_recoveries: int = DEFAULT_MAX_RECOVERIES
    store: str = ""  # the run's bucket place (its snapshots outlive its master there)
    workdir: str = ""  # the project's folder on the hosts (as the run's start made it)
    cluster: str = ""  # the `vmrun up` cluster the nodes are VMs of, if they all are
    renewable: list[str] = field(default_factory=list)  # its nodes a new VM may replace
    started: float = 0.0

    @classmethod
    def load(cls, path: Path) -> Spec:
        raw = json.loads(path.read_text())
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")


@dataclass
class Event:
    """One failure and what was decided, as events.jsonl keeps it."""

    at: float
    failure: dict[str, Any]
    action: str
    why: str
    nodes: list[str]  # the next attempt's (the same for a give-up)
    swap: dict[str, str] = field(default_factory=dict)


class Journal:
    """events.jsonl: appended one line per event, read back whole on a restart."""

    def __init__(self, path: Path):
        self.path = path

    def events(self) -> list[Event]:
        if not self.path.is_file():
            return []
        found = []
        for line in self.path.read_text().splitlines():
            try:
                found.append(Event(**json.loads(line)))
            except (ValueError, TypeError):
                continue
        return found

    def add(self, event: Event) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(asdict(event), sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def failures_of(events: list[Event]) -> list[Failure]:
    known = Failure.__dataclass_fields__
    found = []
    for e in events:
        raw = {k: v for k, v in e.failure.items() if k in known}
        for key in ("nodes", "lost", "noticed", "returned"):
            raw[key] = tuple(raw.get(key, ()))
        found.append(Failure(**raw))
    return found
