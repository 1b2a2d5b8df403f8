"""Runs from the user's own batch script (`vmrun submit`): the script is submitted as it is,
from the synced project, and followed, read and fetched where Slurm puts its output: the
files its `--output`/`--error` patterns name (one per task of an array), expanded on the
login node as Slurm expands them (vmrun/hostside/_slurm_tasks.sh).

Its state is squeue's per task while the job is listed; the follower (and `status`, when it
sees an end first) keeps each task's end in the run's `ended` record, since a cluster
without accounting forgets a job MinJobAge after its end.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from vmrun import hostside
from vmrun.backends.api import RunRef
from vmrun.backends.slurm import batchfile
from vmrun.backends.slurm.following import NeverStarts, run_follower
from vmrun.backends.slurm.queue import JobState, explain_failure, submit_refusal
from vmrun.backends.slurm.stream import Lines
from vmrun.errors import (
    OutcomeUnknown,
    RemoteError,
    UsageError,
    VmrunError,
    run_failed,
)
from vmrun.remote_paths import remote_workdir
from vmrun.reporting import Reporter
from vmrun.results.record import CLUSTER, Job, Launch, Policy, Prices, RunRecord
from vmrun.runs import launch_spec as ls
from vmrun.runs import provenance
from vmrun.ssh.quoting import plain_command, quote

if TYPE_CHECKING:
    from pathlib import Path

    from vmrun.backends.slurm.cluster import Cluster
    from vmrun.notify.send import Notify
    from vmrun.ssh.connection import Connection
    from vmrun.store_url import StoreURL
    from vmrun.stores.access import Access
    from vmrun.transfer.types import Progress

LINE = b"\x1e"  # a task's line: \x1eKEY o|e\x1eTEXT
MARK = b"\x1dvmrun "
HEARTBEAT_S = 15.0


class SlurmBackend(Protocol):
    """What a script's run needs of vmrun.backends.slurm.backend.SlurmBackend."""

    conn: Connection
    cluster: Cluster

    def facts(self) -> Any: ...

    def record_dir(self, run_id: str) -> str: ...

    def script_ref(self, rid: str, record: RunRecord) -> RunRef: ...

    def cancel_never(self, ref: RunRef, job: str, state: JobState, why: str) -> None: ...


@dataclass(frozen=True)
class ScriptJob:
    """A batch script made ready to submit: what `--dry-run` shows and `submit` sends."""

    run_id: str
    batch: batchfile.BatchFile
    sbatch: list[str]  # sbatch's arguments: vmrun's options, the script, its arguments
    code_dir: str  # absolute, on the cluster
    record_dir: str
    record: RunRecord  # its run.json
    env_text: str
    notify_text: str = ""  # the record's notify.json: the follower renders and claims there
    recover_text: str = ""  # --recover: the lines put into the submitted copy (batch.sh)


