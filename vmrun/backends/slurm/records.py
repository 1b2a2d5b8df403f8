"""A cluster's vmrun runs, as one round trip (vmrun/hostside/slurm_runs.sh) lists them: the
user's jobs in squeue, each run's files on the shared filesystem, sacct where accounting
exists. A run's state comes from squeue while the job is there, then from sacct, then from
the run's own exit record (finished jobs leave squeue after MinJobAge)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vmrun.backends.slurm.queue import JobState
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord
from vmrun.results.stragglers import Slow, from_metrics, summary
from vmrun.runs import provenance
from vmrun.runs.state import RunState
from vmrun.runs.unwatched import Unwatched

if TYPE_CHECKING:
    from vmrun.notify.send import Charge

_SECTION = re.compile(r"^==> (.*) <==$")


@dataclass(frozen=True)
class QueueEntry:
    job: str  # squeue's JobArrayID: the job's id, `ID_INDEX` for a task of an array
    state: JobState
    start: str = ""
    elapsed: str = ""
    nodes: str = ""
    array_job: str = ""  # the array's id (the job's own outside an array)
    task: str = ""  # the array index ("" outside an array)
    wait_status: str = ""  # squeue's exit_code: the batch script's wait status


@dataclass(frozen=True)
class Task:
    """One task of a job from the user's own batch script (the job itself outside an
    array): as squeue lists it, else as the run's `ended` record keeps it."""

    key: str  # the array index; "-" outside an array
    state: RunState
    exit_code: int | None
    reason: str = ""
    elapsed: float | None = None
    nodes: str = ""
    record: str = ""  # squeue's view as an `ended` line, less its time: KEY STATE EXIT

    @classmethod
    def listed(cls, entry: QueueEntry) -> Task:
        state = entry.state.run_state
        code = exit_code(entry.wait_status) if state in (RunState.DONE, RunState.FAILED) else None
        reason = entry.state.reason if entry.state.state == "PENDING" else ""
        key = entry.task or "-"
        record = f"{key} {entry.state.state.split()[0]} {entry.wait_status or '-'}"
        return cls(key, state, code, reason, seconds(entry.elapsed), entry.nodes, record)

    @classmethod
    def recorded(cls, words: list[str]) -> Task | None:
        """An `ended` line: KEY STATE EXIT TIME ELAPSED (`-`: not known)."""
        if len(words) < 3:
            return None
        state = JobState(words[1]).run_state if words[1] != "ENDED" else RunState.LOST
        code = exit_code(words[2])
        if state is RunState.DONE and code:
            state = RunState.FAILED
        return cls(words[0], state, code, elapsed=seconds(words[4]) if len(words) > 4 else None)


def _clock(elapsed: float | None) -> str:
    if elapsed is None:
        return "-"
    minutes, secs = divmod(int(elapsed), 60)
    return f"{minutes}:{secs:02d}"


def exit_code(wait_status: str) -> int | None:
    """A wait status (squeue's exit_code: 256 is exit 1) as a shell's exit code."""
    status = _int(wait_status.strip())
    if status is None:
        return None
    return 128 + (status & 0x7F) if status & 0x7F else status >> 8


def seconds(elapsed: str) -> float | None:
    """squeue's times (`M:SS`, `H:MM:SS`, `D-HH:MM:SS`) in seconds."""
    days, _, clock = elapsed.strip().rpartition("-")
    parts = clock.split(":")
    if (
        not all(p.isdigit() for p in parts)
        or not 1 <= len(parts) <= 3
        or (days and not days.isdigit())
    ):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return total + int(days or 0) * 86400


