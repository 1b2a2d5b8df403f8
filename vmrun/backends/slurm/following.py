"""Following a Slurm run to its end (`train`, `logs -f`): one command on the login node
(vmrun/hostside/slurm_follow.sh) streams the job's log and its state changes; here they
become output lines and infos, and the end becomes an exit code or the run's failure.
Only the scheduler's answer ends a run: while squeue cannot reach the controller the last
state holds (as submitit does), and past a limit vmrun says it cannot tell, never "ended"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from vmrun import hostside
from vmrun.backends.api import RunRef
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.queue import JobState, explain_failure
from vmrun.backends.slurm.stream import JobStream
from vmrun.errors import Detached, Interrupted, OutcomeUnknown, run_failed, run_over_budget
from vmrun.reporting import Reporter
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord
from vmrun.ssh.connection import Connection

HEARTBEAT_S = 15.0


def detached(rid: str, job: str, cluster: str) -> Detached:
    """What Ctrl-C while following says: the job goes on, and how to come back to it."""
    return Detached(
        f"detached from run {rid}; job {job} goes on on cluster {cluster}",
        hint=f"reattach with `vmrun logs -f {rid} -C {cluster}`, stop it with"
        f" `vmrun stop {rid} -C {cluster}`",
    )


def cap_text(record: RunRecord) -> str:
    """The run's --max-cost as run.json recorded it, in its prices' currency."""
    from vmrun.results.cost import money

    cap = record.policy.max_cost
    return money(cap, record.prices.currency if record.prices else None) if cap else "?"


class NeverStarts(Exception):
    def __init__(self, state: JobState, why: str):
        super().__init__(why)
        self.state, self.why = state, why


def run_follower(
    backend: _Cancels,
    ref: RunRef,
    job: str,
    argv: list[str],
    on_output: Callable[[str, bytes], None],
    stream: _Flushes,
) -> None:
    """A follower script on the login node, until the job ends (both followers: a generated
    job's and a user's own script's): a job that can never start is cancelled (which
    raises), Ctrl-C detaches (the job goes on); what it said is flushed either way."""
    try:
        backend.conn.run(argv, on_output=on_output, heartbeat=HEARTBEAT_S)
    except NeverStarts as never:
        stream.flush()
        backend.cancel_never(ref, job, never.state, never.why)
    except (KeyboardInterrupt, Interrupted):
        raise detached(ref.run_id, job, backend.cluster.name) from None
    stream.flush()


class _Flushes(Protocol):
    def flush(self) -> None: ...


class _Cancels(Protocol):
    """What run_follower needs of a backend: the login node, its name, a cancel."""

    conn: Connection
    cluster: Cluster

    def cancel_never(self, ref: RunRef, job: str, state: JobState, why: str) -> None: ...


class _Backend(Protocol):
    """What following needs of vmrun.backends.slurm.backend.SlurmBackend."""

    conn: Connection
    cluster: Cluster
    poll: float
    unanswered_limit: float

    def stream(
        self, ref: RunRef, out: Reporter, on_event: Callable[[str, str], None], verbose: bool
    ) -> JobStream: ...

    def cancel_never(self, ref: RunRef, job: str, state: JobState, why: str) -> None: ...

    def on_requeue(self, ref: RunRef, out: Reporter) -> None: ...


class Follower:
    def __init__(self, backend: _Backend, ref: RunRef, out: Reporter, verbose: bool, last: int = 0):
        self.backend = backend
        self.lines = last
        self.ref = ref
        self.out = out
        self.job = ref.record.job.job_id if ref.record.job else ""
        self.stream = backend.stream(ref, out, self.on_event, verbose)
        self.last: JobState | None = None
        self.end = ""
        self.exits: list[list[str]] = []
        self.failure: WorkerFailure | None = None  # torchrun's first failed worker, if said
        self.lost = ""  # seconds without the controller's answer, when vmrun gave up
        self.moved = ""  # the node the job went to, when its log is there (no shared folder)

    def _state(self, rest: str) -> None:
        state = JobState.parse(rest)
        if state is None or state == self.last:
            return
        self.last = state
        if state.never_starts:
            raise NeverStarts(state, state.never_starts)
        if state.state == "PENDING" and state.reason:
            self.out.info(f"job {self.job} is {state.describe()}")

    def on_event(self, word: str, rest: str) -> None:
        if word == "state":
            self._state(rest)
        elif word == "attempt":
            number, _, tail = rest.partition(" ")
            nodes = tail.split(" nodes ", 1)[1].split() if " nodes " in tail else []
            again = f"--- attempt {number} (requeued) --- " if number != "1" else ""
            self.out.info(f"{again}job {self.job} running on {', '.join(nodes) or '?'}")
        elif word in ("requeue", "failed", "terminated", "warned", "budget"):
            self.out.info(rest)
            if word == "requeue":
                self.backend.on_requeue(self.ref, self.out)
        elif word == "unreachable":
            held = self.last.describe() if self.last else "submitted"
            self.out.info(
                f"squeue cannot reach the controller ({rest.strip() or 'no answer'});"
                f" job {self.job} keeps its last known state ({held}) until it answers"
            )
        elif word == "reachable":
            self.out.info("squeue answers again")
        elif word == "lost":
            self.lost = rest.strip()
        elif word == "end":
            self.end = rest.strip()
        elif word == "moved":
            self.moved = rest.strip()
        elif word == "failure":
            self.failure = WorkerFailure.parse(rest)
        elif word == "exits":
            words = rest.split()
            self.exits = [words[i : i + 3] for i in range(0, len(words) - 2, 3)]

    def _output(self, stream: str, data: bytes) -> None:
        self.stream.feed(data)

    def run(self) -> int:
        self.watch()
        return self.verdict()

    def watch(self, here: bool = False) -> None:
        """The job's log and states on this node until it ends; `here` (a cluster without
        a shared folder): or until it is placed on another node (`moved` names it)."""
        job = self.ref.record.job
        record, poll = job.record_dir if job else "", f"{self.backend.poll:g}"
        limit = f"{self.backend.unanswered_limit:.0f}"
        argv = [
            *hostside.command("slurm_follow.sh"),
            record,
            self.job,
            str(self.lines),
            poll,
            limit,
            *(["1"] if here else []),
        ]
        run_follower(self.backend, self.ref, self.job, argv, self._output, self.stream)

    def verdict(self) -> int:
        rid, cluster = self.ref.run_id, self.backend.cluster.name
        if self.lost:
            raise OutcomeUnknown(
                f"squeue has not reached the controller for {self.lost} s; job {self.job}"
                f" (run {rid}) may still be running",
                host=cluster,
                hint=f"see `vmrun status -C {cluster}` later, or reattach with"
                f" `vmrun logs -f {rid} -C {cluster}`",
            )
        code_text = self.exits[-1][1] if self.exits else ""
        if code_text == "budget":  # the job stopped itself at --max-cost, its work saved
            raise run_over_budget(rid, cap_text(self.ref.record), host=cluster)
        if self.end == "COMPLETED" or (not self.end and code_text == "0"):
            return 0
        code = int(code_text) if code_text.isdigit() else 1
        end = self.end or ("FAILED" if code_text.isdigit() else "ended")
        detail = f", exit code {code_text}" if code_text.isdigit() else ""
        if code_text.isdigit() and self.failure is not None:
            detail += f": {self.failure.describe()}"
        raise run_failed(
            rid,
            f"failed: job {self.job} {explain_failure(end)}{detail}",
            code,
            host=cluster,
            hint=f"see `vmrun logs {rid} -C {cluster}`",
        )