def prepare(
    backend: SlurmBackend,
    batch: batchfile.BatchFile,
    args: Sequence[str],
    *,
    given: list[str],
    project_name: str,
    name: str | None,
    env: dict[str, str],
    notify: Notify | None = None,
    recoveries: int = 0,
) -> ScriptJob:
    """The sbatch command and the run's record. `given`: the options the user gave vmrun,
    as sbatch words (they override the script); the cluster's defaults fill only what the
    script and those leave unsaid. `recoveries` (--recover's limit, 0: not asked): a copy
    of the script that brings its job back is submitted (recover_lines)."""
    from pathlib import Path

    from vmrun.runs.launch import run_id as new_run_id

    facts = backend.facts()
    cluster = backend.cluster
    rid = new_run_id(name or Path(batch.relative).stem)
    code = f"{facts.workdir}/{remote_workdir(Path(project_name))}"
    defaults = {
        "--partition": cluster.partition,
        "--account": cluster.account,
        "--qos": cluster.qos,
    }
    fill = batchfile.filled(batch.options, defaults)
    for word in cluster.sbatch_args:  # one option each (vmrun.toml's check)
        pairs = batchfile.parse_words([word]).pairs
        if pairs and pairs[0][0] not in batch.options:
            fill.append(word)
    options = batchfile.parse_words(fill) + batch.options
    batch = batchfile.BatchFile(batch.path, batch.relative, options)
    record = backend.record_dir(rid)
    sbatch = [*given, *fill, f"./{batch.relative}", *args]
    lines = ""
    if recoveries:
        check_recoverable(batch)
        name_it = [] if batch.options.get("--job-name") else [f"--job-name={batch.path.name}"]
        sbatch = [*given, *fill, "--requeue", *name_it, f"{record}/batch.sh", *args]
        teller = ls.LaunchSpec(
            rec=record,
            workdir=code,
            run_id=rid,
            argv=(f"{code}/{batch.relative}", *args),
            watchers=ls.Watchers(notify=ls.Notify() if notify else None),
        )
        lines = recover_lines(teller, recoveries)
    recorded = RunRecord(
        run_id=rid,
        where=CLUSTER,
        cluster=cluster.name,
        launch=Launch(
            launcher="sbatch",
            script=batch.relative,
            args=tuple(args),
            out_dir=batch.work_dir(code),
            variables=dict.fromkeys(sorted(env)),  # names only: the user's, maybe secrets
        ),
        policy=Policy(recover=bool(recoveries), max_recoveries=recoveries or None),
        prices=Prices.from_json(_prices(cluster, options.get("--nodes"), batch.array)),
        job=Job(
            batch_script=True,
            sbatch=tuple(sbatch),
            job_name=batch.job_name,
            array=batch.array,
            nodes=_number(options.get("--nodes")),
            partition=options.get("--partition"),
            time=options.get("--time"),
            output=batch.output,
            error=batch.error,
            work_dir=batch.work_dir(code),
            submitted=time.time(),
            record_dir=record,
            code_dir=code,
        ),
    )
    env_text = "".join(f"export {k}={quote(v)}\n" for k, v in env.items())
    told = ""
    if notify:
        from vmrun.backends.slurm.records import charge

        fetch = f"vmrun fetch results -C {cluster.name} --run {rid}"
        told = notify.host_config(
            {"run": rid, "where": f"cluster {cluster.name}", "fetch": fetch},
            charge=charge(recorded),
        )
    return ScriptJob(rid, batch, sbatch, code, record, recorded, env_text, told, lines)


def _prices(cluster: Cluster, nodes: str | None, array: str | None) -> dict[str, Any]:
    """The cluster's price for each node the job asks for (`--nodes N`, else 1); none for
    an array (its tasks' times are their own) or a node range."""
    from vmrun.results.cost import alike

    count = 1 if nodes is None else _number(nodes)
    return {} if array or count is None else alike(cluster.price, count, cluster.currency)


def check_recoverable(batch: batchfile.BatchFile) -> None:
    """--recover puts bash into the script, and keeps one record per job: a bash script,
    not an array."""
    first = batch.path.read_bytes().split(b"\n", 1)[0]
    if not re.fullmatch(rb"#!\s*(/usr)?/bin/(env\s+)?bash(\s.*)?", first.strip()):
        raise UsageError(
            f"--recover puts bash lines into {batch.relative}, which is not a bash script"
            f" ({first.decode(errors='replace')})",
            hint="make its first line #!/bin/bash, or submit it without --recover",
            code="flags-conflict",
        )
    if batch.array:
        raise UsageError(
            "--recover brings back one job; an array's tasks would share its record",
            hint="submit the array without --recover (Slurm requeues a task whose node fails)",
            code="flags-conflict",
        )


def recover_lines(spec: ls.LaunchSpec, limit: int) -> str:
    """What `submit --recover` puts after the script's header: its variables (the launch
    spec of the agent that tells the job's requeues, where the run asked: the files it runs
    with it), slurm_recover.bash and slurm_own_recover.bash."""
    from vmrun.hostside import source

    agent = ["run_agent.py", "notify_send.py"] if spec.watchers.notify is not None else []
    head = [
        "# --- vmrun submit --recover: the job brings itself back; the script's own lines",
        "# follow this block unchanged ---",
        f"VMRUN_RECORD_DIR={quote(spec.rec)}",
        f"VMRUN_MAX_RECOVERIES={limit}",
        f"VMRUN_LAUNCH={quote(spec.to_json())}",
        f"VMRUN_AGENT=({' '.join(f'{name} {quote(source(name))}' for name in agent)})",
    ]
    body = source("slurm_recover.bash") + "\n" + source("slurm_own_recover.bash")
    return "\n".join(head) + "\n" + body + "# --- the script's own lines ---\n"


