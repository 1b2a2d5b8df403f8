"""Runs on a host: started detached, recorded in ~/.vmrun/runs/<id>/, followed, stopped.

A run is started with `setsid` so it outlives the SSH connection. Its record directory holds
run.json (what, where, when), pid, log (everything it printed; log.times: when each line was
written, hostside/run_agent.py), exit_code (written when it ends), first_started (the host's
clock when the first attempt began: files in the work directory newer than that are the
run's outputs), attempt and log_start (which attempt this is, and where its lines begin in
the log), and out_dir (where progress is read from). Every
process of a run carries VMRUN_RUN_ID in its environment, inherited by torchrun's workers
even though torchrun puts each worker in a session of its own; that is how `stop` finds and
kills all of them, and proves none is left. The scripts that do this on the host are
vmrun/hostside/run_*.sh.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmrun import hostside
from vmrun.errors import CommandFailed, ExitCode, HostsFailed, RemoteError, UsageError
from vmrun.remote_paths import RUNS_DIR, run_dir
from vmrun.reporting import Recorder, Reporter
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord as RecordOfRun
from vmrun.results.stragglers import Slow
from vmrun.runs import provenance
from vmrun.runs.launch_spec import LaunchSpec, Watchers
from vmrun.runs.outputs import check_run_id
from vmrun.runs.state import RunState
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.stores.sync import StoreState

_PROGRESS = re.compile(r"\bepoch[ :=]+(\d+)(?:\s*/\s*(\d+))?", re.IGNORECASE)
_EPOCH = re.compile(r"\bepoch\s*[:=]?\s*(\d+)", re.IGNORECASE)


@dataclass
class RunRecord:
    id: str
    host: str
    record: RecordOfRun = field(default_factory=lambda: RecordOfRun.from_json({}))  # run.json
    exit_code: int | None = None
    ended: float | None = None
    stopped: bool = False
    stopped_by: str = ""  # run_stop.sh's WHY: user, budget, or vmrun's own (failure, ...)
    alive: bool = False
    progress: str = ""  # what this attempt reported: "epoch 7/10", or ""
    saved_epoch: int | None = None  # the epoch of the newest snapshot the log reports
    attempt: int = 1
    first_started: float | None = None  # host clock, first attempt
    began: float | None = None  # host clock, this attempt
    host_now: float | None = None  # host clock when listed
    versions: dict[str, Any] | None = None  # versions.json (hostside/run_provenance.py)
    failure: WorkerFailure | None = None  # failure.json: torchrun's first failed worker
    store: StoreState | None = None  # store.json: the copy to the run's bucket (--store)
    recoveries: int = 0  # what its supervisor did (--recover): how many times,
    recovery: str = ""  # and the last: "recovery 1 of 5: ..." or "... gave up: ..."
    gave_up: bool = False
    recovering: str = ""  # its supervisor is bringing it back: "1 of 5: lost h2: ..."
    notice: dict[str, Any] | None = None  # a cloud said the node goes (spot_watch.py)
    requeued: int | None = None  # stopped after this epoch's snapshot, to go on elsewhere
    slow: str = ""  # the slow ranks of its last epoch (vmrun.results.stragglers), if any
    slow_ranks: tuple[Slow, ...] = ()  # ... each of them, for `status --json`
    hung: dict[str, Any] | None = None  # its hang watcher found it stuck (REC/hang)
    budget: dict[str, Any] | None = None  # it reached its --max-cost (REC/budget: seen, cap)

    @property
    def running(self) -> bool:
        """Its agent lives and has recorded no end. Once exit_code is written the run has
        ended, though the agent may still be telling it (notify_send.py): every reader
        takes the recorded code then, never the agent's liveness."""
        return self.alive and self.exit_code is None

    @property
    def meant_to_end(self) -> bool:
        """Stopped to end: by the user (`vmrun stop`) or at its --max-cost; not a stop
        vmrun made itself because a node failed (the run is then brought back, with
        --recover). A stop recorded without its reason (an older vmrun's) counts as meant."""
        return self.stopped and self.stopped_by in ("", "user", "budget")

    @property
    def state(self) -> RunState:
        if self.running:
            return RunState.RUNNING
        if self.stopped:
            return RunState.STOPPED
        if self.exit_code is None:
            return RunState.LOST  # killed hard, or the host rebooted
        return RunState.DONE if self.exit_code == 0 else RunState.FAILED

    @property
    def started(self) -> float:
        return self.record.started or 0.0

    @property
    def attempts(self) -> int:
        return self.attempt

    @property
    def reason(self) -> str:
        return ""  # a host runs a run at once: nothing to wait for

    @property
    def tasks(self) -> tuple[()]:
        return ()  # an array job's tasks: only a cluster's

    @property
    def duration(self) -> float | None:
        """This attempt's run time, by the host's clock alone when it told (no skew)."""
        if self.began is not None:
            end = self.host_now if self.running else self.ended
            return None if end is None else max(0.0, end - self.began)
        end = self.ended if not self.running else time.time()
        return None if end is None or not self.started else max(0.0, end - self.started)

    @property
    def ran_s(self) -> float | None:
        """The run's time on this node over its attempts: the earlier ones' (run.json's
        ran_before_s, written as this one started) and this one's. What it costs: the time
        between attempts (a recovery's downtime) is told apart, never charged twice."""
        now = self.duration
        return None if now is None else self.record.ran_before_s + now

    def total_epochs(self) -> str:
        """The template's epoch count (its first argument), for `epoch N/TOTAL`."""
        args = self.record.launch.args or ()
        if self.record.launch.template and args and args[0].isdigit():
            return args[0]
        return ""


