"""What each page shows, as JSON-ready values, from the operations the CLI calls: the runs
(`status --json`'s objects), a run's log (`logs -f`'s follow), its metrics (what `report`
and `plot` read, `fetch metrics` first while it runs), its stacks (`stacks`) and its stop
(`stop`). Every call blocks (SSH); the server runs them off its loop."""

from __future__ import annotations

import contextlib
import math
import posixpath
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.config import Settings
from vmrun.errors import UsageError, VmrunError
from vmrun.reporting import Reporter

if TYPE_CHECKING:
    from vmrun.backends.api import RunRow
    from vmrun.dashboard.cluster_gpus import ClusterGpus
    from vmrun.runs.store_runs import StoreRuns

LIVE = ("running", "pending", "recovering", "queued", "starting")
FIRST_FRESH_S = 5.0  # the server's first listing answers the first page asking this soon after
BUCKET_EVERY_S = 60.0  # the bucket listed again at most this often (the hosts: each refresh)


@dataclass
class Views:
    """The project's runs as `vmrun status` sees them (`hosts`, `cluster`: as -H and -C
    narrow it; `store`: a bucket's runs too, by default vmrun.toml's). A run is acted on
    where the last listing saw it (its hosts, or its cluster), as `vmrun stop RUN -H ...`
    would be; one only in its bucket is read from there, and has nothing to act on."""

    settings: Settings
    hosts: list[str] | None = None
    cluster: str | None = None
    store: str | None = None
    _seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _gpus: GpuWatch | None = None
    _listing: Future[dict[str, Any]] | None = None
    _joins: int = 0  # asks that joined the listing under way
    _first: tuple[float, dict[str, Any]] | None = None  # (when, what): warm's, if none joined
    _clusters: ClusterGpus | None = None
    # each run's recoveries as its nodes' records counted them when last fetched in full
    _recoveries_fetched: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    _bucket: StoreRuns | None = None

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
        import importlib.util

        from vmrun.operations.status import gather

        store = self.store or self.settings.store or None
        notes: list[str] = []
        aws = importlib.util.find_spec("boto3") is not None  # the `aws` extra, not imported
        if store and not self.store and not aws:  # vmrun.toml's store, not asked for
            notes.append(f"{store}: its runs are not read without pip install 'vmrun[aws]'")
            store = None
        bucket = self._lister(store) if store else None
        found = gather(
            self.settings,
            hosts=self.hosts,
            cluster=self.cluster,
            watchdog=False,
            store=store,
            bucket=bucket,
        )
        if bucket is not None and bucket.age >= 1:
            notes.append(f"{store}: its runs as listed {int(bucket.age)} s ago")
        runs = found.runs()
        with self._lock:
            self._seen.update({r["run"]: r for r in runs})
        return {"runs": runs, "unreached": found.places(), "notes": notes}

    def _lister(self, store: str) -> StoreRuns:
        """The bucket's lister, kept: its client, the record objects read, its listing
        for BUCKET_EVERY_S."""
        from vmrun.runs.store_runs import StoreRuns
        from vmrun.store_url import parse_store

        place = parse_store(store)
        with self._lock:
            if self._bucket is None or self._bucket.store != place:
                credentials = self.settings.store_credentials
                self._bucket = StoreRuns(place, credentials, every=BUCKET_EVERY_S)
            return self._bucket

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
        copy = self._copy(run_id)
        if copy is not None:
            raise UsageError(
                f"run {run_id} is only in its bucket ({copy}): no host or cluster listed it,"
                " and this needs its hosts",
                hint=f"its files: vmrun fetch results --store {posixpath.dirname(copy)}"
                f" --run {run_id}",
                code="run-not-found",
            )
        with self._lock:
            found = self._seen.get(run_id)
        run = found if found is not None else self.run(run_id)
        if run.get("cluster"):
            return {"hosts": None, "cluster": run["cluster"]}
        return {"hosts": list(run.get("hosts") or []) or self.hosts, "cluster": None}

    def _copy(self, run_id: str) -> str | None:
        """The run's place in its bucket, where only its copy there was listed."""
        with self._lock:
            found = self._seen.get(run_id)
        run = found if found is not None else self.run(run_id)
        return None if run.get("hosts") or run.get("cluster") else run.get("bucket")

    def follow(self, run_id: str) -> Callable[[Reporter], str]:
        """What a follower runs: `logs -f RUN`, all of the log then each new line; how it
        ended, in words. A run only in its bucket: its log as copied there."""

        def follow(out: Reporter) -> str:
            from vmrun.operations.logs import run_log

            copy = self._copy(run_id)
            if copy is not None:
                return self._copied_log(run_id, copy, out)

            with run_log(self.settings, run_id, **self._place(run_id)) as log:
                for node, why in log.ref.unreached.items():
                    out.warn(f"{node}: not followed there ({why})")
                code = log.follow(out)
            return f"run {run_id} ended (exit {code})"

        return follow

    def _copied_log(self, run_id: str, copy: str, out: Reporter) -> str:
        from vmrun.runs.store_runs import LOG_TAIL, read_log
        from vmrun.store_url import parse_store

        s3 = self._lister(self.store or self.settings.store or posixpath.dirname(copy)).client()
        out.output(read_log(s3, parse_store(copy)))
        return f"run {run_id}: its log as its bucket copy holds it (the last {LOG_TAIL >> 20} MiB)"

    def metrics(self, run_id: str) -> dict[str, Any]:
        """Each metric by epoch (`metrics`: name -> [[epoch, value], ...]) and each rank's
        step time, as `report` reads them from results/RUN here; a live run's metrics
        fetched first (`vmrun fetch metrics --run RUN`), so the chart follows it; a run
        only in its bucket's, from there (`--store`) unless here already."""
        from vmrun.dashboard.charts import rank_series_json
        from vmrun.operations.histories import gather

        copy = self._copy(run_id)
        note = None
        if copy is not None:
            place: dict[str, Any] = {}
            note = self._fetch_metrics(run_id, {"store": posixpath.dirname(copy)})
        else:
            place = self._place(run_id)
        if copy is None and self._seen.get(run_id, {}).get("state") in LIVE:
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
            **rank_series_json(history.path),
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

    def events(self, run_id: str) -> dict[str, Any]:
        """The run's timeline (vmrun.operations.timeline, `events`: kind, at, text, node,
        duration_s): its nodes' records as `vmrun status` lists them, what its supervisor
        did as `vmrun report` reads it (`vmrun fetch logs --run RUN --include recoveries`
        first), its snapshots from its master's log (`vmrun logs RUN`, with when each line
        was written). `note`: what could not be read."""
        from vmrun.operations.status import gather
        from vmrun.operations.timeline import timeline

        place = self._place(run_id)
        found = gather(self.settings, watchdog=False, **place)
        rows = [r for r in found.records if r.id == run_id]
        if not rows:
            raise UsageError(f"no run {run_id} where vmrun looked", code="run-not-found")
        notes: list[str] = []
        recoveries = self._recoveries(run_id, place, notes, rows) if _recovered(rows) else []
        saved = self._saved(run_id, place, notes)
        events = timeline(rows, recoveries, saved)
        return {
            "run": run_id,
            "events": [e.to_json() for e in events],
            "note": "; ".join(notes) or None,
        }

    def _recoveries(
        self, run_id: str, place: dict[str, Any], notes: list[str], rows: Sequence[RunRow]
    ) -> list[Any]:
        """Its supervisor's `recoveries` lines, fetched here again only when its nodes'
        records count other recoveries than at the last full fetch."""
        from vmrun.operations.fetch import FetchJob, fetch
        from vmrun.results.report import recoveries_of

        counted = tuple(sorted((r.host, r.recoveries) for r in rows))
        with self._lock:
            fetched = self._recoveries_fetched.get(run_id) == counted
        if not fetched:
            job = FetchJob(
                items=["logs"], settings=self.settings, run=run_id, include=("recoveries",), **place
            )
            try:
                if fetch(job).exit_code != 0:
                    notes.append("the recoveries could not be fetched from every node")
                else:
                    with self._lock:
                        self._recoveries_fetched[run_id] = counted
            except VmrunError as exc:
                notes.append(f"recoveries: {exc.one_line()}")
        here = (self.settings.project_dir or Path.cwd()) / "results" / run_id
        return recoveries_of(here)

    def _saved(
        self, run_id: str, place: dict[str, Any], notes: list[str]
    ) -> list[tuple[float | None, str]]:
        """The master's log lines, each with when it was written where the backend keeps
        that (hosts), else with no time."""
        from vmrun.operations.logs import run_log

        try:
            with run_log(self.settings, run_id, **place) as log:
                ref = log.ref
                node = ref.record.master if ref.record.master in ref.nodes else None
                node = node or (ref.nodes[0] if ref.nodes else None)
                if node is None:
                    return []
                lines = log.backend.timed_log(ref, node)
        except VmrunError as exc:
            notes.append(f"snapshots: {exc.one_line()}")
            return []
        return [
            (w if w is not None and math.isfinite(w) else None, x.decode("utf-8", "replace"))
            for w, x in lines
        ]

    def files(self, run_id: str) -> dict[str, Any]:
        """What `vmrun fetch results --run RUN` would bring here, nothing moved
        (vmrun.operations.fetch.listing): each file's path, kind, size, nodes and whether it
        is here already; their total; the command to copy; the nodes whose listing failed."""
        from vmrun.dashboard.files import KINDS, fetch_command, file_kind
        from vmrun.operations.fetch import FetchJob, listing

        place = self._place(run_id)
        job = FetchJob(items=["results"], settings=self.settings, run=run_id, **place)
        found = listing(job)
        files = [
            {
                "path": f.path,
                "kind": file_kind(f.path),
                "size": f.size,
                "mtime": f.mtime,
                "nodes": list(f.nodes),
                "here": f.here,
            }
            for f in found.files
        ]
        files.sort(key=lambda f: (KINDS.index(f["kind"]), f["path"]))  # the model first
        failed = {node: _line(e) for node, e in found.failed.items()}
        if found.ref is not None:
            failed.update({node: _line(e) for node, e in found.ref.unreached.items()})
        return {
            "run": run_id,
            "files": files,
            "bytes": sum(f.size for f in found.files if f.size > 0),
            "command": fetch_command(run_id, place, given=bool(self.hosts)),
            "failed": failed,
        }

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
        watch shared by every page, started by the first ask, ended when none asks a while."""
        if self.cluster:  # its jobs' GPUs: `cluster_gpus`, listed again as jobs come and go
            return {"hosts": [], "error": None}
        with self._lock:
            if self._gpus is None or self._gpus.ended():  # unasked a while: watched anew
                self._gpus = GpuWatch(self.settings, self.hosts, self.cluster).start()
            watch = self._gpus
        return watch.now()

    # -- the sweeps page and the GPUs of a cluster's jobs ----------------------------------

    def sweeps(self) -> dict[str, Any]:
        """Every sweep under results/ here (vmrun.dashboard.sweeps)."""
        from vmrun.dashboard.sweeps import sweep_list
        from vmrun.operations.histories import project_dir

        return sweep_list(project_dir())

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        """One sweep's sizes, scaling report and plots, as `vmrun sweep` writes them."""
        from vmrun.dashboard.sweeps import sweep_page
        from vmrun.operations.histories import project_dir

        return sweep_page(project_dir(), sweep_id)

    def cluster_gpus(self) -> dict[str, Any]:
        """`watch-gpus -C NAME` for each cluster this server looks at (-C's, else the
        project's clusters unless -H named hosts): one watch per cluster, started by the
        first ask, ended when none asks a while (vmrun.dashboard.cluster_gpus)."""
        from vmrun.dashboard.cluster_gpus import ClusterGpus

        with self._lock:
            if self._clusters is None:
                self._clusters = ClusterGpus(self.settings, self._cluster_names()).start()
            watch = self._clusters
        return watch.now()

    def _cluster_names(self) -> list[str]:
        if self.cluster:
            return [self.cluster]
        if self.hosts:
            return []
        from vmrun.backends.slurm.cluster import project_clusters

        return [c.name for c in project_clusters(self.settings)]