def submit(
    backend: SlurmBackend, job: ScriptJob, patch: bytes = b"", out: Reporter | None = None
) -> tuple[str, JobState | None]:
    """Write the record (with `patch`, the code's uncommitted diff), make the folders the
    script's --output/--error name (sbatch makes none: said in one line) and submit;
    sbatch's refusal, or a folder that cannot be made, is one line and leaves nothing."""
    meta = json.dumps(job.record.to_json(), indent=1).encode() + b"\n"
    told = job.notify_text.encode()
    added = job.recover_text.encode()
    folders = job.batch.output_folders()
    argv = [
        *hostside.command("slurm_submit_script.sh"),
        job.record_dir,
        str(len(meta)),
        str(len(told)),
        job.code_dir,
        job.batch.relative,
        str(len(patch)),
        str(len(added)),
        job.batch.options.get("--chdir") or "",
        str(len(folders)),
        *folders,
        *job.sbatch,
    ]
    status, said, err = backend.conn.capture(
        plain_command(argv),
        stdin=meta + told + patch + added + job.env_text.encode(),
        what="sbatch",
    )
    name = backend.cluster.name
    if status == 3:
        raise UsageError(
            f"cluster {name}: cannot make the folder for the job's output: {' '.join(err.split())}",
            hint="fix the script's --output/--error/--chdir, or make the folder there first",
            code="output-folder",
        )
    if status != 0:
        raise submit_refusal(status, err, name, "the script's #SBATCH lines and vmrun's options")
    lines = [line.split("=", 1) for line in said.decode(errors="replace").splitlines()]
    made = [v for k, *v in lines if k == "made" and v]
    if made and out is not None:
        out.info(
            f"{name}: made {', '.join(v[0] for v in made)} for the job's output"
            " (sbatch makes none: without it the job fails, its output lost)"
        )
    values = {pair[0]: pair[1] for pair in lines if len(pair) == 2}
    return values["job"], JobState.parse(values.get("state", ""))


def start(
    backend: SlurmBackend,
    job: ScriptJob,
    project: Any,
    out: Reporter,
    progress: Progress | None = None,
    data: Sequence[tuple[Path | StoreURL, str | None]] = (),
    access: Access | None = None,
) -> RunRef:
    """Sync the project (and push --data) to the cluster, submit, and return once the job
    is queued; a job that can never start is cancelled."""
    from vmrun.sync.files import project_files
    from vmrun.sync.project import sync_project

    name = backend.cluster.name
    files = project_files(project)
    if job.batch.relative not in files:
        raise UsageError(
            f"batch script {job.batch.relative} is excluded from the sync (.gitignore,"
            " .vmrunignore or vmrun's defaults)",
            hint=f"add `!{job.batch.relative}` to .vmrunignore",
            code="script-not-synced",
        )
    synced = sync_project(backend.conn, project, job.code_dir, files=files, progress=progress)
    if progress is None:
        for text in synced.warnings:
            out.warn(f"{name}: {text}")
    code = provenance.code_of(project, files)
    record = replace(job.record, code=code.facts)
    if data:
        from vmrun.stores.data import place_data

        placed = place_data(backend.conn, list(data), job.code_dir, out, progress, access)
        record = replace(record, launch=replace(record.launch, data=tuple(placed)))
    patch = provenance.sent_patch(code.patch)
    jobid, state = submit(backend, replace(job, record=record), patch, out)
    ref = backend.script_ref(job.run_id, record.with_job(job_id=jobid))
    if state is not None and state.never_starts:
        backend.cancel_never(ref, jobid, state, state.never_starts)
    queued = state.describe() if state else "queued"
    out.info(f"run {job.run_id} submitted to {name} as job {jobid} ({queued})")
    return ref