@dataclass(frozen=True)
class StopResult:
    host: str
    run_id: str
    signalled: tuple[int, ...]
    killed: tuple[int, ...]
    left: tuple[int, ...]


def record_dir(run_id: str) -> str:
    return run_dir(check_run_id(run_id))


@dataclass(frozen=True)
class Started:
    pid: int  # the run's agent (hostside/run_agent.py): the run is alive while it lives
    log_lines: int  # lines the log already had (earlier attempts of a resumed run)


def start(
    conn: Connection,
    run_id: str,
    workdir: str,
    argv: Sequence[str],
    record: RecordOfRun,
    env: Mapping[str, str] | None = None,
    *,
    resume: bool = False,
    banner: str = "",
    alone: bool = False,
    watchers: Watchers | None = None,
) -> Started:
    """Start argv detached in workdir with `env` and `watchers` beside it (one launch spec,
    vmrun.runs.launch_spec, over stdin). `resume`: another attempt of an existing run, whose
    log goes on after `banner` (the record keeps the first attempt's start time). `alone`:
    refuse if another run is alive there, checked again under the host's start lock (the
    preflight's check is an earlier round trip: two starts at once would both pass it)."""
    now = time.time()
    spec = LaunchSpec(
        rec=record_dir(run_id),
        workdir=workdir,
        run_id=run_id,
        argv=tuple(argv),
        meta=json.dumps(replace(record, run_id=run_id, started=now).to_json(), sort_keys=True),
        env=dict(env or {}),
        mode="resume" if resume else "new",
        banner=banner,
        out=record.launch.out_dir or workdir,
        alone=alone,
        watchers=watchers or Watchers(),
    )
    result = conn.run(
        hostside.command("run_start.sh"), env=spec.header(), what=f"the start of run {run_id}"
    )
    said = result.stdout_tail.strip().splitlines()
    if result.exit_status == 3 and said and said[-1].startswith("BUSY "):
        raise busy_error(conn.label, said[-1][5:])
    if not result.ok:
        raise RemoteError(
            f"could not start run {run_id}: {result.output_tail(3)}",
            host=conn.label,
            code="run-start-failed",
        )
    try:
        lines, pid = result.stdout_tail.strip().splitlines()[-2:]
        return Started(int(pid), int(lines))
    except ValueError:
        raise RemoteError(
            f"run {run_id} did not report its pid", host=conn.label, code="run-start-failed"
        ) from None


