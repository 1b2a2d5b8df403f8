"""Runs on a Slurm cluster: the `Backend` whose runs are batch jobs, reached over one SSH
connection to the login node. Code and outputs live on the cluster's shared filesystem
(the `workdir` of `[[clusters]]`); each run's files sit in `<workdir>/.vmrun/runs/<id>/`
(job.sh, run.json, env, jobid, job.log, starts, exit), where the batch script writes them
from whichever node it runs on. Every verb is one command on the login node.

A cluster vmrun made of hosts without a shared folder (`shared = false`) has the project
synced to every node and the run's record written on each before sbatch; its job then
writes on the node it runs on. Every node is a login node there (Slurm's commands and munge
everywhere), so a verb on a run is the same command on that node (`_at`), and `status`
reads every node's listing at once (records.parse_listings).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmrun import hostside
from vmrun.backends.api import FilesAt, NodeRecord, RunRef, StacksTaken, StartOptions, StopReport
from vmrun.backends.slurm import CAPABILITIES, records
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.job import (
    Batch,
    JobPaths,
    JobSpec,
    batch_script,
    check_spec,
    tasks_per_node,
    workers_per_node,
)
from vmrun.backends.slurm.queue import JobState, submit_refusal
from vmrun.backends.slurm.stream import JobStream
from vmrun.containers import runtime as rt
from vmrun.containers.image import ImageRef, Mount
from vmrun.containers.request import Request
from vmrun.containers.runtime import SlurmContainer
from vmrun.errors import Detached, Interrupted, RemoteError, UsageError, VmrunError
from vmrun.notify.send import Notify
from vmrun.remote_paths import CONTAINER_HOME, STATE_DIR, remote_workdir
from vmrun.reporting import Reporter
from vmrun.results.cost import alike
from vmrun.results.record import CLUSTER, Image, Job, Launch, Policy, Prices, RunRecord
from vmrun.runs import provenance
from vmrun.runs.launch_spec import Budget
from vmrun.runs.outputs import RunLocation
from vmrun.runs.plan import Plan
from vmrun.runs.state import RunState
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, Outcome
from vmrun.ssh.quoting import plain_command, quote
from vmrun.transfer.types import Progress

# the variables the step's task reads inside a docker/podman container, passed by name
# (Slurm's own, SLURM_*, are passed by the job script on each node: it knows which are set)
STEP_ENV = (
    "VMRUN_RUN_DIR",
    "VMRUN_LAUNCHER",
    "VMRUN_NPROC",
    "VMRUN_MAX_RESTARTS",
    "VMRUN_PYTHON",
    "VMRUN_RECORD_DIR",
    "VMRUN_REQUEUE_FILE",
    "VMRUN_WARNED_FILE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONUNBUFFERED",
    "CUDA_VISIBLE_DEVICES",
)
# docker/podman's stop wait in the job's runner where the job cannot read Slurm's KillWait
GRACE = 10
POLL_S = 2.0  # squeue while following: one cheap query per poll, on the login node only
# how long a follower rides out a controller that does not answer (a restart, a failover)
UNANSWERED_LIMIT_S = 900.0
MOVES = 20  # a followed job placed on another node (without a shared folder), at most


@dataclass(frozen=True)
class Facts:
    user: str
    home: str
    workdir: str  # absolute
    version: str  # `sinfo --version`
    setup_python: str = ""  # the env `vmrun setup -C` built (<workdir>/.vmrun/host.json)
    uid: int | None = None  # a docker/podman container's --user
    gid: int | None = None
    setup_torch: str = ""  # that env's torch version, as setup's record has it


@dataclass(frozen=True)
class StepImage:
    """The step's container as the job script carries it, the pull each node does first
    (docker/podman), the HOME inside (docker/podman), and what run.json keeps."""

    container: SlurmContainer
    pull: tuple[str, ...]
    home: str
    image: Image


@dataclass(frozen=True)
class Submission:
    """A run made ready to submit: what `--dry-run` prints and `start` sends."""

    run_id: str
    script: str
    record: RunRecord
    paths: JobPaths
    env_text: str
    trainer: bytes  # the template trainer's text (empty: the run's own script)
    notify_text: str = ""  # the record's notify.json (empty: no notifications)
    patch: bytes = b""  # the code's uncommitted diff (the record's code.patch)


class SlurmBackend:
    def __init__(
        self,
        conn: Connection,
        cluster: Cluster,
        spec: JobSpec | None = None,
        poll: float = POLL_S,
        unanswered_limit: float = UNANSWERED_LIMIT_S,
        group: Group | None = None,
    ):
        self.conn = conn
        self.cluster = cluster
        # without a shared folder: the group of every node (the cluster's `entries`), by
        # label (the login node's: the cluster's name), each a place a run's files may be
        self.group = group if cluster.synced else None
        self.nodes: dict[str, Connection] = dict(group.connections) if group and self.group else {}
        self._on = ""  # the node this view's `conn` is (see `_at`)
        self._names: dict[str, str] = {}
        self.spec = spec or JobSpec()
        self.poll = poll
        self.unanswered_limit = unanswered_limit
        self._facts: Facts | None = None
        self.notify: Notify | None = None  # a followed run's requeues are told too
        self._telling: list[threading.Thread] = []

    # -- the cluster ------------------------------------------------------------------

    def facts(self) -> Facts:
        if self._facts is None:
            argv = [*hostside.command("slurm_probe.sh"), self.cluster.workdir]
            result = self.conn.run(argv, check=True, timeout=60)
            values = dict(
                line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line
            )
            if values.get("sbatch") == "missing":
                raise UsageError(
                    f"cluster {self.cluster.name}: no sbatch on {self.cluster.login}",
                    hint="`login` must be the cluster's login node, where Slurm's commands are",
                    code="sbatch-missing",
                )
            self._facts = Facts(
                values["user"],
                values["home"],
                values["workdir"],
                values.get("version", ""),
                _recorded(values.get("setup_record", ""), "python"),
                _number(values.get("uid")),
                _number(values.get("gid")),
                _recorded(values.get("setup_record", ""), "torch"),
            )
        return self._facts

    # -- a cluster without a shared folder ------------------------------------------

    @property
    def synced(self) -> bool:
        return self.cluster.synced and len(self.nodes) > 0

    def _at(self, ref: RunRef) -> SlurmBackend:
        """This backend on the node that holds the run's files (a cluster without a shared
        folder; `files_on` from the listing), else itself."""
        return self._on_node(_job(ref).files_on)

    def _on_node(self, node: str) -> SlurmBackend:
        if not self.synced or not node or node == (self._on or self.cluster.name):
            return self
        conn = self.nodes.get(node)
        if conn is None:
            raise RemoteError(
                f"cluster {self.cluster.name}: the run's files are on {node}, which is not"
                " one of its nodes in vmrun.toml",
                host=self.cluster.name,
                hint=f"add it back with `vmrun setup -H ... --slurm {self.cluster.name}`",
                code="node-not-found",
            )
        view = copy.copy(self)
        view.conn, view._on = conn, node
        return view

    def _each_node(self, fn: Callable[[str, Connection], Any]) -> dict[str, Any]:
        """fn on every node at once (the group's map): its value, or the exception it
        raised, per node."""
        assert self.group is not None
        outcomes = self.group.map(lambda entry, conn: fn(entry.label, conn))
        return {o.host: o.value if o.error is None else o.error for o in outcomes}

    def _node_named(self, name: str) -> str:
        """The node whose Slurm name (its short hostname) is `name`."""
        if name not in self._names:
            argv = ["hostname", "-s"]
            found = self._each_node(lambda _n, conn: conn.run(argv, check=True).stdout_tail)
            self._names.update(
                {str(v).strip(): n for n, v in found.items() if not isinstance(v, Exception)}
            )
        if name not in self._names:
            raise RemoteError(
                f"job placed on {name}, which none of cluster {self.cluster.name}'s nodes is",
                host=self.cluster.name,
                code="node-not-found",
            )
        return self._names[name]

    @property
    def runs_dir(self) -> str:
        """Where the runs' records are; without asking the login node when the workdir
        says it (`~`, a path, `{user}` with the login's user), so `status` is one command."""
        workdir = self.cluster.workdir
        user = self.cluster.entry.spec.user
        if "{user}" in workdir and user:
            workdir = workdir.replace("{user}", user)
        if "{user}" in workdir:
            workdir = self.facts().workdir
        elif workdir == "~" or workdir.startswith("~/"):
            workdir = workdir[2:] or "."  # commands start in the home directory
        return f"{workdir}/{STATE_DIR}/runs".removeprefix("./")

    def python(self) -> str:
        """The jobs' interpreter: the cluster's `python` in vmrun.toml, else the env
        `vmrun setup -C` built (read from its record on the cluster by the same probe that
        finds the workdir, so it costs no round trip), else python3 from the PATH."""
        return self.cluster.python or self.facts().setup_python or "python3"

    def _torch(self) -> str:
        """The jobs' torch version where vmrun knows it: setup's record, when the jobs run
        the env setup built (not a `python` of the cluster's own)."""
        return "" if self.cluster.python else self.facts().setup_torch

    def record_dir(self, run_id: str) -> str:
        return f"{self.facts().workdir}/{STATE_DIR}/runs/{run_id}"

    def _cap(self, plan: Plan) -> float:
        """The run's --max-cost, else the cluster's own `max_cost` (0: none)."""
        return plan.max_cost or float(self.cluster.max_cost or 0)

    def _budget(self, cap: float, spec: JobSpec) -> Budget | None:
        """The job's budget watcher for a cap (its seconds: the job's time from its first
        attempt's start at the cluster's price per node); refused where the cluster has no
        `price`."""
        if not cap:
            return None
        from vmrun.results.cost import budget_seconds, money

        priced = alike(self.cluster.price, spec.nodes, self.cluster.currency)
        if not priced:
            raise UsageError(
                f"--max-cost {cap:g}: cluster {self.cluster.name} has no `price`, so the cap"
                " cannot be kept; nothing submitted",
                hint=f"give [[clusters]] {self.cluster.name} its `price` per node an hour in"
                " vmrun.toml, or drop --max-cost",
                code="over-budget",
            )
        left = budget_seconds(cap, priced["price_per_hour"])
        return Budget(float(round(left)), money(cap, priced["currency"]))

    # -- submitting -------------------------------------------------------------------

    def prepare(self, plan: Plan, how: StartOptions | None = None) -> Submission:
        """The batch script and the run's record, ready to submit (nothing sent yet);
        `how.notify`: the job tells its end and requeues itself (and the follower claims
        them); `how.max_recoveries`: it brings itself back after a failure (--recover)."""
        how = how or StartOptions()
        notify, run_id, recoveries = how.notify, how.run_id, how.max_recoveries
        from vmrun.runs.launch import run_id as new_run_id
        from vmrun.trainer import is_bundled

        spec = check_spec(self.spec, plan.launcher)
        cap = self._cap(plan)
        facts = self.facts()
        rid = run_id or new_run_id(plan.name)
        code = f"{facts.workdir}/{remote_workdir(plan.project)}"
        paths = JobPaths(record=self.record_dir(rid), code=code, out=f"{code}/results/{rid}")
        request = plan.containers.resolve(self.cluster.containers)
        image = self._image(request, spec, facts, rid, paths, plan) if request else None
        trainer = b""
        if is_bundled(plan.script):
            trainer = plan.script.read_bytes()
            command = [f"{paths.record}/template.py", *plan.args, "--out-dir", paths.out]
        else:
            command = [f"{code}/{_relative(plan)}", *plan.args]
        batch = Batch(
            run_id=rid,
            launcher=plan.launcher,
            python=rt.IMAGE_PYTHON if image else self.python(),
            command=command,
            max_restarts=plan.max_restarts,
            modules=self.cluster.modules,
            container=image.container if image else None,
            pull=image.pull if image else (),
            container_home=image.home if image else "",
            notifier=bool(notify),
            max_recoveries=recoveries,
            hang=plan.hang_watch(),
            budget=self._budget(cap, spec),
            torch=self._torch() if image is None else "",
            own_env=(*self.cluster.env, *plan.env),
        )
        script = batch_script(spec, batch, paths, facts.version, job_name=rid)
        per_node = workers_per_node(spec, plan.launcher)
        epochs = int(plan.args[0]) if trainer and plan.args[0].isdigit() else None
        env = {**self.cluster.env, **plan.env}
        env_text = "".join(f"export {name}={quote(value)}\n" for name, value in env.items())
        made = provenance.code_of(plan.project, trainer=plan.script if trainer else None)
        record = RunRecord(
            run_id=rid,
            where=CLUSTER,
            cluster=self.cluster.name,
            launch=Launch(
                launcher=plan.launcher,
                script=plan.script.name if trainer else _relative(plan),
                template=bool(trainer),
                args=tuple(plan.args),
                out_dir=paths.out,
                image=image.image if image else None,
                variables=provenance.variables(env, list(env)),  # names only: the user's
            ),
            code=made.facts,
            policy=Policy(
                recover=bool(recoveries),
                max_recoveries=recoveries or None,
                max_cost=cap or None,
            ),
            prices=Prices.from_json(alike(self.cluster.price, spec.nodes, self.cluster.currency)),
            job=Job(
                epochs=epochs,
                nodes=spec.nodes,
                tasks_per_node=tasks_per_node(spec, plan.launcher),
                nproc_per_node=per_node,
                world_size=per_node * spec.nodes if per_node else None,
                gpus_per_node=spec.gpus_per_node,
                partition=spec.partition,
                time=spec.time,
                max_requeues=spec.max_requeues,
                submitted=time.time(),
                record_dir=paths.record,
                code_dir=paths.code,
                metrics=f"{paths.out}/metrics.jsonl",
            ),
        )
        told = ""
        if notify:
            name = self.cluster.name
            fetch = f"vmrun fetch results -C {name} --run {rid}"
            told = notify.host_config(
                {
                    "run": rid,
                    "where": f"cluster {name}",
                    "epochs_asked": epochs,
                    "fetch": fetch,
                },
                charge=records.charge(record),
            )
        patch = provenance.sent_patch(made.patch)
        return Submission(rid, script, record, paths, env_text, trainer, told, patch)

    def _image(
        self, request: Request, spec: JobSpec, facts: Facts, rid: str, paths: JobPaths, plan: Plan
    ) -> StepImage:
        """The step's container on this cluster: its runtime (the cluster's
        container_runtime, else the first the login node has), refused before anything is
        sent when it is not there or cannot do what is asked."""
        runtime = self._runtime(request.runtime)
        engine = runtime.name in ("docker", "podman")
        home = f"{facts.workdir}/{CONTAINER_HOME}" if engine else ""
        own = (Mount(paths.record, paths.record), *((Mount(home, home),) if home else ()))
        names = sorted({*self.cluster.env, *plan.env})
        container = rt.ContainerSpec(
            image=request.image,
            command=(),
            workdir=paths.code,
            run_id=rid,
            mounts=rt.with_own_mounts(own, paths.code, request.mounts),
            env=(*STEP_ENV, *(n for n in names if n not in STEP_ENV)),
            uid=facts.uid,
            gid=facts.gid,
            gpus=spec.gpus_per_node > 0,
            rootless=runtime.name == "podman" and facts.uid != 0,
            home=home or None,
            ulimits=request.ulimits or rt.NGC_ULIMITS,
        )
        step = rt.slurm_container(runtime, container, GRACE)  # refuses what it cannot do
        pull: tuple[str, ...] = ()
        if engine and isinstance(request.image, ImageRef):
            pull = tuple(rt.pull_script_args(runtime, request.image, request.pull))
        recorded = Image.from_json({**request.meta(), "container_runtime": runtime.name})
        assert recorded is not None  # a request always names its image
        return StepImage(step, pull, home, recorded)

    def _runtime(self, name: str) -> rt.Runtime:
        """The runtime `container_runtime` names (`auto`: the first the login node has, in
        runtime.DETECT_ORDER), present on the login node: one round trip."""
        argv = hostside.command(rt.DETECT_SCRIPT)
        found = self.conn.run(argv, check=True, what="the container runtimes").stdout_tail.split()
        runtime = rt.detect(found) if name == "auto" else rt.runtime_named(name)
        if runtime is None or runtime.name not in found:
            what = "a container runtime" if runtime is None else runtime.name
            raise UsageError(
                f"--image needs {what}, which {self.cluster.login} does not have",
                host=self.cluster.name,
                hint="set container_runtime in the cluster's [[clusters]] table"
                f" (one of {', '.join(rt.DETECT_ORDER)})",
                code="container-runtime-missing",
            )
        return runtime

    def start(
        self, plan: Plan, how: StartOptions, out: Reporter, progress: Progress | None = None
    ) -> RunRef:
        """Sync the code (a SCRIPT's project; the template travels with the job) and push
        the run's --data, submit, and return once the job is queued. A job that can never
        start is cancelled. A job is requeued and resumed by Slurm itself: `how.resume`,
        `fresh` and `down_after_run` are the hosts' and refused here."""
        unsupported = [
            flag
            for flag, given in (
                ("--resume", how.resume),
                ("--fresh", how.fresh),
                ("--down-after-run", how.down_after_run),
            )
            if given
        ]
        if unsupported:
            raise UsageError(
                f"{', '.join(unsupported)}: not on a cluster (-C {self.cluster.name})",
                hint="Slurm requeues and resumes a job itself; drop them, or run on hosts (-H)",
                code="flags-conflict",
            )
        sub = self.prepare(plan, how)
        if self.synced:  # every node gets what one would on a shared folder
            placed: list[Submission] = []
            try:
                self._each_place(lambda node: placed.append(node._place(plan, sub, out, None)))
            except BaseException:
                self._forget(sub.paths.record)
                raise
            sub = placed[0] if placed else sub
        else:
            sub = self._place(plan, sub, out, progress)
        job, state = self._submit(sub)
        ref = self._ref(sub.run_id, sub.record.with_job(job_id=job))
        if state is not None and state.never_starts:
            self.cancel_never(ref, job, state, state.never_starts)
        where = f"{self.cluster.name} as job {job}"
        queued = state.describe() if state else "queued"
        out.info(f"run {sub.run_id} submitted to {where} ({queued})")
        return ref

    def _place(
        self, plan: Plan, sub: Submission, out: Reporter, progress: Progress | None
    ) -> Submission:
        """The code (a SCRIPT's project; the template travels with the job), py-spy for the
        hang watcher and the run's --data, onto the shared filesystem (or this node); the
        submission with where its data went."""
        if not sub.trainer:
            self._sync(plan, sub.paths.code, out, progress)
        if plan.hang_timeout:  # the hang watcher's stacks: py-spy in the shared home
            from vmrun.runs.stack_tool import ensure

            try:
                ensure(self.conn, self.python())
            except VmrunError as exc:
                out.warn(f"a hang would be told without the ranks' stacks: {exc.one_line()}")
        if plan.data:
            from vmrun.stores.data import place_data

            placed = place_data(
                self.conn, plan.data, sub.paths.code, out, progress, plan.store_access
            )
            launch = replace(sub.record.launch, data=tuple(placed))
            sub = replace(sub, record=replace(sub.record, launch=launch))
        if self.synced and self._on:  # the record, where the job may run (not submitted)
            self._send(sub, record_only=True)
        return sub

    def _each_place(self, fn: Callable[[SlurmBackend], None]) -> None:
        """fn on every node's view at once; the first failure raised, naming its node
        (the records already written are removed: no run is listed that was not queued)."""
        failed = {
            node: exc
            for node, exc in self._each_node(lambda node, _conn: fn(self._on_node(node))).items()
            if exc is not None
        }
        if failed:
            node, exc = next(iter(failed.items()))
            if isinstance(exc, VmrunError) and not exc.host:
                exc.host = node
            raise exc

    def _sync(self, plan: Plan, code: str, out: Reporter, progress: Progress | None) -> None:
        from vmrun.sync.files import project_files
        from vmrun.sync.project import sync_project

        files = project_files(plan.project)
        if _relative(plan) not in files:
            raise UsageError(
                f"script {_relative(plan)} is excluded from the sync (.gitignore, .vmrunignore"
                " or vmrun's defaults)",
                hint=f"add `!{_relative(plan)}` to .vmrunignore",
                code="script-not-synced",
            )
        synced = sync_project(self.conn, plan.project, code, files=files, progress=progress)
        if progress is None:
            for text in synced.warnings:
                out.warn(f"{self.cluster.name}: {text}")

    def _submit(self, sub: Submission) -> tuple[str, JobState | None]:
        status, out, err = self._send(sub)
        if status != 0:
            if self.synced:  # the other nodes' copies of a record sbatch refused
                self._forget(sub.paths.record)
            raise submit_refusal(
                status, err, self.cluster.name, "--partition/--account/--qos/--time"
            )
        values = dict(
            line.split("=", 1) for line in out.decode(errors="replace").splitlines() if "=" in line
        )
        return values["job"], JobState.parse(values.get("state", ""))

    def _forget(self, record: str) -> None:
        """The record of a run never queued, off every other node (best effort)."""
        argv = plain_command(["rm", "-rf", "--", record])
        self._each_node(
            lambda node, conn: (
                None
                if node == self.cluster.name
                else conn.capture(argv, what="removing the record")
            )
        )

    def _send(self, sub: Submission, *, record_only: bool = False) -> tuple[int, bytes, str]:
        """The run's files into its record folder and, unless `record_only`, sbatch."""
        script = sub.script.encode()
        meta = json.dumps(sub.record.to_json(), indent=1).encode() + b"\n"
        told = sub.notify_text.encode()
        collector = hostside.source("run_provenance.py").encode()
        sizes = [str(len(script)), str(len(meta)), str(len(sub.trainer))]
        paths = sub.paths
        argv = [
            *hostside.command("slurm_submit.sh"),
            paths.record,
            *sizes,
            paths.code,
            str(len(told)),
            str(len(sub.patch)),
            str(len(collector)),
            sub.record.job.metrics if sub.record.job else "",
            *(["record"] if record_only else []),
        ]
        stdin = script + meta + sub.trainer + told + sub.patch + collector + sub.env_text.encode()
        what = "the run's record" if record_only else "sbatch"
        status, out, err = self.conn.capture(plain_command(argv), stdin=stdin, what=what)
        if record_only and status != 0:
            raise RemoteError(f"writing the run's record failed: {err.strip()}", host=self._on)
        return status, out, err

    def cancel_never(self, ref: RunRef, job: str, state: JobState, why: str) -> None:
        self._cancel(ref, grace=0)
        raise UsageError(
            f"job {job} can never start on {self.cluster.name}: {state.reason} ({why});"
            " it was cancelled",
            hint="ask for less (--nodes, --time), or another --partition",
            code="job-never-starts",
        )

    # -- finding runs -----------------------------------------------------------------

    def runs(self) -> tuple[list[records.SlurmRun], list[BaseException]]:
        if self.synced:
            return self._runs_everywhere()
        text, error = self._listing(self.conn)
        if error is None and (older := records.unpointed(records.parse_listing(text, ""))):
            text, error = self._listing(self.conn, older)  # once: their metrics.path
        if error is not None:
            return [], [error]
        found = records.parse_listing(text, self.cluster.name)
        for run in found:
            if lines := run.ends_to_record():
                self._record_ends(run, lines)
        return found, []

    def _listing(
        self, conn: Connection, older: Sequence[str] = ()
    ) -> tuple[str, RemoteError | None]:
        """slurm_runs.sh's listing; `older`: records an older vmrun wrote, given their
        metrics.path first (records.unpointed)."""
        argv = [*hostside.command("slurm_runs.sh"), self.runs_dir, *older]
        status, out, err = conn.capture(plain_command(argv), what="squeue")
        if status != 0:
            return "", RemoteError(f"listing runs failed: {err.strip()}", host=self.cluster.name)
        return out.decode(errors="replace"), None

    def _runs_everywhere(self) -> tuple[list[records.SlurmRun], list[BaseException]]:
        """Every node's listing at once, merged (the login node's first: its queue); a
        node that does not answer is named, the rest listed."""
        found = self._each_node(lambda _node, conn: self._listing(conn))
        listed = [(n, v[0]) for n, v in found.items() if not isinstance(v, BaseException)]
        older = records.unpointed(records.parse_listings(listed, ""))
        if older:  # once: their metrics.path on every node that has their record
            found = self._each_node(lambda _node, conn: self._listing(conn, older))
        listings: list[tuple[str, str]] = []
        errors: list[BaseException] = []
        for node in sorted(found, key=lambda n: n != self.cluster.name):
            value = found[node]
            error = value if isinstance(value, BaseException) else value[1]
            if error is not None:
                if node == self.cluster.name:
                    return [], [error]
                errors.append(RemoteError(f"{node}: {_line(error)}", host=self.cluster.name))
            else:
                listings.append((node, value[0]))
        runs = records.parse_listings(listings, self.cluster.name)
        for run in runs:
            if lines := run.ends_to_record():
                self._on_node(run.files_on)._record_ends(run, lines)
        return runs, errors

    def _record_ends(self, run: records.SlurmRun, lines: list[str]) -> None:
        """Keep a script job's ends that squeue shows now and will forget, and tell its end
        where the run asked (best effort: the next listing tries again)."""
        path = (run.record.job.record_dir if run.record.job else "") or f"{self.runs_dir}/{run.id}"
        state, code = run.state_and_code()
        event = "end" if state is RunState.DONE else "fail"
        told = "-" if code is None else str(code)
        argv = hostside.command("slurm_record_ends.sh", path, event, told)
        self.conn.capture(
            plain_command(argv),
            stdin="".join(f"{ln}\n" for ln in lines).encode(),
            what="the job's ends",
        )

    def find(
        self, run_id: str | None, *, running_only: bool = False, nodes: Sequence[str] = ()
    ) -> RunRef:
        if nodes:
            raise UsageError(
                f"--node picks one host of a run on hosts; a job on {self.cluster.name} is one"
                " log and one node",
                hint="drop --node",
            )
        found, _ = self.runs()
        if running_only:
            found = [r for r in found if r.state in (RunState.PENDING, RunState.RUNNING)]
        if run_id is not None:
            found = [r for r in found if r.id == run_id]
        if not found:
            what = f"no run {run_id}" if run_id else "no run"
            raise UsageError(
                f"{what} on cluster {self.cluster.name}",
                hint="see `vmrun status`",
                code="run-not-found",
            )
        run = found[-1]
        listed = run.record.with_job(job_id=run.job_id, since=run.since, files_on=run.files_on)
        return self._ref(run.id, listed, run)

    def script_ref(self, rid: str, record: RunRecord) -> RunRef:
        return self._ref(rid, record)

    def _ref(self, rid: str, record: RunRecord, run: records.SlurmRun | None = None) -> RunRef:
        state, code = run.state_and_code() if run else (RunState.PENDING, None)
        first = float(run.starts[0][1]) if run and run.starts else None  # the node's clock
        node = NodeRecord(
            self.cluster.name,
            state,
            code,
            record,
            started=(record.job.submitted if record.job else None) or 0,
            first_started=first,
        )
        return RunRef(rid, (self.cluster.name,), {self.cluster.name: node})

    def state(self, ref: RunRef) -> tuple[RunState, int | None]:
        found, errors = self.runs()
        if errors:
            raise errors[0]
        for run in found:
            if run.id == ref.run_id:
                return run.state_and_code()
        return RunState.LOST, None

    def outputs(self, ref: RunRef) -> dict[str, RunLocation]:
        """Where the run's files are: its outputs folder and its record (job.log), both on
        the shared filesystem, fetched through the login node."""
        job = _job(ref)
        # a script's outputs are whatever it wrote in the work dir since its job started, by
        # the cluster's clock (the files' times are the cluster's, not this machine's)
        record = ref.records.get(self.cluster.name)
        start = record.first_started if record and record.first_started else job.submitted
        if job.batch_script:  # whatever the job wrote since it was submitted
            start = job.since or start
        since = 0 if ref.record.launch.template else int(float(start or 0) * 1e9)
        logs: tuple[str, ...] = ()
        if job.batch_script:
            from vmrun.backends.slurm.batchfile import as_glob

            patterns = {job.output or "", job.error or ""}
            logs = tuple(sorted(as_glob(p) for p in patterns if p and not p.startswith("/")))
        node = (job.files_on or self.cluster.name) if self.synced else self.cluster.name
        location = RunLocation(
            run_id=ref.run_id,
            host=node,
            record_dir=job.record_dir,
            out_dir=ref.record.launch.out_dir,
            since_ns=since,
            logs=logs,
        )
        return {node: location}

    # -- logs -------------------------------------------------------------------------

    def files_at(self, ref: RunRef) -> FilesAt:
        """The shared filesystem, through the login node, with the cluster's Python."""
        name, at = self.cluster.name, self._at(ref)
        (location,) = self.outputs(ref).values()
        return FilesAt(at._on or name, at.conn, self.python(), location, f"-C {name}")

    def code_dir(self, project: Path) -> str:
        return f"{self.facts().workdir}/{remote_workdir(project)}"

    def read_log(self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False) -> None:
        if (at := self._at(ref)) is not self:
            return at.read_log(ref, out, last=last, verbose=verbose)
        if _job(ref).batch_script:
            from vmrun.backends.slurm import own_script

            own_script.read_log(self, ref, out, last=last)
            return
        log = f"{_job(ref).record_dir}/job.log"
        argv = ["tail", "-n", str(last), "--", log] if last else ["cat", "--", log]
        status, text, err = self.conn.capture(plain_command(argv), what="the job's log")
        if status != 0 and "No such file" not in err:
            raise RemoteError(f"cannot read {log}: {err.strip()}", host=self.cluster.name)
        stream = self.stream(ref, out, lambda word, rest: None, verbose)
        stream.feed(text)
        stream.flush()

    def stream(
        self, ref: RunRef, out: Reporter, on_event: Callable[[str, str], None], verbose: bool
    ) -> JobStream:
        return JobStream(
            out,
            on_event,
            launcher=ref.record.launch.launcher or "torchrun",
            tasks_per_node=_job(ref).tasks_per_node or 1,
            verbose=verbose,
        )

    def follow(self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False) -> int:
        """The job from now (or its queue wait) to its end: state changes as infos, its
        output as `[node rankN]` lines; 0 when it completed, else raise its failure."""
        if _job(ref).batch_script:
            from vmrun.backends.slurm import own_script

            at = self._at(ref)
            return own_script.Follower(at, ref, out).run(self.poll, self.unanswered_limit)
        from vmrun.backends.slurm.following import Follower

        try:
            if self.synced:
                return self._follow_nodes(ref, out, last, verbose)
            return Follower(self, ref, out, verbose, last).run()
        finally:
            for thread in self._telling:  # a requeue's message, still going out
                thread.join(timeout=60)
            self._telling.clear()

    def _follow_nodes(self, ref: RunRef, out: Reporter, last: int, verbose: bool) -> int:
        """Without a shared folder the log is on the job's batch node: followed where the
        run's files are (the login node while it waits), and again on each node the job is
        placed on (a requeue may move it), its whole log there."""
        from vmrun.backends.slurm.following import Follower

        at = self._at(ref)
        for _ in range(MOVES):
            follower = Follower(at, ref, out, verbose, last)
            follower.watch(here=True)
            if not follower.moved:
                return follower.verdict()
            node = self._node_named(follower.moved)
            ref = with_job(ref, files_on=node)
            at, last = self._on_node(node), 0
        raise RemoteError(
            f"job {_job(ref).job_id or None} moved {MOVES} times; stopped following",
            host=self.cluster.name,
        )

    def follow_and_tell(
        self, ref: RunRef, notify: Notify | None, out: Reporter, *, verbose: bool = False
    ) -> int:
        """Follow the run to its end and tell the end (a detach tells nothing: the job goes
        on, and tells its own end)."""
        self.notify = notify
        try:
            code = int(self.follow(ref, out, verbose=verbose))
        except (Detached, Interrupted):
            raise
        except VmrunError as failure:
            self.tell_end(ref, out, failure)
            raise
        self.tell_end(ref, out)
        return code

    def tell_end(self, ref: RunRef, out: Reporter, failure: VmrunError | None = None) -> None:
        """A followed run's end to `self.notify`'s targets (its record claims it)."""
        self._tell(ref, out, failure=failure)

    def on_requeue(self, ref: RunRef, out: Reporter) -> None:
        """A requeue seen while following: told (once: the job's node may have claimed it),
        beside the log's lines, not in their way."""
        if self.notify:
            thread = threading.Thread(
                target=self._tell, args=(ref, out), daemon=True, kwargs={"event": "requeue"}
            )
            thread.start()
            self._telling.append(thread)

    def _tell(
        self, ref: RunRef, out: Reporter, *, failure: VmrunError | None = None, event: str = ""
    ) -> None:
        if self.notify:
            from vmrun.notify.tell import tell_end

            tell_end(
                self._at(ref).conn,
                _job(ref).record_dir,
                self.notify,
                out,
                run_id=ref.run_id,
                where=f"cluster {self.cluster.name}",
                failure=failure,
                event=event,
            )

    # -- stopping ---------------------------------------------------------------------

    def stop(self, ref: RunRef, *, grace: float) -> list[Outcome[StopReport]]:
        """scancel, then wait (bounded) until the job and every step of it are gone: the
        cluster's one outcome (signalled 1: cancelled; 0: it had ended)."""
        began = time.monotonic()
        try:
            report = self._at(ref)._cancel(ref, grace)
        except VmrunError as exc:
            return [Outcome(self.cluster.name, None, exc, time.monotonic() - began)]
        return [Outcome(self.cluster.name, report, None, time.monotonic() - began)]

    def _cancel(self, ref: RunRef, grace: float) -> StopReport:
        job = _job(ref).job_id
        if not job:
            raise UsageError(f"run {ref.run_id} has no job id on {self.cluster.name}")
        deadline = str(max(30, int(grace) + 30))
        argv = [*hostside.command("slurm_stop.sh"), _job(ref).record_dir, job, deadline]
        result = self.conn.run(argv, timeout=float(deadline) + 30)
        before = result.stdout_tail.split("before=", 1)[-1].split("\n", 1)[0].strip()
        if result.exit_status == 3:
            raise RemoteError(
                f"job {job} is still there after scancel: {result.stdout_tail.strip()}",
                host=self.cluster.name,
                hint="ask the cluster's admins; `scancel` it again later",
                code="stop-failed",
            )
        if result.exit_status != 0:
            raise RemoteError(
                f"scancel {job} failed: {result.output_tail(2).strip()}",
                host=self.cluster.name,
                code="stop-failed",
            )
        return StopReport(node=self.cluster.name, signalled=1 if before else 0, killed=0)

    capabilities = CAPABILITIES  # what a Slurm job can do (the refusals derive from it)

    def stacks(self, run_id: str | None, *, hang: bool = False) -> StacksTaken:
        """The job's ranks' stacks now, through the login node, or with `hang` those its
        hang watcher took (vmrun.backends.slurm.stacks)."""
        from vmrun.backends.slurm.stacks import hang_on_cluster, on_cluster

        return hang_on_cluster(self, run_id) if hang else on_cluster(self, run_id)


def with_job(ref: RunRef, **changes: Any) -> RunRef:
    """The ref with its job's facts changed (where its files are, found later)."""
    records_ = {n: replace(r, record=r.record.with_job(**changes)) for n, r in ref.records.items()}
    return replace(ref, records=records_)


def _job(ref: RunRef) -> Job:
    """The run's job as its record has it (an empty one for a record without)."""
    return ref.record.job or Job()


def _line(error: BaseException) -> str:
    return error.one_line() if isinstance(error, VmrunError) else str(error) or repr(error)


def _relative(plan: Plan) -> str:
    try:
        return plan.script.relative_to(plan.project).as_posix()
    except ValueError:
        raise UsageError(
            f"script {plan.script} is outside the project {plan.project}, so it would not be"
            " synced",
            hint="run vmrun from the project, or move the script into it",
            code="script-not-synced",
        ) from None


def _number(text: str | None) -> int | None:
    return int(text) if text and text.strip().isdigit() else None


def _recorded(encoded: str, key: str) -> str:
    """`key` (python, torch) of setup's record on the cluster (base64 JSON); "" when there
    is none."""
    import base64
    import binascii

    try:
        record = json.loads(base64.b64decode(encoded)) if encoded else {}
    except (binascii.Error, ValueError):
        return ""
    value = record.get(key) if isinstance(record, dict) else None
    return value if isinstance(value, str) else ""