def given_words(options: Any, version: str) -> list[str]:
    """The Slurm options given to vmrun (SlurmOptions: None is not given) as sbatch words,
    which override the script's #SBATCH lines."""
    from vmrun.backends.slurm.job import gpu_option, word_problem

    words = []
    for flag, value in (
        ("--nodes", options.nodes),
        ("--time", options.time),
        ("--cpus-per-task", options.cpus_per_task),
        ("--mem", options.mem),
        ("--constraint", options.constraint),
        ("--partition", options.partition),
        ("--account", options.account),
        ("--qos", options.qos),
    ):
        if value is None:
            continue
        if problem := word_problem(str(value)):
            raise UsageError(f"{flag} {value!r}: {problem}")
        words.append(f"{flag}={value}")
    if options.gpus_per_node:
        words.append(gpu_option(options.gpus_per_node, version))
    for arg in options.sbatch_args:
        if word_problem(arg) or not arg.startswith("-"):
            raise UsageError(
                f"--sbatch-arg {arg!r}: give one sbatch option, no spaces, e.g. --exclusive"
            )
        words.append(arg)
    return words


def _number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _tail_args(job: Job) -> list[str]:
    return [job.work_dir, str(job.output), str(job.error)]


def _job(ref: RunRef) -> Job:
    return ref.record.job or Job()


# -- reading and following --------------------------------------------------------------


class TaskStream(Lines):
    """The framed lines of slurm_follow_tasks.sh / slurm_task_files.sh as the user sees
    them: a task's line as it is outside an array, `[INDEX] line` in one (`[INDEX err]` from
    a separate error file); `\\x1dvmrun` lines are events."""

    def __init__(self, out: Reporter, array: bool, on_event: Any = None):
        super().__init__()
        self.out = out
        self.array = array
        self.on_event = on_event
        self.wrote: set[str] = set()  # the tasks that wrote a line

    def _line(self, line: bytes) -> None:
        if line.startswith(MARK):
            if self.on_event is not None:
                word, _, rest = line[len(MARK) :].decode("utf-8", "replace").partition(" ")
                self.on_event(word, rest)
            return
        if not line.startswith(LINE):
            if line:  # the host script's own words (none expected; an empty line parts)
                self.out.output(line + b"\n")
            return
        key, _, text = line[1:].partition(LINE)
        task, _, stream = key.decode("utf-8", "replace").partition(" ")
        self.wrote.add(task)
        if self.array:
            head = f"[{task}{' err' if stream == 'e' else ''}] ".encode()
            text = head + text
        self.out.output(text + b"\n")


def read_log(backend: SlurmBackend, ref: RunRef, out: Reporter, *, last: int = 0) -> None:
    job = _job(ref)
    argv = [
        *hostside.command("slurm_task_files.sh"),
        job.record_dir,
        job.job_id,
        *_tail_args(job),
        "1" if job.array else "0",
        job.job_name or "",
        str(last),
    ]
    status, text, err = backend.conn.capture(plain_command(argv), what="the job's output")
    if status != 0:
        raise RemoteError(
            f"cannot read the job's output files: {err.strip()}",
            host=backend.cluster.name,
        )
    stream = TaskStream(out, bool(job.array))
    stream.feed(text)
    stream.flush()