@dataclass
class SlurmRun(Unwatched):
    """One run on a cluster, with the attributes `vmrun status` shows for any run."""

    id: str
    host: str  # the cluster's name
    record: RunRecord  # its run.json
    job_id: str = ""
    job: JobState | None = None  # squeue's view while the job is listed
    exits: list[list[str]] = field(default_factory=list)  # [attempt, code|requeue|..., time]
    starts: list[list[str]] = field(default_factory=list)  # [attempt, time]
    stopped: bool = False
    budget: dict[str, Any] | None = None  # the job stopped itself at --max-cost (REC/budget)
    hung: dict[str, Any] | None = None  # its hang watcher found it stuck (REC/hang)
    accounted: tuple[str, str] | None = None  # sacct's (State, ExitCode)
    last_metrics: Mapping[str, Any] | None = None
    pointed: bool = False  # its record names its metrics file (metrics.path)
    # a job from the user's own batch script (`vmrun submit`): its tasks, when squeue or
    # the run's `ended` record knows them; `since` the cluster's clock at submission
    tasks: list[Task] = field(default_factory=list)
    since: float | None = None
    ends_recorded: bool = False
    versions: Mapping[str, Any] | None = None  # versions.json (hostside/run_provenance.py)
    files_on: str = ""  # the node its files are on (a cluster without a shared folder)
    failure: WorkerFailure | None = None  # failure.json: torchrun's first failed worker
    store: None = None  # a cluster's runs are not copied to a bucket (`train --store`: hosts)
    # --recover: the job's own recoveries (slurm_recover.bash's `recoveries`), the last
    # one's text, and whether it gave up
    recoveries: int = 0
    recovery: str = ""
    gave_up: bool = False
    recovering: str = ""  # the job requeues itself: never a recovery under way to tell apart

    def ends_to_record(self) -> list[str]:
        """`ended` lines for a job that squeue shows ended and the run's record does not
        keep yet (nobody followed it): squeue forgets it MinJobAge later."""
        if not self.own_script or self.ends_recorded or not self.tasks:
            return []
        if any(t.state in (RunState.PENDING, RunState.RUNNING) or not t.record for t in self.tasks):
            return []
        now = int(time.time())
        return [f"{t.record} {now} {_clock(t.elapsed)}" for t in self.tasks]

    @property
    def own_script(self) -> bool:
        return bool(self.record.job and self.record.job.batch_script)

    @property
    def submitted(self) -> float:
        """This machine's clock when it was submitted (0: not recorded)."""
        return (self.record.job.submitted if self.record.job else None) or 0.0

    @property
    def metrics(self) -> str:
        """Its metrics file, as run.json names it ("" for none)."""
        return self.record.job.metrics if self.record.job else ""

    @property
    def attempts(self) -> int:
        return max(1, len(self.starts)) if self.own_script else len(self.starts)

    @property
    def started(self) -> float:
        if self.own_script and self.since is not None:
            return self.since
        if self.starts:
            return float(self.starts[0][1])
        return self.submitted

    @property
    def ended(self) -> float | None:
        return float(self.exits[-1][2]) if self.exits and len(self.exits[-1]) > 2 else None

    @property
    def ran_s(self) -> float | None:
        return self.duration  # from the job's first start: its requeues are one job

    @property
    def duration(self) -> float | None:
        if self.own_script:
            times = [t.elapsed for t in self.tasks if t.elapsed is not None]
            return max(times) if times else None
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
        if self.own_script and self.tasks:
            return _combined(self.tasks, self.stopped)
        if self.exits and self.exits[-1][1] == "budget" and self._ended_this_attempt():
            return RunState.STOPPED, None  # at its --max-cost, its work saved
        code = self._recorded_code()
        if self.job is not None:
            state = self.job.run_state
            if state is RunState.RUNNING and code is not None and self._ended_this_attempt():
                # the batch shell recorded the end and is still telling it (or leaving)
                return (RunState.DONE if code == 0 else RunState.FAILED), code
            return state, code if state in (RunState.DONE, RunState.FAILED) else None
        if self.accounted is not None:
            state = JobState(self.accounted[0]).run_state
            if state not in (RunState.PENDING, RunState.RUNNING):
                if code is None and state is RunState.STOPPED:
                    return state, None  # sacct's 0:15 is a signal, not an exit code
                sacct_code = self.accounted[1].split(":")[0]
                return state, code if code is not None else _int(sacct_code)
        if code is not None:
            return (RunState.DONE if code == 0 else RunState.FAILED), code
        if self.stopped:
            return RunState.STOPPED, None
        if self.exits and self.exits[-1][1] == "terminated":
            return RunState.FAILED, None  # killed at its time limit, or cancelled by hand
        return RunState.LOST, None

    def _ended_this_attempt(self) -> bool:
        """The last `exit` line is of the last attempt that started (not a requeued one's)."""
        return bool(self.exits and self.starts) and self.exits[-1][0] == self.starts[-1][0]

    def _recorded_code(self) -> int | None:
        if self.own_script:
            return None
        return _int(self.exits[-1][1]) if self.exits else None

    @property
    def reason(self) -> str:
        if self.own_script:
            reasons = sorted({t.reason for t in self.tasks if t.reason})
            return ", ".join(reasons)
        return self.job.reason if self.job and self.job.state == "PENDING" else ""

    @property
    def progress(self) -> str | None:
        if self.own_script:  # no epochs to tell: where it runs (or ran)
            nodes = list(dict.fromkeys(t.nodes for t in self.tasks if t.nodes))
            return f"on {','.join(nodes)}" if nodes else None
        epochs = self.record.job.epochs if self.record.job else None
        done = self.last_metrics.get("epoch") if self.last_metrics else None
        if done is None:
            return None
        return f"epoch {done}/{epochs}" if epochs else f"epoch {done}"

    @property
    def slow_ranks(self) -> tuple[Slow, ...]:
        """The slow ranks of its last epoch (metrics.jsonl's step times, as on hosts)."""
        return tuple(from_metrics(self.last_metrics)) if self.last_metrics else ()

    @property
    def slow(self) -> str:  # `status`' PROGRESS names them, as a host's run's
        return summary(self.slow_ranks)

    # what only a hosts' node records (RunRow's watchers' fields; the rest: Unwatched)
    @property
    def stopped_by(self) -> str:
        return ""


