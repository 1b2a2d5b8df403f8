"""Where a run executes, behind one interface: what `train`, `logs`, `status`, `stop`, `fetch`
and `--resume` ask of a run, whatever runs it.

The peers: SSH hosts (`vmrun.backends.hosts`: detached process trees recorded under
~/.vmrun/runs/ on each host) and a Slurm cluster through its login node
(`vmrun.backends.slurm`: sbatch/squeue/sacct/scancel); the commands do not care which.
Each call is one verb of a run's life; what a backend needs beyond these (the hosts' wiring,
a cluster's sbatch options) it is given when it is made (vmrun.backends.select):

- `start`   a plan, detached, with `StartOptions`; return at once with a `RunRef` (the run
            outlives vmrun);
- `find`    a recorded run by id (or the newest), as a `RunRef` (`nodes`: narrowed to those);
- `runs`    every recorded run (`status`) as `RunRow`s, and the places that did not answer;
- `state`   PENDING / RUNNING / DONE / FAILED / STOPPED / LOST, with the exit code;
- `follow`  its log from a point to the end, every node merged and prefixed, applying the
            failure rule (a failed node stops the others); return 0 or raise its failure;
- `read_log` the log as it is now;
- `stop`    every process of the run, verified: nothing left; each node's outcome, a node's
            failure in it (not raised);
- `outputs` where its files are, per node, for fetch and resume;
- `files_at` the node whose files a command over the whole run reads (tensorboard), reached;
- `code_dir` where a project's code lives on the backend (relative paths of fetch and push);
- `stacks`  every rank's Python stack of a running run now, or with `hang` those its hang
            watcher took (`vmrun stacks`), as `StacksTaken`.

A new backend passes tests/test_backend_contract.py: the same scenarios on every backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord
from vmrun.runs.state import RunState

if TYPE_CHECKING:
    from vmrun.notify.send import Notify
    from vmrun.reporting import Reporter
    from vmrun.results.stragglers import Slow
    from vmrun.runs.outputs import RunLocation
    from vmrun.runs.plan import Plan
    from vmrun.runs.stacks import Flight, RankStack
    from vmrun.ssh.connection import Connection
    from vmrun.ssh.group import Outcome
    from vmrun.stores.sync import StoreState
    from vmrun.transfer.types import Progress


@dataclass(frozen=True)
class StartOptions:
    """How a run starts, beside its plan, on any backend (a backend refuses what it cannot
    do with a UsageError before anything starts)."""

    run_id: str | None = None  # the new run's id, where the caller needs it beforehand
    resume: str | None = None  # continue this run (its id) from its newest snapshot
    fresh: bool = False  # move checkpoints an earlier run left in the run's folder aside
    allow_concurrent: bool = False  # start beside another run of this user
    down_after_run: bool = False  # power the hosts off once it ended and its results are here
    notify: Notify | None = None  # where the run's end is told (from where it runs)
    # --recover where the backend's scheduler brings the run back (Slurm: the job requeues
    # itself); 0: not asked. On hosts a supervisor does it (vmrun.recovery).
    max_recoveries: int = 0
    ignore_gpu_health: bool = False  # start on a host whose GPU health check fails


@dataclass(frozen=True)
class NodeRecord:
    """One node's view of a run, as its record says (host clock times)."""

    node: str
    state: RunState
    exit_code: int | None
    record: RunRecord
    started: float = 0.0  # this machine's clock when it was started
    first_started: float | None = None  # the node's clock when the first attempt began
    ended: float | None = None
    failure: WorkerFailure | None = None  # torchrun's first failed worker, where it is known
    budget: Mapping[str, Any] | None = None  # its budget watcher stopped it (--max-cost)


@dataclass(frozen=True)
class RunRef:
    """A run and where it is: its id, its nodes (master first) and what each recorded."""

    run_id: str
    nodes: tuple[str, ...]
    records: Mapping[str, NodeRecord] = field(default_factory=dict)
    skip: Mapping[str, int] = field(default_factory=dict)  # log lines of earlier attempts
    # recorded nodes that did not answer when the run was looked up, with why: what a
    # command did not do there is said, and its exit status is not 0
    unreached: Mapping[str, BaseException] = field(default_factory=dict)

    @property
    def record(self) -> RunRecord:
        """The run's own record (the newest node record: all nodes share the same plan)."""
        if not self.records:
            return RunRecord.from_json({})
        return max(self.records.values(), key=lambda r: r.started).record


@dataclass(frozen=True)
class StopReport:
    """What stopping did on one node (a cluster's job is one node: the cluster)."""

    node: str
    signalled: int  # processes (a job: 1) sent SIGTERM (0: the run had already ended there)
    killed: int  # of those, how many needed SIGKILL


@dataclass(frozen=True)
class FilesAt:
    """Where a command over a run's files runs: the node that has them all (a multi-node
    run's master; a cluster's shared filesystem through its login node), a connection
    there, the Python that ran the run, and how the user names that place (`-H accA`)."""

    node: str
    conn: Connection
    python: str
    location: RunLocation
    selector: str