class GpuWatch:
    """`watch-gpus`' FleetWatch, drained in a thread: each host's latest status. A watch
    that could not start (no hosts, no running job on a cluster) says why in `error`. No
    page asking for IDLE_S, it ends (its watches stopped); `ended()`, a new one is due."""

    def __init__(self, settings: Settings, hosts: list[str] | None, cluster: str | None):
        from vmrun.dashboard.cluster_gpus import IDLE_S

        self._args = settings, hosts, cluster
        self._lock = threading.Lock()
        self._hosts: list[dict[str, Any]] = []
        self._error: str | None = None
        self._idle_s = IDLE_S
        self._asked = time.monotonic()
        self._ended = False
        self._thread = threading.Thread(target=self._main, daemon=True, name="watch-gpus")

    def start(self) -> GpuWatch:
        self._thread.start()
        return self

    def now(self) -> dict[str, Any]:
        with self._lock:
            self._asked = time.monotonic()
            return {"hosts": list(self._hosts), "error": self._error}

    def ended(self) -> bool:
        with self._lock:
            return self._ended

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
                    with self._lock:  # decided under the lock: an ask now sees it ended
                        self._hosts = statuses
                        if time.monotonic() - self._asked > self._idle_s:
                            self._ended = True
                            return
        except Exception as exc:  # any: shown as the watch's error, never a frozen page
            with self._lock:
                self._error = _line(exc) if isinstance(exc, VmrunError) else repr(exc)
                self._hosts = []


def _line(error: BaseException) -> str:
    return error.one_line() if isinstance(error, VmrunError) else str(error)


def _recovered(rows: Sequence[RunRow]) -> bool:
    """Its supervisor acted at least once (status counts its `recoveries` lines)."""
    return any(r.recoveries for r in rows)