def _combined(tasks: list[Task], stopped: bool) -> tuple[RunState, int | None]:
    """A job's state from its tasks': running while any runs (pending while all wait),
    else the worst ending, with the first non-zero exit code; `vmrun stop` ends it stopped."""
    states = {t.state for t in tasks}
    if RunState.RUNNING in states:
        return RunState.RUNNING, None
    if RunState.PENDING in states:
        return RunState.PENDING, None
    codes = [t.exit_code for t in tasks if t.exit_code]
    if stopped and RunState.STOPPED in states:
        return RunState.STOPPED, None
    for state in (RunState.FAILED, RunState.LOST, RunState.STOPPED):
        if state in states:
            return state, codes[0] if codes else None
    return RunState.DONE, 0


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_listing(text: str, cluster: str) -> list[SlurmRun]:
    """slurm_runs.sh's output as runs, oldest first."""
    return _parse(_sections(text), cluster)


def parse_listings(listings: Sequence[tuple[str, str]], cluster: str) -> list[SlurmRun]:
    """Every node's listing of a cluster without a shared folder (the login node's first:
    its queue, and the job id only its record has) as one. Each run's files are taken from
    the node its job started on last (the newest `starts`), where its log and outputs are;
    what that node lacks, from the first node that has it; `files_on` names that node."""
    per_node = [(node, _sections(text)) for node, text in listings]
    merged: dict[str, list[str]] = {}
    for _, sections in reversed(per_node):  # the first node's wins where none is the live one
        merged.update(sections)
    live = _live_nodes(per_node)
    owner = _metrics_owners(merged)
    for node, sections in per_node:
        for path, lines in sections.items():
            rid = owner.get(path) or path.partition("/")[0]
            if live.get(rid) == node:
                merged[path] = lines
    runs = _parse(merged, cluster)
    for run in runs:
        run.files_on = live.get(run.id, "")
    return runs


def unpointed(runs: Sequence[SlurmRun]) -> list[str]:
    """`RUN METRICS` words for slurm_runs.sh: the runs whose record an older vmrun wrote
    without its metrics.path, each with the metrics file its run.json names."""
    return [word for r in runs if r.metrics and not r.pointed for word in (r.id, r.metrics)]


def _live_nodes(per_node: Sequence[tuple[str, Mapping[str, list[str]]]]) -> dict[str, str]:
    """Each run's node whose `starts` has the newest start (ties: the first such node)."""
    newest: dict[str, tuple[float, str]] = {}
    for node, sections in per_node:
        for path, lines in sections.items():
            rid, _, name = path.partition("/")
            words = lines[-1].split() if name == "starts" and lines else []
            when = _float(words[1]) if len(words) > 1 else None
            if when is not None and (rid not in newest or when > newest[rid][0]):
                newest[rid] = (when, node)
    return {rid: node for rid, (_, node) in newest.items()}