@dataclass(frozen=True)
class StacksTaken:
    """A run's ranks' stacks as the backend took them (`stacks`), whatever runs it: each
    rank's, the nodes that gave none (and why), and for a hang what each node's watcher saw
    (its REC/hang) and torch's flight recorder."""

    run_id: str
    stacks: list[RankStack] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    hangs: dict[str, dict[str, Any]] = field(default_factory=dict)
    flights: list[Flight] = field(default_factory=list)


class RunRow(Protocol):
    """One run on one node as `runs` lists it: what `status` shows for any run."""

    @property
    def id(self) -> str: ...
    @property
    def host(self) -> str: ...  # the node (a cluster's name)
    @property
    def record(self) -> RunRecord: ...  # its run.json
    @property
    def state(self) -> RunState: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def started(self) -> float: ...
    @property
    def ended(self) -> float | None: ...
    @property
    def duration(self) -> float | None: ...
    @property
    def ran_s(self) -> float | None: ...  # every attempt's time: what the run is charged
    @property
    def progress(self) -> str | None: ...  # "epoch 7/10"
    @property
    def attempts(self) -> int: ...
    @property
    def reason(self) -> str: ...  # why it waits or ended, where the backend knows
    @property
    def failure(self) -> WorkerFailure | None: ...
    @property
    def versions(self) -> Mapping[str, Any] | None: ...
    @property
    def store(self) -> StoreState | None: ...  # where its copy to a bucket stands (--store)
    @property
    def recoveries(self) -> int: ...  # how many times its supervisor acted (--recover)
    @property
    def recovery(self) -> str: ...  # the last of them, as the run's log says it
    @property
    def gave_up(self) -> bool: ...  # ... and whether that was giving up
    @property
    def recovering(self) -> str: ...  # a recovery under way: "1 of 5: lost h2: ...", else ""
    @property
    def tasks(self) -> Sequence[Any]: ...  # an array job's tasks (a cluster's), else empty
    # what a node's watchers recorded, where its backend keeps them (else None, "" or ())
    @property
    def began(self) -> float | None: ...  # this attempt's start, by the node's clock
    @property
    def host_now(self) -> float | None: ...  # the node's clock when listed
    @property
    def stopped_by(self) -> str | None: ...  # who stopped it: user, budget, vmrun's own
    @property
    def notice(self) -> Mapping[str, Any] | None: ...  # a cloud said the node goes
    @property
    def hung(self) -> Mapping[str, Any] | None: ...  # its hang watcher found it stuck
    @property
    def budget(self) -> Mapping[str, Any] | None: ...  # it reached its --max-cost
    @property
    def requeued(self) -> int | None: ...  # stopped after this epoch's snapshot, to go on
    @property
    def slow_ranks(self) -> Sequence[Slow]: ...  # its last epoch's slow ranks


class Backend(Protocol):
    """The verbs of a run's life; see the module docstring. Errors are VmrunErrors. What a
    verb says goes to its `out`: steps as infos, the run's own lines as `out.output`."""

    capabilities: Capabilities  # what it can do for a run (its package's CAPABILITIES)

    def start(
        self, plan: Plan, how: StartOptions, out: Reporter, progress: Progress | None = None
    ) -> RunRef: ...

    def find(
        self, run_id: str | None, *, running_only: bool = False, nodes: Sequence[str] = ()
    ) -> RunRef: ...

    def runs(self) -> tuple[Sequence[RunRow], Sequence[BaseException]]: ...

    def state(self, ref: RunRef) -> tuple[RunState, int | None]: ...

    def follow(
        self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False
    ) -> int: ...

    def read_log(
        self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False
    ) -> None: ...

    def timed_log(self, ref: RunRef, node: str) -> Sequence[tuple[float | None, bytes]]: ...

    def stop(self, ref: RunRef, *, grace: float) -> list[Outcome[StopReport]]: ...

    def outputs(self, ref: RunRef) -> Mapping[str, RunLocation]: ...

    def files_at(self, ref: RunRef) -> FilesAt: ...

    def code_dir(self, project: Path) -> str: ...

    def stacks(self, run_id: str | None, *, hang: bool = False) -> StacksTaken: ...


class _Ended(Protocol):
    @property
    def state(self) -> RunState: ...
    @property
    def exit_code(self) -> int | None: ...


def combined_state(records: Sequence[_Ended]) -> tuple[RunState, int | None]:
    """A multi-node run's state: running while any node runs; else the worst ending (a
    failure, then a lost node, then a stop), with the first non-zero exit code."""
    states = {r.state for r in records}
    for state in (RunState.RUNNING, RunState.PENDING):
        if state in states:
            return state, None
    codes = [r.exit_code for r in records if r.exit_code]
    for state in (RunState.FAILED, RunState.LOST, RunState.STOPPED):
        if state in states:
            return state, codes[0] if codes else None
    return RunState.DONE, 0


