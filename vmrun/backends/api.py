"""Where a run executes, behind one interface: what `train`, `logs`, `status`, `stop`, `fetch`
and `--resume` ask of a run, whatever runs it.

The peers: SSH hosts (`vmrun.backends.hosts`: detached process trees recorded under
~/.vmrun/runs/ on each host) and a Slurm cluster through its login node
(`vmrun.backends.slurm`: sbatch/squeue/sacct/scancel); the commands do not care which.
Each call is one verb of a run's life (`start`'s `how` is the backend's own launch options):

- `start`   a plan, detached, and return at once with a `RunRef` (the run outlives vmrun);
- `find`    a recorded run by id (or the newest), as a `RunRef`;
- `runs`    every recorded run (`status`), and the places that did not answer;
- `state`   PENDING / RUNNING / DONE / FAILED / STOPPED / LOST, with the exit code;
- `follow`  its log from a point to the end, every node merged and prefixed, applying the
            failure rule (a failed node stops the others); return 0 or raise its failure;
- `read_log` the log as it is now;
- `stop`    every process of the run, verified: nothing left;
- `outputs` where its files are, per node, for fetch and resume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from vmrun.results.failure import WorkerFailure
from vmrun.runs.state import RunState

if TYPE_CHECKING:
    from vmrun.reporting import Reporter
    from vmrun.runs.plan import Plan
    from vmrun.transfer.types import Progress


@dataclass(frozen=True)
class NodeRecord:
    """One node's view of a run, as its record says (host clock times)."""

    node: str
    state: RunState
    exit_code: int | None
    meta: Mapping[str, Any]
    started: float = 0.0  # this machine's clock when it was started
    first_started: float | None = None  # the node's clock when the first attempt began
    ended: float | None = None
    failure: WorkerFailure | None = None  # torchrun's first failed worker, where it is known


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
    def meta(self) -> Mapping[str, Any]:
        """The run's own record (the newest node record: all nodes share the same plan)."""
        if not self.records:
            return {}
        return max(self.records.values(), key=lambda r: r.started).meta


@dataclass(frozen=True)
class StopReport:
    node: str
    signalled: int  # processes sent SIGTERM (0: the run had already ended there)
    killed: int  # of those, how many needed SIGKILL


class Backend(Protocol):
    """The verbs of a run's life; see the module docstring. Errors are VmrunErrors. What a
    verb says goes to its `out`: steps as infos, the run's own lines as `out.output`."""

    def start(
        self, plan: Plan, how: Any, out: Reporter, progress: Progress | None = None
    ) -> RunRef: ...

    def find(self, run_id: str | None, *, running_only: bool = False) -> RunRef: ...

    def runs(self) -> tuple[Sequence[Any], Sequence[BaseException]]: ...

    def state(self, ref: RunRef) -> tuple[RunState, int | None]: ...

    def follow(
        self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False
    ) -> int: ...

    def read_log(
        self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False
    ) -> None: ...

    def stop(self, ref: RunRef, *, grace: float) -> list[StopReport]: ...

    def outputs(self, ref: RunRef) -> Mapping[str, Any]: ...


def combined_state(records: Sequence[NodeRecord]) -> tuple[RunState, int | None]:
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
