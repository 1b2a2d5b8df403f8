"""`LocalBackend`: a run on this machine (`--local`) behind the verbs a run on hosts or a
cluster has. A run here lives in this terminal (vmrun.runs.local launches, streams and stops
it), so `start` runs it to its end and the ref it returns carries how it ended; `follow`
gives that back, and `follow_and_tell` tells it from here (nothing else could). The other
verbs read the runs' records under the project's results/<run-id>/ (records.py): a run
another terminal runs is found, read and stopped from here as one on a host is."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from time import sleep as time_sleep
from typing import TYPE_CHECKING

from vmrun.backends.api import (
    FilesAt,
    NodeRecord,
    Prepared,
    RunRef,
    StacksTaken,
    StartOptions,
    StopReport,
    launch_lines,
)
from vmrun.backends.local import CAPABILITIES
from vmrun.backends.local.records import HERE, LocalRun, launcher_parent, local_runs
from vmrun.runs.state import RunState

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from vmrun.config import Settings
    from vmrun.errors import VmrunError
    from vmrun.notify.send import Notify
    from vmrun.reporting import Reporter
    from vmrun.runs.outputs import RunLocation
    from vmrun.runs.plan import Plan
    from vmrun.ssh.group import Outcome
    from vmrun.transfer.types import Progress


SETTLE_S = 5.0  # a run's vmrun records its end this soon after the run's last process


class LocalBackend:
    """Runs on this machine; `verbose`: torchrun's banner and c10d's warnings shown too;
    `on_start`: told the run once its record exists (a sweep keeps its id)."""

    capabilities = CAPABILITIES

    def __init__(
        self,
        settings: Settings,
        *,
        verbose: bool = False,
        on_start: Callable[[RunRef], None] | None = None,
    ):
        self.settings = settings
        self.verbose = verbose
        self.on_start = on_start
        self.project = settings.project_dir or Path.cwd()
        self.ended: dict[str, int] = {}  # run id -> its exit code (a run here has ended)

    def prepare(self, plan: Plan, how: StartOptions | None = None) -> Prepared:
        """The launch `start` would make here, nothing run (the GPUs are not probed: the
        process count is the one given, else one per GPU torch sees)."""
        lines = [
            f"# on {HERE}, in {plan.project}; the run's files in results/RUN_ID/",
            *launch_lines(plan, python=sys.executable),
        ]
        for path, where in plan.data:
            lines.append(f"# --data {path}{f':{where}' if where else ''} is read where it is")
        return Prepared(tuple(lines))

    def start(
        self, plan: Plan, how: StartOptions, out: Reporter, progress: Progress | None = None
    ) -> RunRef:
        """Run the plan here to its end (it lives in this terminal: Ctrl-C stops it); a
        failed or stopped run raises, as `follow` would elsewhere."""
        from vmrun.containers.refusals import naming_refusals
        from vmrun.errors import UsageError
        from vmrun.runs.local import run_local

        if how.resume:  # refused before it gets here (its capabilities): never run instead
            raise UsageError(
                f"--resume needs the capability: resume, which {self.capabilities.what} lacks",
                code="flags-conflict",
            )
        started: list[str] = []

        def note(rid: str) -> None:
            started.append(rid)
            if self.on_start is not None:
                self.on_start(RunRef(rid, (HERE,)))

        with naming_refusals(out) as watched:  # a container its runtime would not start
            code = run_local(plan, verbose=self.verbose, out=watched, on_start=note)
        self.project = plan.project
        rid = started[0] if started else ""
        self.ended[rid] = code
        return RunRef(rid, (HERE,))

    def state(self, ref: RunRef) -> tuple[RunState, int | None]:
        if ref.run_id in self.ended:  # this one ran in this process, to its end
            code = self.ended[ref.run_id]
            return (RunState.DONE if code == 0 else RunState.FAILED), code
        run = self._run(ref.run_id)
        return run.state, run.exit_code

    def follow(self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False) -> int:
        """A run started here has ended by the time `start` returns: its exit code. One
        another terminal runs is followed in its log to its end; a failure raises."""
        from vmrun.errors import run_failed, run_stopped

        if ref.run_id in self.ended:
            return self.ended[ref.run_id]
        log = self._dir(ref.run_id) / "train.log"
        at = self._print(log, out, last=last) if last else 0
        while (run := self._run(ref.run_id)).running:
            at = self._print(log, out, start=at, whole=False)
            time_sleep(0.2)
        self._print(log, out, start=at)
        if run.state == RunState.DONE:
            return 0
        if run.state == RunState.STOPPED:
            raise run_stopped(ref.run_id, host=HERE)
        raise run_failed(ref.run_id, f"failed (exit {run.exit_code})", run.exit_code, host=HERE)

    def follow_and_tell(
        self, ref: RunRef, notify: Notify | None, out: Reporter, *, verbose: bool = False
    ) -> int:
        code = self.follow(ref, out, verbose=verbose)
        if notify and ref.run_id:
            self.tell_end(ref, notify, out, code)
        return code

    def tell_end(
        self,
        ref: RunRef,
        notify: Notify,
        out: Reporter,
        code: int,
        failure: VmrunError | None = None,
    ) -> None:
        """A run on this machine told from here (nothing else could tell it)."""
        import socket

        from vmrun.notify.send import message, report, send
        from vmrun.results.history import read_metrics

        event = "end" if code == 0 else "fail"
        if event not in notify.on:
            return
        rid = ref.run_id
        metrics = self.project / "results" / rid / "metrics.jsonl"
        epochs = read_metrics(metrics) if metrics.exists() else ()
        last = epochs[-1] if epochs else {}
        loss = last.get("loss")
        title, body = message(
            event,
            run=rid,
            exit=code,
            where=f"{socket.gethostname()} (--local)",
            epochs=int(last["epoch"]) if "epoch" in last else None,
            loss=f"{loss:.4g}" if loss is not None else None,
            fetch=f"results/{rid}/ here",
        )
        report(send(notify.targets, title, body, event), out, event)

    def detached(self, ref: RunRef) -> str:
        return ""  # never: a run here stays in this terminal (refused before it starts)

    def find(
        self, run_id: str | None, *, running_only: bool = False, nodes: Sequence[str] = ()
    ) -> RunRef:
        """A run recorded here by id, else the newest (`running_only`: of those running)."""
        from vmrun.errors import UsageError

        runs = [r for r in local_runs(self.project) if not running_only or r.running]
        chosen = [r for r in runs if r.id == run_id] if run_id else runs[-1:]
        if not chosen:
            what = f"run {run_id}" if run_id else "a running run" if running_only else "a run"
            raise UsageError(
                f"{what} is not recorded in {self.project / 'results'}",
                hint="`vmrun status` lists the runs",
                code="run-not-found",
            )
        run = chosen[0]
        record = NodeRecord(HERE, run.state, run.exit_code, run.record, started=run.started)
        return RunRef(run.id, (HERE,), {HERE: record})

    def runs(self) -> tuple[Sequence[LocalRun], Sequence[BaseException]]:
        return local_runs(self.project), ()

    def read_log(self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False) -> None:
        self._print(self._dir(ref.run_id) / "train.log", out, last=last)

    def timed_log(self, ref: RunRef, node: str) -> list[tuple[float | None, bytes]]:
        """The log, its lines with no time (nothing here records when each was written)."""
        from vmrun.backends.api import untimed_log

        return untimed_log(self, ref)

    def stop(self, ref: RunRef, *, grace: float) -> list[Outcome[StopReport]]:
        """What Ctrl-C in the run's terminal does, asked of the vmrun that runs it: SIGTERM
        (the run's whole tree stopped, its end recorded); asked again after `grace`, it kills
        at once. A run already ended: nothing signalled."""
        import os
        import signal
        import time

        from vmrun.ssh.group import Outcome

        began = time.monotonic()
        run = self._run(ref.run_id)
        parent = launcher_parent(run.end.pid) if run.running and run.end.pid else None
        if parent is None:
            return [Outcome(HERE, StopReport(HERE, 0, 0), None, time.monotonic() - began)]
        killed = 0
        for deadline in (grace, grace + 30.0):
            os.kill(parent, signal.SIGTERM)
            if self._ends_within(ref.run_id, deadline):
                break
            killed = 1
        if self._run(ref.run_id).running:
            from vmrun.errors import RemoteError

            error = RemoteError(f"run {ref.run_id} did not stop", code="stop-failed")
            return [Outcome(HERE, None, error, time.monotonic() - began)]
        return [Outcome(HERE, StopReport(HERE, 1, killed), None, time.monotonic() - began)]

    def outputs(self, ref: RunRef) -> Mapping[str, RunLocation]:
        """Its files and record are one folder, results/<run-id>/ (absolute)."""
        from vmrun.runs.outputs import RunLocation

        where = str(self._dir(ref.run_id))
        return {HERE: RunLocation(ref.run_id, HERE, where, where)}

    def files_at(self, ref: RunRef) -> FilesAt:
        """Nowhere to reach: a run's files here are read where they are (results/<run-id>/)."""
        from vmrun.errors import UsageError

        raise UsageError(
            f"run {ref.run_id} ran on {HERE}: its files are in {self._dir(ref.run_id)}",
            code="flags-conflict",
        )

    def code_dir(self, project: Path) -> str:
        """The project's code is where it is."""
        return str(project.resolve())

    def stacks(self, run_id: str | None, *, hang: bool = False) -> StacksTaken:
        """A run here shows its stacks in its own terminal: not taken from another."""
        from vmrun.errors import UsageError

        raise UsageError(
            f"a run on {HERE} is not reached by `vmrun stacks`: py-spy dump its processes",
            code="flags-conflict",
        )

    def _dir(self, run_id: str) -> Path:
        return self.project / "results" / run_id

    def _run(self, run_id: str, settle: float = SETTLE_S) -> LocalRun:
        """The run as its record says; one whose process has just ended is given `settle`
        seconds for its vmrun to record how (else it is LOST: that vmrun was killed)."""
        import time

        deadline = time.monotonic() + settle
        while True:
            run = next((r for r in local_runs(self.project) if r.id == run_id), None)
            if run is None:
                self.find(run_id)  # raises run-not-found
                raise AssertionError(run_id)
            if run.state != RunState.LOST or time.monotonic() > deadline:
                return run
            time.sleep(0.05)

    def _ends_within(self, run_id: str, seconds: float) -> bool:
        import time

        deadline = time.monotonic() + seconds
        while self._run(run_id).running:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _print(
        self, log: Path, out: Reporter, *, start: int = 0, last: int = 0, whole: bool = True
    ) -> int:
        """The log from byte `start` to `out` (`last`: its last lines; `whole`: a last line
        not ended yet too); where what was printed ends."""
        try:
            data = log.read_bytes()[start:]
        except FileNotFoundError:
            return start
        if last:
            data = b"".join(data.splitlines(keepends=True)[-last:])
            out.output(data)
            return start + len(log.read_bytes()[start:])
        end = len(data) if whole else data.rfind(b"\n") + 1
        if end:
            out.output(data[:end])
        return start + end
