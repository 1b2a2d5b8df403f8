"""The dashboard's sweeps page and the GPUs of a cluster's jobs, with files and fakes behind
them: a sweep's report is the one `vmrun sweep` writes (the same rows, cells and plotted
points), the endpoints are behind the token, and the clusters' watch follows jobs as they
start and end."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from results_fixtures import epochs, local_run

pytest.importorskip("aiohttp")

from aiohttp.test_utils import TestClient, TestServer

from vmrun.dashboard.access import HEADER, Access
from vmrun.dashboard.app import make_app
from vmrun.dashboard.sweeps import sweep_list, sweep_page
from vmrun.errors import RemoteError, UsageError
from vmrun.runs.state import RunState
from vmrun.runs.sweep import Size, Sweep, save

SWEEP = "sweep-20260101-120000-ab12"


def _sweep(project: Path) -> Sweep:
    """A sweep of three sizes: two done (their runs fetched here), one failed."""
    results = project / "results"
    local_run(results, "r-1x1", epochs(3, world=1, rate=1000.0), nproc="1")
    local_run(results, "r-1x2", epochs(3, world=2, rate=1800.0, loss0=0.9), nproc="2")
    sizes = [
        Size(1, 1, "r-1x1", RunState.DONE, values={"lr": 0.1}, tag="lr0.1"),
        Size(1, 2, "r-1x2", RunState.DONE, values={"lr": 0.1}, tag="lr0.1"),
        Size(2, 2, "r-2x2", RunState.FAILED, "exited with 1", {"lr": 0.1}, "lr0.1"),
    ]
    sweep = Sweep(SWEEP, {"hosts": ["n1", "n2"]}, {"epochs": 3}, sizes)
    save(project, sweep)
    return sweep


def test_a_sweeps_page_is_the_report_and_plots_vmrun_sweep_writes(tmp_path: Path) -> None:
    from vmrun.operations.sweep_run import write_results
    from vmrun.results.report import table

    sweep = _sweep(tmp_path)
    rows, written = write_results(tmp_path, sweep)
    page = json.loads(json.dumps(sweep_page(tmp_path, SWEEP), default=str))
    on_disk = json.loads((tmp_path / "results" / SWEEP / "report.json").read_text())
    assert page["rows"] == on_disk  # the very numbers `vmrun sweep` (and `report`) give
    heads, numeric, cells = table(rows)
    assert page["table"] == {
        "heads": list(heads),
        "numeric": sorted(numeric),
        "rows": [list(c) for c in cells],
    }
    assert [r["run"] for r in page["rows"]] == ["r-1x1", "r-1x2"]
    assert page["rows"][1]["speedup"] == pytest.approx(1.8)
    assert page["note"].startswith("speed-up: samples/s over r-1x1")
    assert [(s["label"], s["state"], s["run"]) for s in page["sizes"]] == [
        ("1x1-lr0.1", "done", "r-1x1"),
        ("1x2-lr0.1", "done", "r-1x2"),
        ("2x2-lr0.1", "failed", "r-2x2"),
    ]
    assert page["sizes"][2]["detail"] == "exited with 1" and page["where"] == "hosts n1, n2"
    (loss,) = page["plots"]  # loss.png's lines: one per run, a point per epoch
    assert loss["metric"] == "loss" and [p.name for p in written][-1:] in ([], ["loss.png"])
    assert [len(s["points"]) for s in loss["series"]] == [3, 3]
    assert loss["series"][1]["points"][0] == [1.0, 0.9]
    assert "lr=0.1" in loss["series"][0]["label"]  # the legend's note, as the PNG's


def test_the_sweeps_list_names_each_sweeps_runs(tmp_path: Path) -> None:
    _sweep(tmp_path)
    bad = tmp_path / "results" / "sweep-20250101-000000-zz99"
    bad.mkdir()
    (bad / "sweep.json").write_text("{not json")
    (listed, broken) = sweep_list(tmp_path)["sweeps"]  # newest first
    assert listed["id"] == SWEEP and listed["runs"] == {
        "r-1x1": "1x1-lr0.1",
        "r-1x2": "1x2-lr0.1",
        "r-2x2": "2x2-lr0.1",
    }
    assert listed["states"] == {"done": 2, "failed": 1} and listed["sizes"] == 3
    assert broken["id"] == bad.name and "unreadable" in broken["error"]
    with pytest.raises(UsageError) as caught:
        sweep_page(tmp_path, "sweep-20990101-000000-none")
    assert caught.value.code == "run-not-found"  # the API's 404


class FakeViews:
    def __init__(self, project: Path) -> None:
        self.project = project

    def sweeps(self) -> dict[str, Any]:
        return sweep_list(self.project)

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        return sweep_page(self.project, sweep_id)

    def cluster_gpus(self) -> dict[str, Any]:
        host = {"host": "c1 (job 7)", "state": "ok", "gpus": [], "processes": []}
        return {"clusters": [{"cluster": "bed", "hosts": [host], "note": None, "error": None}]}

    def follow(self, run_id: str) -> Any:
        raise AssertionError("not asked here")


def test_the_new_endpoints_are_behind_the_token(tmp_path: Path) -> None:
    _sweep(tmp_path)

    async def main() -> None:
        access = Access()
        client = TestClient(TestServer(make_app(FakeViews(tmp_path), access)))  # type: ignore[arg-type]
        await client.start_server()
        try:
            paths = ("/api/sweeps", f"/api/sweeps/{SWEEP}", "/api/gpus/clusters")
            for path in paths:
                refused = await client.get(path)
                assert refused.status == 403, path
                assert "forbidden" in (await refused.text())
                ok = await client.get(path, headers={HEADER: access.token})
                assert ok.status == 200, path
            got = await (
                await client.get(f"/api/sweeps/{SWEEP}", headers={HEADER: access.token})
            ).json()
            assert got["id"] == SWEEP and len(got["table"]["rows"]) == 2
            missing = await client.get("/api/sweeps/sweep-x", headers={HEADER: access.token})
            assert missing.status == 404
            assert (await missing.json())["error"]["code"] == "run-not-found"
        finally:
            await client.close()

    asyncio.run(main())


class FakeWatch:
    """A FleetWatch on one job's node: its status as `watch-gpus --json` has it."""

    def __init__(self, targets: list[str], settings: Any, fleet: Any, **_: Any) -> None:
        self.label = targets[0]
        self.stopped = False
        self.fleet = self
        WATCHES.append(self)

    def start(self) -> FakeWatch:
        return self

    def drain(self, timeout: float) -> list[Any]:
        return []

    def stop(self, wait: float = 3.0) -> None:
        self.stopped = True

    def statuses(self) -> list[Any]:
        return [self]

    def to_json(self) -> dict[str, Any]:
        gpu = {"index": 0, "uuid": "GPU-1", "health": ["xid 79"], "idle_alert": False}
        return {"host": self.label, "state": "ok", "gpus": [gpu], "processes": []}