def _metrics_owners(sections: Mapping[str, list[str]]) -> dict[str, str]:
    """A run's metrics file (an absolute path its run.json names) -> the run's id."""
    owners = {}
    for path, lines in sections.items():
        rid, _, name = path.partition("/")
        if name == "run.json":
            with contextlib.suppress(ValueError):
                job = RunRecord.from_json(json.loads("\n".join(lines))).job
                if job is not None and job.metrics:
                    owners[job.metrics] = rid
    return owners


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _parse(sections: dict[str, list[str]], cluster: str) -> list[SlurmRun]:
    queue = _queue(sections.pop("squeue", []))
    accounted = _accounted(sections.pop("sacct", []))
    runs = _runs(sections, cluster)
    for path, lines in sections.items():
        run = runs.get(path.partition("/")[0]) or _by_metrics(runs, path)
        if run is not None:
            _read_file(run, path, lines)
    for run in runs.values():
        run.pointed = f"{run.id}/metrics.path" in sections
        if run.job_id:
            entry = queue.get(run.job_id)
            run.job = entry.state if entry else None
            run.accounted = accounted.get(run.job_id)
            listed = [e for e in queue.values() if e.array_job == run.job_id or e.job == run.job_id]
            if run.own_script and listed:
                run.tasks = sorted((Task.listed(e) for e in listed), key=_task_order)
    return sorted(runs.values(), key=lambda r: (r.submitted, r.id))


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
    """squeue's `JOBID|STATE|REASON|START|ELAPSED|NODES|ARRAYJOB|TASK|EXIT` lines (the last
    three where squeue has them), by job id (`ID_INDEX` for an array's task)."""
    queue = {}
    for line in lines:
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 6:
            state = JobState.parse(f"{parts[1]}|{parts[2]}")
            if state is not None:
                extra = [*parts[6:9], "", "", ""][:3]
                task = "" if extra[1] in ("N/A", "") else extra[1]
                queue[parts[0]] = QueueEntry(
                    parts[0],
                    state,
                    start=parts[3],
                    elapsed=parts[4],
                    nodes=parts[5],
                    array_job=extra[0] or parts[0],
                    task=task,
                    wait_status=extra[2],
                )
    return queue


def _task_order(task: Task) -> tuple[int, str]:
    return (int(task.key), "") if task.key.isdigit() else (1 << 62, task.key)


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
            runs[rid] = SlurmRun(id=rid, host=cluster, record=RunRecord.from_json(meta))
    return runs


_WATCHERS = {"budget": "budget", "hang": "hung"}  # a watcher's REC file: the run's field


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
    elif name in _WATCHERS and lines:  # what its budget or hang watcher saw
        setattr(run, _WATCHERS[name], _json_object(lines[0]))
    elif name == "versions.json" and lines:
        run.versions = provenance.versions_of(lines[0])
    elif name == "failure.json" and lines:
        run.failure = WorkerFailure.parse(lines[0])
    elif name == "recoveries":
        _read_recoveries(run, lines)
    elif name == "since" and lines:
        run.since = float(lines[0]) if _int(lines[0].split(".")[0]) is not None else None
    elif name == "ended":
        _read_ended(run, lines)
    elif run.metrics == path and lines:
        with contextlib.suppress(ValueError):
            run.last_metrics = json.loads(lines[-1])


def _read_recoveries(run: SlurmRun, lines: list[str]) -> None:
    kinds = [[*ln.split("\t"), "", "", ""][:3] for ln in lines]
    done = [text for kind, _, text in kinds if kind == "recovery"]
    run.recoveries, run.recovery = len(done), done[-1] if done else ""
    run.gave_up = any(kind == "gave-up" for kind, _, _ in kinds)


def _read_ended(run: SlurmRun, lines: list[str]) -> None:
    run.ends_recorded = True
    if not run.tasks:  # squeue's view, where it has one, is newer
        ended = {t.key: t for t in map(Task.recorded, (ln.split() for ln in lines)) if t}
        run.tasks = sorted(ended.values(), key=_task_order)


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _by_metrics(runs: Mapping[str, SlurmRun], path: str) -> SlurmRun | None:
    return next((r for r in runs.values() if r.metrics == path), None)


def charge(record: RunRecord) -> Charge:
    """What the job's sender counts in its messages: the run's prices (its time runs from
    the job's first start) and its outputs' folder (the last metrics)."""
    from vmrun.notify.send import Charge

    prices, out_dir = record.prices, record.launch.out_dir or ""
    if prices is None:
        return Charge(out_dir=out_dir)
    return Charge(prices.per_hour, prices.currency, out_dir=out_dir)
