"""What each page shows, as JSON-ready values, from the operations the CLI calls: the runs
(`status --json`'s objects), a run's log (`logs -f`'s follow), its metrics (what `report`
and `plot` read, `fetch metrics` first while it runs), its stacks (`stacks`) and its stop
(`stop`). Every call blocks (SSH); the server runs them off its loop."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from vmrun.config import Settings
from vmrun.errors import UsageError, VmrunError
from vmrun.reporting import Reporter

LIVE = ("running", "pending", "recovering", "queued", "starting")
FIRST_FRESH_S = 5.0  # the server's first listing answers the first page asking this soon after


@dataclass
class Views:
    """The project's runs as `vmrun status` sees them (`hosts`, `cluster`: as -H and -C
    narrow it). A run is acted on where the last listing saw it (its hosts, or its
    cluster), as `vmrun stop RUN -H ...` would be."""

    settings: Settings
    hosts: list[str] | None = None
    cluster: str | None = None
    _seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _gpus: GpuWatch | None = None
    _listing: Future[dict[str, Any]] | None = None
    _joins: int = 0  # asks that joined the listing under way
    _first: tuple[float, dict[str, Any]] | None = None  # (when, what): warm's, if none joined

    def runs(self, *, keep: bool = False) -> dict[str, Any]:
        """`status --json`'s objects: `runs`, and `unreached` (the places that did not
        answer, each with its error). Asked while a listing is under way (several pages,
        the server's own first one), the answer is that listing's: hosts are asked once.
        `keep`: if no one joined, this listing answers the next ask, within FIRST_FRESH_S."""
        with self._lock:
            first, self._first = self._first, None
            if first is not None and time.monotonic() - first[0] < FIRST_FRESH_S:
                return first[1]
            flight = self._listing
            mine = flight is None
            if flight is None:
                flight = self._listing = Future()
                self._joins = 0
            else:
                self._joins += 1
        if not mine:
            return flight.result()
        try:
            listed = self._list()
            flight.set_result(listed)
        except BaseException as exc:
            flight.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._listing = None
                if keep and not self._joins and not flight.exception():
                    self._first = time.monotonic(), flight.result()
        return listed

    def _list(self) -> dict[str, Any]:
        from vmrun.operations.status import gather

        found = gather(self.settings, hosts=self.hosts, cluster=self.cluster, watchdog=False)
        runs = found.runs()
        with self._lock:
            self._seen.update({r["run"]: r for r in runs})
        return {"runs": runs, "unreached": found.places()}

    def warm(self) -> None:
        """The first listing, as the server starts: the hosts are dialed (and listed) while
        the browser opens, and its first ask joins this listing, or, coming soon after it
        ended, is answered by it (not listed again)."""
        with contextlib.suppress(VmrunError):
            self.runs(keep=True)

    def run(self, run_id: str) -> dict[str, Any]:
        """One run's object, as the runs listing has it (listed afresh)."""
        for found in self.runs()["runs"]:
            if found["run"] == run_id:
                return dict(found)
        raise UsageError(f"no run {run_id} where vmrun looked", code="run-not-found")

    def _place(self, run_id: str) -> dict[str, Any]:
        """Where to reach the run: `hosts` or `cluster`, as `status` listed it."""
        with self._lock:
            found = self._seen.get(run_id)
        run = found if found is not None else self.run(run_id)
        if run.get("cluster"):
            return {"hosts": None, "cluster": run["cluster"]}
        return {"hosts": list(run.get("hosts") or []) or self.hosts, "cluster": None}

    def follow(self, run_id: str) -> Callable[[Reporter], str]:
        """What a follower runs: `logs -f RUN`, all of the log then each new line; how it
        ended, in words."""

        def follow(out: Reporter) -> str:
            from vmrun.operations.logs import run_log

            with run_log(self.settings, run_id, **self._place(run_id)) as log:
                for node, why in log.ref.unreached.items():
                    out.warn(f"{node}: not followed there ({why})")
                code = log.follow(out)
            return f"run {run_id} ended (exit {code})"

        return follow

    def metrics(self, run_id: str) -> dict[str, Any]:
        """Each metric by epoch (`metrics`: name -> [[epoch, value], ...]) and each rank's
        step time, as `report` reads them from results/RUN here; a live run's metrics
        fetched first (`vmrun fetch metrics --run RUN`), so the chart follows it."""
        from vmrun.operations.histories import gather

        place = self._place(run_id)
        note = None
        if self._seen.get(run_id, {}).get("state") in LIVE:
            note = self._fetch_metrics(run_id, place)
        problems: list[VmrunError] = []
        try:
            (history,) = gather(
                [run_id], settings=lambda: self.settings, left_out=problems, **place
            )
        except VmrunError as exc:
            why = (problems[0] if problems else exc).one_line()
            return {"run": run_id, "metrics": {}, "rank_step_s": None, "note": why}
        return {
            "run": run_id,
            "metrics": {name: history.values(name) for name in history.metric_names},
            "rank_step_s": list(history.rank_step_s) if history.rank_step_s else None,
            "note": note,
        }

    def _fetch_metrics(self, run_id: str, place: dict[str, Any]) -> str | None:
        from vmrun.operations.fetch import FetchJob, fetch

        job = FetchJob(items=["metrics"], settings=self.settings, run=run_id, **place)
        try:
            fetched = fetch(job)
        except VmrunError as exc:
            return exc.one_line()
        return None if fetched.exit_code == 0 else "some nodes' metrics could not be fetched"

    def stacks(self, run_id: str) -> dict[str, Any]:
        """`vmrun stacks RUN`: each rank's stack (`ranks`, as `--json`), ranks in the same
        place printed once (`lines`), the nodes that gave none (`failed`)."""
        from vmrun.operations.stacks import take
        from vmrun.runs.stacks import as_json

        taken = take(self.settings, run_id, **self._place(run_id))
        return {
            "run": taken.run_id,
            "lines": taken.lines(),
            "ranks": [as_json(s) for s in taken.stacks],
            "failed": taken.failed,
            "saved": str(taken.saved) if taken.saved else None,
        }

    def stop(self, run_id: str) -> dict[str, Any]:
        """`vmrun stop RUN`: each node's outcome, and the nodes not reached."""
        from vmrun.operations.stop import stop

        self._first = None  # a listing from before the stop answers no one
        stopped = stop(self.settings, run_id, **self._place(run_id))
        nodes = []
        for outcome in stopped.outcomes:
            res = outcome.value
            nodes.append(
                {
                    "node": outcome.host,
                    "error": outcome.error and _line(outcome.error),
                    "signalled": res.signalled if res else None,
                    "killed": res.killed if res else None,
                }
            )
        unreached = {node: _line(e) for node, e in stopped.ref.unreached.items()}
        return {
            "run": stopped.run_id,
            "nodes": nodes,
            "unreached": unreached,
            "exit": stopped.exit_code,
        }

    def gpus(self) -> dict[str, Any]:
        """What `vmrun watch-gpus --json` says of each host now (`hosts`, host order): one
        watch for the server's life, started by the first ask, shared by every page."""
        with self._lock:
            if self._gpus is None:
                self._gpus = GpuWatch(self.settings, self.hosts, self.cluster).start()
            watch = self._gpus
        return watch.now()


class GpuWatch:
    """`watch-gpus`' FleetWatch, drained in a thread: each host's latest status. A watch
    that could not start (no hosts, no running job on a cluster) says why in `error`."""

    def __init__(self, settings: Settings, hosts: list[str] | None, cluster: str | None):
        self._args = settings, hosts, cluster
        self._lock = threading.Lock()
        self._hosts: list[dict[str, Any]] = []
        self._error: str | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="watch-gpus")

    def start(self) -> GpuWatch:
        self._thread.start()
        return self

    def now(self) -> dict[str, Any]:
        with self._lock:
            return {"hosts": list(self._hosts), "error": self._error}

    def _main(self) -> None:
        from vmrun.operations.gpus import watch

        settings, hosts, cluster = self._args
        try:
            with watch(settings, hosts, cluster=cluster) as fleet_watch:
                if fleet_watch is None:
                    raise UsageError(f"no running job on cluster {cluster}: no GPU to watch")
                while True:
                    fleet_watch.drain(1.0)
                    statuses = [s.to_json() for s in fleet_watch.fleet.statuses()]
                    with self._lock:
                        self._hosts = statuses
        except VmrunError as exc:
            with self._lock:
                self._error = exc.one_line()


def _line(error: BaseException) -> str:
    return error.one_line() if isinstance(error, VmrunError) else str(error)