WATCHES: list[FakeWatch] = []


def test_a_clusters_jobs_are_watched_as_they_start_and_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vmrun.backends.slurm import gpus, session
    from vmrun.backends.slurm.gpus import JobNode
    from vmrun.dashboard import cluster_gpus
    from vmrun.gpus import fleet

    running: list[Any] = [[]]  # what squeue says now: a list of nodes, or an error
    lock = threading.Lock()

    @contextmanager
    def backend(settings: Any, name: str) -> Iterator[str]:
        yield name

    def nodes(slurm: str, run: Any, job: Any) -> list[JobNode]:
        with lock:
            now = running[0]
        if isinstance(now, Exception):
            raise now
        return list(now)

    monkeypatch.setattr(session, "cluster_backend", backend)
    monkeypatch.setattr(gpus, "running_nodes", nodes)
    monkeypatch.setattr(gpus, "node_targets", lambda slurm, ns: [n.label for n in ns])
    monkeypatch.setattr(fleet, "FleetWatch", FakeWatch)
    monkeypatch.setattr(cluster_gpus, "RESCAN_S", 0.05)
    monkeypatch.setattr(cluster_gpus, "TICK_S", 0.01)
    WATCHES.clear()
    watch = cluster_gpus.ClusterGpus(None, ["bed"]).start()  # type: ignore[arg-type]

    def bed() -> dict[str, Any]:
        return watch.now()["clusters"][0]

    try:
        wait_for(lambda: bed()["note"] == "no running job of yours on cluster bed", 10, "no job")
        a, b = JobNode("7", "c1", "r1"), JobNode("8", "c2")
        with lock:
            running[0] = [a, b]
        wait_for(lambda: len(bed()["hosts"]) == 2, 10, "both jobs' nodes")
        assert sorted(h["host"] for h in bed()["hosts"]) == ["c1 (job 7 / r1)", "c2 (job 8)"]
        assert bed()["hosts"][0]["gpus"][0]["health"] == ["xid 79"] and bed()["note"] is None
        with lock:
            running[0] = [b]  # job 7 ended
        wait_for(lambda: [h["host"] for h in bed()["hosts"]] == ["c2 (job 8)"], 10, "job 7 gone")
        assert [w.stopped for w in WATCHES] == [True, False]
        with lock:
            running[0] = RemoteError("listing running jobs failed: down", host="bed")
        wait_for(lambda: bed()["error"] is not None, 10, "the error")
        assert "listing running jobs failed" in bed()["error"]
        assert all(w.stopped for w in WATCHES)
    finally:
        watch.stop()