class Follower:
    """A job from the user's own script, from its queue wait to its end: each task's
    state changes as infos, its files' lines as they are written; 0 when every task
    completed, else raise the failure."""

    def __init__(self, backend: SlurmBackend, ref: RunRef, out: Reporter):
        self.backend = backend
        self.ref = ref
        self.out = out
        self.job = _job(ref).job_id
        self.array = bool(_job(ref).array)
        self.stream = TaskStream(out, self.array, self.on_event)
        self.seen: dict[str, tuple[str, ...]] = {}
        self.ends: list[tuple[str, str, str]] = []
        self.lost = ""
        self.ended = False

    def _who(self, key: str) -> str:
        return f"task {key} of job {self.job}" if key != "-" else f"job {self.job}"

    def on_event(self, word: str, rest: str) -> None:
        if word == "task":
            key, _, fields = rest.partition(" ")
            parts = (fields.split("|") + [""] * 6)[:6]
            _, state, reason, host, _, _ = parts
            now = (state, reason, host)
            if self.seen.get(key) == now:
                return
            self.seen[key] = now
            pending = JobState(state, "" if reason == "None" else reason)
            if pending.never_starts:
                raise NeverStarts(pending, pending.never_starts)
            if state == "PENDING":
                why = f" ({reason})" if reason and reason != "None" else ""
                self.out.info(f"{self._who(key)} is PENDING{why}")
            elif state == "RUNNING":
                self.out.info(f"{self._who(key)} running on {host}")
            elif state:
                self.out.info(f"{self._who(key)} ended: {state}")
        elif word == "unreachable":
            error = rest.strip() or "no answer"
            self.out.info(
                f"squeue cannot reach the controller ({error}); job {self.job} keeps"
                " its last known state until it answers"
            )
        elif word == "reachable":
            self.out.info("squeue answers again")
        elif word == "lost":
            self.lost = rest.strip()
        elif word == "ended":
            self.ended = True
            words = rest.split()
            self.ends = [
                (words[i], words[i + 1], words[i + 2]) for i in range(0, len(words) - 2, 3)
            ]

    def run(self, poll: float, limit: float) -> int:
        job = _job(self.ref)
        argv = [
            *hostside.command("slurm_follow_tasks.sh"),
            job.record_dir,
            self.job,
            f"{poll:g}",
            f"{limit:.0f}",
            *_tail_args(job),
        ]
        run_follower(
            self.backend,
            self.ref,
            self.job,
            argv,
            lambda _s, data: self.stream.feed(data),
            self.stream,
        )
        return self.verdict()

    def _silent(self, key: str) -> str:
        """Why a task that wrote no line failed, as Slurm tells it (hostside/slurm_silent.sh):
        its output file's folder missing, the file never made, Slurm's reason; "" if no more
        is known."""
        job = self.job if key == "-" else f"{self.job}_{key}"
        try:
            _, said, _ = self.backend.conn.capture(
                plain_command(hostside.command("slurm_silent.sh", job)),
                what="why the job wrote nothing",
            )
        except VmrunError:
            return ""
        lines = said.decode(errors="replace").splitlines()
        facts = dict(ln.split(" ", 1) for ln in lines if " " in ln)
        why = []
        if "NOFOLDER" in facts:
            why.append(f"the folder of its output file {facts['NOFOLDER']} does not exist")
        elif "NOFILE" in facts:
            why.append(f"its output file {facts['NOFILE']} was never written")
        reason = facts.get("Reason", "")
        if reason and reason not in ("None", "(null)"):
            why.append(f"Slurm's reason: {reason}")
        return f"; before its first line: {'; '.join(why)}" if why else "; it wrote no line"

    def verdict(self) -> int:
        rid, cluster = self.ref.run_id, self.backend.cluster.name
        if self.lost or not self.ended:
            raise OutcomeUnknown(
                f"squeue has not answered for {self.lost or '?'} s; job {self.job}"
                f" (run {rid}) may still be running",
                host=cluster,
                hint=f"see `vmrun status -C {cluster}` later",
            )
        failed = [(k, s, c) for k, s, c in self.ends if s != "COMPLETED"]
        if not failed:
            return 0
        key, state, wait = failed[0]
        from vmrun.backends.slurm.records import exit_code

        code = exit_code(wait) if wait != "-" else None
        if state == "ENDED":
            raise OutcomeUnknown(
                f"{self._who(key)} left the queue before vmrun saw how it ended (no accounting"
                " on this cluster)",
                host=cluster,
                hint=f"see its output: `vmrun logs {rid} -C {cluster}`",
            )
        detail = f", exit code {code}" if code else ""
        many = f" ({len(failed)} of {len(self.ends)} tasks)" if self.array else ""
        if key not in self.stream.wrote:
            many += self._silent(key)
        raise run_failed(
            rid,
            f"failed: {self._who(key)} {explain_failure(state)}{detail}{many}",
            code,
            host=cluster,
            hint=f"see `vmrun logs {rid} -C {cluster}`",
        )
