"""The runs on this machine as their records say: each `train --local` run keeps its
run.json under the project's results/<run-id>/ (vmrun.runs.local writes and rewrites it), so
`LocalRun` reads one as any backend's `RunRow`, and `local_runs` lists them all."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from vmrun.results.failure import WorkerFailure
from vmrun.results.record import LOCAL, LocalEnd, RunRecord
from vmrun.runs.state import RunState
from vmrun.runs.unwatched import Unwatched

HERE = "this machine"

# LocalEnd.status -> the state every backend names (`error`: vmrun itself failed the run)
_STATES = {
    "finished": RunState.DONE,
    "failed": RunState.FAILED,
    "error": RunState.FAILED,
    "stopped": RunState.STOPPED,
}


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _alive(pid: int | None) -> bool:
    """The run's launcher still lives (a zombie has ended)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass(frozen=True)
class LocalRun(Unwatched):
    """One run on this machine, as `status` shows any run."""

    id: str
    record: RunRecord
    host: str = HERE

    @property
    def end(self) -> LocalEnd:
        return self.record.local or LocalEnd()

    @property
    def running(self) -> bool:
        """Recorded running, by a launcher that still lives (else vmrun died under it)."""
        return self.end.status == "running" and _alive(self.end.pid)

    @property
    def state(self) -> RunState:
        if self.running:
            return RunState.RUNNING
        if self.end.status == "running":
            return RunState.LOST  # its vmrun was killed hard: no end was recorded
        return _STATES.get(self.end.status, RunState.LOST)

    @property
    def exit_code(self) -> int | None:
        return None if self.running else self.end.exit_code

    @property
    def started(self) -> float:
        return _seconds(self.end.start_time) or 0.0

    @property
    def ended(self) -> float | None:
        return _seconds(self.end.end_time)

    @property
    def duration(self) -> float | None:
        import time

        end = time.time() if self.running else self.ended
        return None if end is None or not self.started else max(0.0, end - self.started)

    @property
    def ran_s(self) -> float | None:
        return self.duration  # one attempt: a run here is not brought back

    @property
    def progress(self) -> str | None:
        return None

    @property
    def attempts(self) -> int:
        return 1

    @property
    def reason(self) -> str:
        return self.end.error or ""

    @property
    def failure(self) -> WorkerFailure | None:
        return None

    @property
    def versions(self) -> dict[str, Any] | None:
        return None

    @property
    def store(self) -> None:
        return None

    @property
    def recoveries(self) -> int:
        return 0

    @property
    def recovery(self) -> str:
        return ""

    @property
    def gave_up(self) -> bool:
        return False

    @property
    def recovering(self) -> str:
        return ""

    # no watchers here: RunRow's watchers' fields are empty (the rest: Unwatched)
    @property
    def stopped_by(self) -> str:
        return ""

    @property
    def hung(self) -> None:
        return None

    @property
    def budget(self) -> None:
        return None

    @property
    def slow_ranks(self) -> tuple[()]:
        return ()

    @property
    def tasks(self) -> tuple[()]:
        return ()


def local_runs(project: Path) -> list[LocalRun]:
    """Every run recorded under the project's results/, oldest first (a folder whose
    run.json is not a run's on this machine is someone else's: a fetched one)."""
    import json

    found = []
    for path in (project / "results").glob("*/run.json"):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        record = RunRecord.from_json(raw)
        if record.where == LOCAL and record.local is not None:
            found.append(LocalRun(path.parent.name, record))
    return sorted(found, key=lambda r: (r.started, r.id))


def launcher_parent(pid: int) -> int | None:
    """The vmrun that launched the run's process (its parent): stopping it stops the run
    as Ctrl-C in its terminal would, the whole tree, its end recorded."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            parent = int(line.split()[1])
            return parent if parent > 1 and parent != os.getpid() else None
    return None
