"""`LocalBackend`: a run on this machine (`--local`) behind the verbs a run on hosts or a
cluster has. A run here lives in this terminal (vmrun.runs.local launches, streams and stops
it), so `start` runs it to its end and the ref it returns carries how it ended; `follow`
gives that back, and `follow_and_tell` tells it from here (nothing else could)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.backends.api import Prepared, RunRef, StartOptions, launch_lines
from vmrun.backends.local import CAPABILITIES
from vmrun.runs.state import RunState

if TYPE_CHECKING:
    from vmrun.config import Settings
    from vmrun.errors import VmrunError
    from vmrun.notify.send import Notify
    from vmrun.reporting import Reporter
    from vmrun.runs.plan import Plan
    from vmrun.transfer.types import Progress

HERE = "this machine"


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
        self.project = Path.cwd()
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
        from vmrun.runs.local import run_local

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
        return RunState.DONE, self.ended.get(ref.run_id)

    def follow(self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False) -> int:
        """The run has ended by the time `start` returns: its exit code."""
        return self.ended.get(ref.run_id, 0)

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