def busy_error(host: str, other: str) -> UsageError:
    """A host already running `other`: the preflight's refusal, and the start's."""
    return UsageError(
        f"this host is already running {other}; two runs would share its GPUs",
        host=host,
        hint=f"wait, `vmrun stop {other}`, or pass --allow-concurrent",
        code="host-busy",
    )


def list_runs(conn: Connection, run_ids: Sequence[str] = ()) -> list[RunRecord]:
    """Every run recorded on the host (or just these), oldest first, in one round trip."""
    from vmrun.transfer.streams import capture  # all of the output: a tail would drop old runs

    ids = [check_run_id(r) for r in run_ids]
    argv = [*hostside.command("run_list.sh"), RUNS_DIR, *ids]
    command = quoting.plain_command(argv, activity=False)  # looking: no autostop activity
    status, out, err = capture(conn, command, what="the run listing")
    if status != 0:
        raise RemoteError(f"listing the runs failed: {err.strip()[-300:]}", host=conn.label)
    return parse_listing(out.decode("utf-8", "replace"), conn.label)


def parse_listing(text: str, host: str) -> list[RunRecord]:
    """run_list.sh's `KEY value` lines as records, oldest first."""
    records: list[RunRecord] = []
    now: float | None = None
    for line in text.split("\n"):  # lines of a log hold \x1e
        key, _, value = line.partition(" ")
        if key == "NOW":
            now = _number(value)
        elif key == "RUN":
            records.append(RunRecord(value, host, host_now=now))
        elif records:
            _read_field(records[-1], key, value)
    for record in records:
        if record.progress.startswith("epoch ") and "/" not in record.progress:
            total = record.total_epochs()
            record.progress += f"/{total}" if total else ""
    records.sort(key=lambda r: (r.started, r.id))
    return records


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _read_field(record: RunRecord, key: str, value: str) -> None:
    """One `KEY value` line of run_list.sh's listing into the record; other keys are skipped."""
    reader = _FIELDS.get(key)
    if reader is not None:
        reader(record, value)


def _read_meta(record: RunRecord, value: str) -> None:
    try:
        record.record = RecordOfRun.from_json(json.loads(base64.b64decode(value)))
    except ValueError:
        record.record = RecordOfRun.from_json({})


def _read_stopped(record: RunRecord, value: str) -> None:
    when, _, why = value.partition(" ")
    record.stopped = True
    record.stopped_by = why.strip()
    record.ended = record.ended or float(when)


def _read_metrics(record: RunRecord, value: str) -> None:
    """This attempt's metrics.jsonl: its last epoch wins over the log; its slow ranks."""
    from vmrun.results.stragglers import from_metrics, summary

    try:
        line = json.loads(value)
    except ValueError:
        return
    if not isinstance(line, dict):
        return
    if isinstance(line.get("epoch"), int):
        record.progress = f"epoch {line['epoch']}"
    record.slow_ranks = tuple(from_metrics(line))
    record.slow = summary(record.slow_ranks)


def _read_hang(record: RunRecord, value: str) -> None:
    try:
        seen = json.loads(value)
    except ValueError:
        return
    record.hung = seen if isinstance(seen, dict) else None


def _read_saved(record: RunRecord, value: str) -> None:
    match = _EPOCH.search(value)
    record.saved_epoch = int(match.group(1)) if match else None


def _read_progress(record: RunRecord, value: str) -> None:
    """The log's last `epoch N[/M]`, unless METRICS (listed before it) already told."""
    match = None if record.progress else _PROGRESS.search(value)
    if match:
        total = f"/{match.group(2)}" if match.group(2) else ""
        record.progress = f"epoch {match.group(1)}{total}"


def _read_recoveries(record: RunRecord, value: str) -> None:
    count, _, last = value.partition(" ")
    kind, _, text = [*last.split("\t"), "", ""][:3]
    record.recoveries = int(count) if count.isdigit() else 0
    record.recovery = text
    record.gave_up = kind == "gave-up"


def _read_json(name: str) -> Callable[[RunRecord, str], None]:
    def read(record: RunRecord, value: str) -> None:
        try:
            raw = json.loads(value)
        except ValueError:
            return
        if isinstance(raw, dict):
            setattr(record, name, raw)

    return read