class Dialled:
    """A cluster as the watch dials it: each dial's time, whether its connection was open
    as each step stopped, and what squeue says now (a list of nodes, or an error)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from vmrun.backends.slurm import gpus, session
        from vmrun.backends.slurm.gpus import JobNode
        from vmrun.gpus import fleet

        self.dials: list[float] = []
        self.open = False
        self.stopped_open: list[bool] = []
        self.running: Any = [JobNode("7", "c1")]
        self.lock = threading.Lock()
        dialled = self

        class Watch(FakeWatch):
            def stop(self, wait: float = 3.0) -> None:
                dialled.stopped_open.append(dialled.open)
                super().stop(wait)

        monkeypatch.setattr(session, "cluster_backend", self.backend)
        monkeypatch.setattr(gpus, "running_nodes", self.nodes)
        monkeypatch.setattr(gpus, "node_targets", lambda slurm, ns: [n.label for n in ns])
        monkeypatch.setattr(fleet, "FleetWatch", Watch)

    @contextmanager
    def backend(self, settings: Any, name: str) -> Iterator[str]:
        with self.lock:
            self.dials.append(time.monotonic())
        self.open = True
        try:
            yield name
        finally:
            self.open = False

    def nodes(self, slurm: str, run: Any, job: Any) -> list[Any]:
        with self.lock:
            now = self.running
        if isinstance(now, Exception):
            raise now
        return list(now)

    def says(self, now: Any) -> None:
        with self.lock:
            self.running = now

    def count(self) -> int:
        with self.lock:
            return len(self.dials)


def test_a_failing_cluster_is_shown_dialled_less_often_and_let_go_when_unasked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Any error is the cluster's (its hosts cleared, its steps stopped while the connection
    is still open); each failure in a row waits longer before the next dial, up to the cap;
    no page asking, the watch ends, and the next ask starts it again."""
    from vmrun.backends.slurm.gpus import JobNode
    from vmrun.dashboard import cluster_gpus

    dialled = Dialled(monkeypatch)
    monkeypatch.setattr(cluster_gpus, "RESCAN_S", 0.02)
    monkeypatch.setattr(cluster_gpus, "TICK_S", 0.005)
    monkeypatch.setattr(cluster_gpus, "BACKOFF_MAX_S", 0.16)
    WATCHES.clear()
    watch = cluster_gpus.ClusterGpus(None, ["bed"]).start()  # type: ignore[arg-type]

    def bed() -> dict[str, Any]:
        return watch.now()["clusters"][0]

    try:
        wait_for(lambda: len(bed()["hosts"]) == 1, 10, "the job's node")
        dialled.says(KeyError("not a VmrunError"))
        wait_for(lambda: bed()["error"] is not None, 10, "the error")
        assert "KeyError" in bed()["error"] and bed()["hosts"] == []
        assert dialled.stopped_open == [True]  # its step stopped before the connection closed
        first = dialled.count()
        wait_for(lambda: dialled.count() >= first + 5, 20, "five more dials")
        with dialled.lock:
            times = dialled.dials[first:]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[0] >= 0.04 and gaps[1] >= 0.08 and gaps[3] >= 0.16  # doubling, capped
        assert gaps[3] < 2.0
        dialled.says([JobNode("7", "c1")])
        wait_for(lambda: bed()["error"] is None and len(bed()["hosts"]) == 1, 10, "back")
        monkeypatch.setattr(cluster_gpus, "IDLE_S", 0.1)  # no page asks from now on
        wait_for(lambda: watch._threads["bed"] is None, 10, "the watch let go")
        assert WATCHES[-1].stopped and dialled.stopped_open[-1] is True
        before = dialled.count()
        watch.now()  # a page asks again: watched again
        wait_for(lambda: dialled.count() > before, 10, "dialled again")
    finally:
        watch.stop()


