"""A cluster's vmrun runs, as one round trip (vmrun/hostside/slurm_runs.sh) lists them: the
user's jobs in squeue, each run's files on the shared filesystem, sacct where accounting
exists. A run's state comes from squeue while the job is there, then from sacct, then from
the run's own exit record (finished jobs leave squeue after MinJobAge)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vmrun.backends.slurm.queue import JobState
from vmrun.runs.state import RunState

_SECTION = re.compile(r"^==> (.*) <==$")


@dataclass(frozen=True)
class QueueEntry:
    job: str
    state: JobState
    start: str = ""
    elapsed: str = ""
    nodes: str = ""


@dataclass
class SlurmRun:
    """One run on a cluster, with the attributes `vmrun status` shows for any run."""

    id: str
    host: str  # the cluster's name
    meta: Mapping[str, Any]
    job_id: str = ""
    job: JobState | None = None  # squeue's view while the job is listed
    exits: list[list[str]] = field(default_factory=list)  # [attempt, code|requeue|..., time]
    starts: list[list[str]] = field(default_factory=list)  # [attempt, time]
    stopped: bool = False
    accounted: tuple[str, str] | None = None  # sacct's (State, ExitCode)
    last_metrics: Mapping[str, Any] | None = None

    @property
    def attempts(self) -> int:
        return len(self.starts)

    @property
    def started(self) -> float:
        if self.starts:
            return float(self.starts[0][1])
        return float(self.meta.get("submitted") or 0)

    @property
    def ended(self) -> float | None:
        return float(self.exits[-1][2]) if self.exits and len(self.exits[-1]) > 2 else None

    @property
    def duration(self) -> float | None:
        if not self.starts:
            return None
        if self.state in (RunState.RUNNING, RunState.PENDING):
            return time.time() - self.started
        end = self.ended
        return None if end is None else end - self.started

    @property
    def state(self) -> RunState:
        return self.state_and_code()[0]

    @property
    def exit_code(self) -> int | None:
        return self.state_and_code()[1]

    def state_and_code(self) -> tuple[RunState, int | None]:
        code = self._recorded_code()
        if self.job is not None:
            state = self.job.run_state
            return state, code if state in (RunState.DONE, RunState.FAILED) else None
        if self.accounted is not None:
            state = JobState(self.accounted[0]).run_state
            if state not in (RunState.PENDING, RunState.RUNNING):
                sacct_code = self.accounted[1].split(":")[0]
                return state, code if code is not None else _int(sacct_code)
        if code is not None:
            return (RunState.DONE if code == 0 else RunState.FAILED), code
        if self.stopped:
            return RunState.STOPPED, None
        if self.exits and self.exits[-1][1] == "terminated":
            return RunState.FAILED, None  # killed at its time limit, or cancelled by hand
        return RunState.LOST, None

    def _recorded_code(self) -> int | None:
        return _int(self.exits[-1][1]) if self.exits else None

    @property
    def reason(self) -> str:
        return self.job.reason if self.job and self.job.state == "PENDING" else ""

    @property
    def progress(self) -> str | None:
        epochs = self.meta.get("epochs")
        done = self.last_metrics.get("epoch") if self.last_metrics else None
        if done is None:
            return None
        return f"epoch {done}/{epochs}" if epochs else f"epoch {done}"


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_listing(text: str, cluster: str) -> list[SlurmRun]:
    """slurm_runs.sh's output as runs, oldest first."""
    sections = _sections(text)
    queue = _queue(sections.pop("squeue", []))
    accounted = _accounted(sections.pop("sacct", []))
    runs = _runs(sections, cluster)
    for path, lines in sections.items():
        run = runs.get(path.partition("/")[0]) or _by_metrics(runs, path)
        if run is not None:
            _read_file(run, path, lines)
    for run in runs.values():
        if run.job_id:
            entry = queue.get(run.job_id)
            run.job = entry.state if entry else None
            run.accounted = accounted.get(run.job_id)
    return sorted(runs.values(), key=lambda r: (float(r.meta.get("submitted") or 0), r.id))


def _sections(text: str) -> dict[str, list[str]]:
    """slurm_runs.sh's `==> NAME <==` sections: the non-blank lines under each header."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = _SECTION.match(line)
        if header:
            current = sections.setdefault(header.group(1), [])
        elif current is not None and line.strip():
            current.append(line)
    return sections


def _queue(lines: list[str]) -> dict[str, QueueEntry]:
    """squeue's `JOBID|STATE|REASON|START|ELAPSED|NODES` lines, by job id."""
    queue = {}
    for line in lines:
        parts = line.split("|")
        if len(parts) >= 6:
            state = JobState.parse(f"{parts[1]}|{parts[2]}")
            if state is not None:
                queue[parts[0].strip()] = QueueEntry(parts[0].strip(), state, *parts[3:6])
    return queue


def _accounted(lines: list[str]) -> dict[str, tuple[str, str]]:
    """sacct's `JOBID|STATE|EXITCODE` lines: (State, ExitCode) by job id."""
    accounted = {}
    for line in lines:
        parts = line.split("|")
        if len(parts) >= 3:
            accounted[parts[0]] = (parts[1].split()[0].upper(), parts[2])
    return accounted


def _runs(sections: Mapping[str, list[str]], cluster: str) -> dict[str, SlurmRun]:
    """A run for each readable `<id>/run.json`."""
    runs: dict[str, SlurmRun] = {}
    for path, lines in sections.items():
        rid, _, name = path.partition("/")
        if name == "run.json":
            try:
                meta = json.loads("\n".join(lines))
            except ValueError:
                continue
            runs[rid] = SlurmRun(id=rid, host=cluster, meta=meta)
    return runs


def _read_file(run: SlurmRun, path: str, lines: list[str]) -> None:
    """One of the run's files (or its metrics file, wherever it is) into the run."""
    name = path.partition("/")[2]
    if name == "jobid" and lines:
        run.job_id = lines[0].strip()
    elif name == "starts":
        run.starts = [line.split() for line in lines]
    elif name == "exit":
        run.exits = [line.split() for line in lines]
    elif name == "stopped":
        run.stopped = True
    elif run.meta.get("metrics") == path and lines:
        with contextlib.suppress(ValueError):
            run.last_metrics = json.loads(lines[-1])


def _by_metrics(runs: Mapping[str, SlurmRun], path: str) -> SlurmRun | None:
    return next((r for r in runs.values() if r.meta.get("metrics") == path), None)