def _read_requeue(record: RunRecord, value: str) -> None:
    try:
        epoch = json.loads(value).get("epoch")
    except (ValueError, AttributeError):
        return
    record.requeued = epoch if isinstance(epoch, int) else None


def _set(name: str, parse: Callable[[str], Any]) -> Callable[[RunRecord, str], None]:
    return lambda record, value: setattr(record, name, parse(value))


_FIELDS: dict[str, Callable[[RunRecord, str], None]] = {
    "FIRST": _set("first_started", _number),
    "BEGAN": _set("began", _number),
    "ATTEMPT": _set("attempt", lambda v: int(v) if v.strip().isdigit() else 1),
    "META": _read_meta,
    "EXIT": _set("exit_code", lambda v: int(v) if v.strip().lstrip("-").isdigit() else None),
    "ENDED": _set("ended", float),
    "STOPPED": _read_stopped,
    "ALIVE": _set("alive", lambda v: v.strip() == "1"),
    "METRICS": _read_metrics,
    "VERSIONS": _set("versions", provenance.versions_of),
    "FAILURE": _set("failure", WorkerFailure.parse),
    "STORE": _set("store", StoreState.parse),
    "RECOVERIES": _read_recoveries,
    "RECOVERING": _set("recovering", str.strip),
    "NOTICE": _read_json("notice"),
    "REQUEUE": _read_requeue,
    "SAVED": _read_saved,
    "PROGRESS": _read_progress,
    "HANG": _read_hang,
    "BUDGET": _read_json("budget"),
}


def _log(
    conn: Connection,
    run_id: str,
    out: Reporter,
    start: str,
    follow: bool,
    times: bool = False,
) -> None:
    result = conn.run(
        [
            *hostside.command("run_log.sh"),
            RUNS_DIR,
            check_run_id(run_id),
            start,
            "1" if follow else "0",
            "1" if times else "0",
        ],
        on_output=lambda stream, data: out.output(data) if stream == "out" else None,
        what=f"the log of run {run_id}",
        activity=False,  # reading a log is looking: the run itself keeps the host up
    )
    if result.exit_status == 3:
        raise UsageError(f"no run {run_id} on this host", host=conn.label, code="run-not-found")


def follow(
    conn: Connection,
    run_id: str,
    out: Reporter,
    *,
    last: int = 0,
    skip: int = 0,
) -> None:
    """Stream the run's log (from the start, its last N lines, or after its first `skip`
    lines) to `out.output` until the run ends: bytes as they come, lines not yet whole (a
    Prefixer makes them whole)."""
    _log(conn, run_id, out, f"+{skip + 1}" if skip else str(last), follow=True)


def read_log(conn: Connection, run_id: str, out: Reporter, *, last: int = 0) -> None:
    """The run's log as it is now (all of it, or its last N lines), to `out.output`."""
    _log(conn, run_id, out, str(last), follow=False)


def log_times(conn: Connection, run_id: str) -> list[tuple[int, float]]:
    """When the log's lines were written: (lines the log held, the host's clock) marks, in
    order (hostside/run_marks.py); [] for a run that has none (an older vmrun's)."""
    got = Recorder()
    _log(conn, run_id, got, "0", follow=False, times=True)
    marks = []
    for line in got.data.decode("ascii", "replace").splitlines():
        count, _, when = line.partition(" ")
        if count.isdigit() and _number(when) is not None:
            marks.append((int(count), float(when)))
    return marks


def line_times(marks: Sequence[tuple[int, float]], lines: int) -> list[float]:
    """When each of the first `lines` lines was written: the first mark that counts it;
    lines after the last mark (or every line, without marks) sort last."""
    times, at = [], 0
    for number in range(1, lines + 1):
        while at < len(marks) and marks[at][0] < number:
            at += 1
        times.append(marks[at][1] if at < len(marks) else float("inf"))
    return times


STOP_KILL_S = 5.0  # run_stop.sh's KILL loop, after the grace
STOP_MARGIN_S = 20.0  # the process table read three times on a loaded host, the round trip