RUNS = [
    {
        "run": "r-slow",
        "hosts": ["a", "b"],
        "state": "running",
        "slow_ranks": [{"rank": 3, "node": 1, "step_s": 0.4, "typical_s": 0.2, "ratio": 2.0}],
    },
    {"run": "r-hung", "hosts": ["a"], "state": "running", "hung": {"since": 1.0, "host": "a"}},
    {
        "run": "r-budget",
        "hosts": ["b"],
        "state": "stopped",
        "error": {"code": "run-over-budget", "message": "run r-budget stopped at --max-cost 5"},
    },
    {
        "run": "r-back",
        "hosts": ["b"],
        "state": "lost",
        "recoveries": {"count": 1, "last": None, "gave_up": False, "under_way": "1 of 5: lost b"},
    },
    {"run": "r-1x2", "cluster": "bed", "state": "done", "cost": {"amount": 2.5, "currency": "EUR"}},
]


class PageViews(FakeViews):
    """Every view the pages ask for, for a browser."""

    def runs(self) -> dict[str, Any]:
        keys = ("hosts", "cluster", "error", "recoveries", "hung", "slow_ranks", "store", "cost")
        return {"runs": [{**dict.fromkeys(keys), **r} for r in RUNS], "unreached": []}

    def gpus(self) -> dict[str, Any]:
        return {"hosts": [], "error": None}

    def cluster_gpus(self) -> dict[str, Any]:
        gpu = {"index": 0, "uuid": "G", "name": "H100", "health": ["xid 79"], "idle_alert": False}
        host = {"host": "c1 (job 7 / r-1x2)", "state": "ok", "gpus": [gpu], "processes": []}
        return {"clusters": [{"cluster": "bed", "hosts": [host], "note": None, "error": None}]}


def test_the_pages_in_a_browser(tmp_path: Path) -> None:
    """The runs page's states (hung, over budget, recovering), slow ranks, a sweep's runs
    marked and linked; the sweep's page with its table and plot; a cluster's job's GPUs."""
    from browser import chromium

    _sweep(tmp_path)

    async def main() -> None:
        access = Access()
        server = TestServer(make_app(PageViews(tmp_path), access), host="127.0.0.1")  # type: ignore[arg-type]
        await server.start_server()
        try:
            async with chromium(tmp_path) as page:
                await page.call("Page.navigate", url=f"{server.make_url('/')}?token={access.token}")
                cells = (
                    "(id) => [...document.querySelector(`tr[data-run='${id}']`).children]"
                    ".map((c) => c.textContent)"
                )
                await page.until(
                    "document.querySelectorAll('#runs tbody tr').length === 5", 20, "5 rows"
                )
                row = lambda rid: page.value(f"({cells})('{rid}')")  # noqa: E731
                assert (await row("r-hung"))[2] == "hung"
                assert (await row("r-budget"))[2].startswith("over budget")
                assert (await row("r-back"))[2] == "recovering"
                assert (await row("r-slow"))[9] == "r3 (node 1) 2x"
                done = await page.until(
                    f"(() => {{ const r = ({cells})('r-1x2'); return r[10] !== '-' && r; }})()",
                    20,
                    "the sweep's mark",
                )
                assert done[10] == f"{SWEEP} 1x2-lr0.1" and done[6] == "2.50 EUR"
                options = await page.value(
                    "[...document.getElementById('state-filter').options].map((o) => o.value)"
                )
                assert {"hung", "over budget", "recovering", "running", "done"} <= set(options)
                await page.value(
                    "document.querySelector(`tr[data-run='r-1x2'] a[href^='#/sweep/']`).click()"
                )
                plot = "document.querySelector('.sweep-chart[data-metric=\"loss\"]')"
                assert (
                    await page.until(f"{plot} && {plot}.dataset.points", 20, "the loss plot") == "3"
                )
                # drawn by uPlot, which the page loads with its first chart
                assert await page.until(f"!!{plot}.querySelector('canvas')", 20, "its canvas")
                rows = await page.value(
                    "document.querySelectorAll('#sweep-report tbody tr').length"
                )
                assert rows == 2
                await page.value("location.hash = '#/gpus'")
                gpu = "document.querySelector('#cluster-gpus tr[data-cluster=\"bed\"]')"
                got = await page.until(
                    f"{gpu} && [...{gpu}.children].map((c) => c.textContent)", 20, "the job's GPU"
                )
                assert got[:3] == ["bed", "c1 (job 7 / r-1x2)", "ok"] and "xid 79" in got
        finally:
            await server.close()

    asyncio.run(main())