def stopped_everywhere(ref: RunRef, outcomes: Sequence[Outcome[StopReport]]) -> None:
    """Raise HostsFailed naming each node not stopped (a failure, or not reached): for a
    caller that must know the run is gone before it goes on."""
    from vmrun.errors import HostsFailed

    failures = {o.host: o.error for o in outcomes if o.error is not None}
    failures.update(ref.unreached)
    if failures:
        raise HostsFailed(failures, total=len(outcomes) + len(ref.unreached))


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do for a run, declared by the backend itself: the refusals of
    `train`, `sweep` and `submit` (vmrun.operations.refusals) are derived from these, so a
    flag the target cannot honour is refused by the capability's name, before anything
    starts. `what`: how an error names the target."""

    what: str
    detach: bool = False  # the run outlives vmrun (--detach)
    several_hosts: bool = False  # torchrun wired across hosts (--master, --nnodes, ...)
    concurrent_starts: bool = False  # a start beside another run of the user's
    fresh: bool = False  # old checkpoints moved aside (--fresh)
    resume: bool = False  # a recorded run continued from its snapshot (train --resume)
    fetch_every: bool = False  # checkpoints pulled while the run is followed
    power_off: bool = False  # the machines powered off after the run (--down-after-run)
    recovery: bool = False  # a lost run brought back (--recover)
    spares: bool = False  # spare hosts that take a lost node's place
    supervisor: bool = False  # a supervisor on a host of the user's choosing
    self_requeue: bool = False  # the job requeues itself (--max-requeues)
    scheduler: bool = False  # batch scheduler options (--nodes, --time, --partition, ...)
    gpu_health: bool = False  # a GPU health check before the start (--ignore-gpu-health)
    data: bool = False  # --data pushed to the nodes
    store: bool = False  # the run's files copied to a bucket (--store)
    images: bool = True  # the run in a container image (--image)
    max_cost: bool = False  # a price per hour, so --max-cost can cap the run
    dry_run: bool = True  # what a start would do, printed, nothing sent (--dry-run)
    queued_sweeps: bool = False  # a sweep's sizes queued at once (sweep --detach)
    own_scripts: bool = False  # the user's own batch script (submit)
    several_nodes: bool = False  # a run across several machines (a sweep's --nodes)
    autostop: bool = False  # vmrun's idle watchdog powers the machines off (setup --autostop)
    container_engine: bool = False  # vmrun installs a container engine there (setup)
    relay_push: bool = False  # pushed folders relayed machine to machine (push)
    # a run's files are on a machine vmrun reaches over a connection (`files_at`); else
    # they are here, read where they are
    files_elsewhere: bool = True

    def lacks(self, name: str) -> bool:
        return not getattr(self, name)


@dataclass(frozen=True)
class Prepared:
    """What a start would do, nothing sent: what `train --dry-run` prints (each backend's
    `prepare(plan, how)`), on every target."""

    lines: tuple[str, ...]


def launch_lines(
    plan: Plan, *, python: str, nnodes: int = 1, script: str | None = None
) -> list[str]:
    """The launch a plan makes, as `--dry-run` shows it (a node's own wiring left out:
    where the nodes meet, and the GPUs where no process count was given, are found when
    the run starts)."""
    from vmrun.runs import launch
    from vmrun.ssh.quoting import join

    args = [*plan.args, *(["--out-dir", "results/RUN_ID"] if plan.is_template else [])]
    if plan.launcher == "torchrun":
        argv = launch.torchrun_argv(
            python,
            script or str(plan.script),
            args,
            nproc_per_node=plan.nproc or "auto",
            max_restarts=plan.max_restarts,
            nnodes=str(nnodes),
            rdzv_endpoint="MASTER:PORT" if nnodes > 1 else None,
            rdzv_id="RUN_ID" if nnodes > 1 else None,
        )
    else:
        argv = launch.python_argv(python, script or str(plan.script), args)
    lines = [f"# launch ({plan.launcher}):", join(argv)]
    if plan.launcher == "torchrun" and not plan.nproc:
        lines.append("# --nproc-per-node: one process per GPU found there (else CPU processes)")
    if plan.env:
        lines.append(f"# with {', '.join(sorted(plan.env))} from --env (values not shown)")
    image = plan.containers.image or (plan.containers.defaults or {}).get("image")
    if image:
        lines.append(f"# in the image {image}")
    return lines


def untimed_log(backend: Backend, ref: RunRef) -> list[tuple[float | None, bytes]]:
    """`timed_log` where the backend keeps no line's time: the log as `read_log` gives it,
    each line with no time."""
    from vmrun.reporting import Recorder

    kept = Recorder()
    backend.read_log(ref, kept)
    return [(None, line) for line in b"".join(kept.outputs).splitlines()]