def stop_deadline(grace: float) -> float:
    """How long a stop may take, all told, before its host counts as not confirming it."""
    return grace + STOP_KILL_S + STOP_MARGIN_S


STOP_REASONS = ("user", "failure", "start", "resume", "replaced")


def stop(conn: Connection, run_id: str, *, grace: float = 10.0, why: str = "user") -> StopResult:
    """TERM every process of the run, KILL what is left after the grace (wall-clock), and
    verify none is left; within `stop_deadline(grace)`, as the Slurm stop has one, else
    CommandFailed (exit 124) naming the host. `why` is recorded (STOP_REASONS): only the
    user's stop means the run is to end; the others are vmrun's own, after a failure."""
    assert why in STOP_REASONS, why
    centis = str(max(10, round(grace * 100)))
    deadline = stop_deadline(grace)
    argv = [*hostside.command("run_stop.sh"), RUNS_DIR, check_run_id(run_id)]
    try:
        result = conn.run([*argv, centis, why], timeout=deadline, what=f"the stop of run {run_id}")
    except CommandFailed as exc:
        if exc.exit_status != ExitCode.TIMEOUT:
            raise
        raise CommandFailed(
            f"stopping run {run_id} was not confirmed within {deadline:g} s",
            host=conn.label,
            exit_status=ExitCode.TIMEOUT,
            hint=f"its processes may still run: `vmrun stop {run_id}` again once the host answers",
            code="stop-unconfirmed",
        ) from None
    if result.exit_status == 3:
        raise UsageError(f"no run {run_id} on this host", host=conn.label, code="run-not-found")
    if not result.ok:
        raise RemoteError(
            f"stopping {run_id} failed: {result.output_tail(3)}",
            host=conn.label,
            code="stop-failed",
        )
    fields: dict[str, tuple[int, ...]] = {"TERM": (), "KILL": (), "LEFT": ()}
    for line in result.stdout_tail.splitlines():
        key, _, value = line.partition(" ")
        if key in fields:
            fields[key] = tuple(int(p) for p in value.split() if p.isdigit())
    outcome = StopResult(conn.label, run_id, fields["TERM"], fields["KILL"], fields["LEFT"])
    if outcome.left:
        raise RemoteError(
            f"processes {', '.join(map(str, outcome.left))} of run {run_id} survived SIGKILL",
            host=conn.label,
            hint="they may be stuck in the kernel (a hung GPU); check the host",
            code="stop-failed",
        )
    return outcome


def find_run(
    group: Any, run_id: str | None, *, running_only: bool = False
) -> tuple[str, list[tuple[Any, RunRecord]], dict[str, BaseException]]:
    """Which hosts of the group have the run (default: the newest, or newest running, run).

    Returns the run id, (entry, record) for each host that has it, in host order, and the
    error of each node the run's record names that did not answer: a command about the run
    does what it can and says what it could not, never passing them over in silence.
    """
    outcomes = group.map(lambda entry, conn: list_runs(conn, [run_id] if run_id else []))
    by_host = {o.host: o.value or [] for o in outcomes if o.ok}
    failures = {o.host: o.error for o in outcomes if not o.ok}
    if run_id is None:
        candidates = [
            r
            for recs in by_host.values()
            for r in recs
            if r.state == RunState.RUNNING or not running_only
        ]
        if not candidates:
            if failures:
                raise HostsFailed(failures, total=len(outcomes))
            what = "running run" if running_only else "run"
            raise UsageError(
                f"no {what} recorded on {', '.join(by_host) or 'these hosts'}", code="run-not-found"
            )
        run_id = max(candidates, key=lambda r: (r.started, r.id)).id
    found = [
        (entry, rec)
        for entry in group.entries
        for rec in by_host.get(entry.label, [])
        if rec.id == run_id
    ]
    if not found:
        if failures:
            raise HostsFailed(failures, total=len(outcomes))
        raise UsageError(
            f"no run {run_id} on {', '.join(by_host)}",
            hint="`vmrun status` lists the runs",
            code="run-not-found",
        )
    recorded = {n for _, run in found for n in run.record.hosts}
    return run_id, found, {h: e for h, e in failures.items() if h in recorded}
