"""`vmrun dashboard`'s own decisions, with fake operations behind it: who may read and act
(the token, its cookie, the page's own origin), the API's shape, the log's events, what
the page ships, and that nothing secret reaches a page."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

pytest.importorskip("aiohttp")

from aiohttp.test_utils import TestClient, TestServer

from vmrun.dashboard.access import COOKIE, Access, same_origin
from vmrun.dashboard.app import STATIC, make_app
from vmrun.errors import UsageError
from vmrun.reporting import Reporter

RUN = {
    "run": "r1",
    "hosts": ["a", "b"],
    "cluster": None,
    "state": "running",
    "epochs_done": 2,
    "epochs_asked": 4,
    "cost": {"amount": 1.5, "currency": "USD", "per_hour": 3.0},
    "recoveries": None,
    "store": None,
}


class FakeViews:
    """What the operations would return; records each action asked."""

    def __init__(self) -> None:
        self.acted: list[tuple[str, str]] = []
        self.release = threading.Event()

    def runs(self) -> dict[str, Any]:
        return {"runs": [RUN], "unreached": []}

    def run(self, run_id: str) -> dict[str, Any]:
        if run_id != "r1":
            raise UsageError(f"no run {run_id}", code="run-not-found")
        return RUN

    def metrics(self, run_id: str) -> dict[str, Any]:
        return {"run": run_id, "metrics": {"loss": [[1, 2.0], [2, 1.0]]}, "note": None}

    def events(self, run_id: str) -> dict[str, Any]:
        event = {"kind": "start", "at": 1.0, "text": "started on a, b", "node": None}
        return {"run": run_id, "events": [{**event, "duration_s": None}], "note": None}

    def files(self, run_id: str) -> dict[str, Any]:
        final = {"path": "results/r1/finalmodel.pt", "kind": "final model", "size": 10}
        return {"run": run_id, "files": [final], "bytes": 10, "command": "vmrun fetch"}

    def stacks(self, run_id: str) -> dict[str, Any]:
        self.acted.append(("stacks", run_id))
        return {"run": run_id, "lines": ["rank 0-1: train.py:10"], "failed": {}}

    def stop(self, run_id: str) -> dict[str, Any]:
        self.acted.append(("stop", run_id))
        return {"run": run_id, "nodes": [], "unreached": {}, "exit": 0}

    def gpus(self) -> dict[str, Any]:
        host = {"host": "a", "state": "ok", "gpus": [{"index": 0, "health": []}], "processes": []}
        return {"hosts": [host], "error": None}

    def follow(self, run_id: str) -> Callable[[Reporter], str]:
        def follow(out: Reporter) -> str:
            out.output(b"[a rank0] epoch 1\n[b rank1] epoch 1\n")
            self.release.wait(10)
            out.output(b"[a rank0] a later line\n")
            return "run r1 ended (exit 0)"

        return follow


def served(
    test: Callable[[TestClient, Access, FakeViews], Awaitable[None]],
) -> None:
    async def main() -> None:
        access, views = Access(), FakeViews()
        client = TestClient(TestServer(make_app(views, access)))  # type: ignore[arg-type]
        await client.start_server()
        try:
            await test(client, access, views)
        finally:
            views.release.set()
            await client.close()

    asyncio.run(main())


def test_without_the_token_every_request_is_refused() -> None:
    async def test(client: TestClient, access: Access, views: FakeViews) -> None:
        paths = []  # every route, with its path's parts filled in
        for route in client.app.router.routes():  # type: ignore[union-attr]
            info = route.resource.get_info() if route.resource else {}
            path = info.get("path") or info["formatter"].format(run="r1", name="app.js", sweep="s")
            paths.append((route.method, path))
        assert ("POST", "/api/runs/r1/stop") in paths and ("GET", "/api/sweeps/s") in paths
        for method, path in paths:
            resp = await client.request(method, path)
            assert resp.status == 403, path
            if method != "HEAD":
                assert "token" in (await resp.json())["error"]["message"]
        resp = await client.get("/api/runs", params={"token": "wrong"})
        assert resp.status == 403
        resp = await client.post("/api/runs/r1/stop")
        assert resp.status == 403
        assert views.acted == []

    served(test)


def test_the_token_once_then_a_strict_httponly_cookie() -> None:
    async def test(client: TestClient, access: Access, views: FakeViews) -> None:
        resp = await client.get("/", params={"token": access.token}, allow_redirects=False)
        assert resp.status == 302
        assert resp.headers["Location"] == "/"  # the token leaves the address bar
        cookie = resp.headers["Set-Cookie"]
        assert f"{COOKIE}={access.token}" in cookie
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        page = await client.get("/", cookies={COOKIE: access.token})
        assert page.status == 200
        assert "/static/app.js" in await page.text()
        script = await client.get("/static/app.js", cookies={COOKIE: access.token})
        assert "/static/uPlot.iife.min.js" in await script.text()  # loaded by the first chart
        assert page.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        runs = await client.get("/api/runs", cookies={COOKIE: access.token})
        assert (await runs.json())["runs"][0]["run"] == "r1"

    served(test)


def test_an_action_needs_the_pages_own_origin() -> None:
    async def test(client: TestClient, access: Access, views: FakeViews) -> None:
        jar = {COOKIE: access.token}
        own = f"http://{client.server.host}:{client.server.port}"
        refused = [
            {},  # no Origin, no Referer: not known to be the page's
            {"Origin": "http://evil.example"},
            {"Origin": own, "Sec-Fetch-Site": "cross-site"},
            {"Referer": "http://evil.example/page"},
        ]
        for headers in refused:
            resp = await client.post("/api/runs/r1/stop", cookies=jar, headers=headers)
            assert resp.status == 403, headers
        assert views.acted == []
        same = {"Origin": own, "Sec-Fetch-Site": "same-origin"}
        resp = await client.post("/api/runs/r1/stop", cookies=jar, headers=same)
        assert resp.status == 200 and (await resp.json())["exit"] == 0
        resp = await client.post("/api/runs/r1/stacks", headers={"X-Vmrun-Token": access.token})
        assert resp.status == 200
        assert views.acted == [("stop", "r1"), ("stacks", "r1")]

    served(test)


def test_the_api_shape_and_errors() -> None:
    async def test(client: TestClient, access: Access, views: FakeViews) -> None:
        jar = {COOKIE: access.token}
        run = await (await client.get("/api/runs/r1", cookies=jar)).json()
        assert run["state"] == "running" and run["cost"]["amount"] == 1.5
        metrics = await (await client.get("/api/runs/r1/metrics", cookies=jar)).json()
        assert metrics["metrics"]["loss"] == [[1, 2.0], [2, 1.0]]
        events = await (await client.get("/api/runs/r1/events", cookies=jar)).json()
        assert events["events"][0]["kind"] == "start"
        files = await (await client.get("/api/runs/r1/files", cookies=jar)).json()
        assert files["files"][0]["kind"] == "final model" and files["bytes"] == 10
        gpus = await (await client.get("/api/gpus", cookies=jar)).json()
        assert gpus["hosts"][0]["gpus"][0]["index"] == 0 and gpus["error"] is None
        missing = await client.get("/api/runs/nope", cookies=jar)
        assert missing.status == 404
        assert (await missing.json())["error"]["code"] == "run-not-found"
        assert (await client.get("/static/../app.py", cookies=jar)).status in (403, 404)
        assert (await client.get("/static/secret.txt", cookies=jar)).status == 404

    served(test)


def test_the_log_is_every_line_so_far_then_each_new_one() -> None:
    async def test(client: TestClient, access: Access, views: FakeViews) -> None:
        resp = await client.get("/api/runs/r1/log", cookies={COOKIE: access.token})
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events: list[dict[str, Any]] = []

        async def read_until(text: str) -> None:
            while not any(text in e["text"] for e in events):
                line = await asyncio.wait_for(resp.content.readline(), 10)
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))

        await read_until("[b rank1] epoch 1")
        views.release.set()
        await read_until("ended")
        assert [(e["kind"], e["text"]) for e in events] == [
            ("log", "[a rank0] epoch 1"),
            ("log", "[b rank1] epoch 1"),
            ("log", "[a rank0] a later line"),
            ("end", "run r1 ended (exit 0)"),
        ]

    served(test)


def test_origin_checks() -> None:
    assert same_origin("http://127.0.0.1:8777", None, "127.0.0.1:8777")
    assert not same_origin("http://127.0.0.1:8778", None, "127.0.0.1:8777")
    assert not same_origin(None, None, "127.0.0.1:8777")
    assert same_origin(None, "http://127.0.0.1:8777/#/run/x", "127.0.0.1:8777")
    assert not same_origin("null", None, "127.0.0.1:8777")
    assert Access().token != Access().token and len(Access().token) >= 40


def test_the_page_ships_its_files_and_a_chart_library_with_its_license() -> None:
    from importlib import resources

    static = resources.files("vmrun.dashboard").joinpath("static")
    for name in ["index.html", *STATIC]:
        assert static.joinpath(name).read_bytes(), name
    assert "MIT License" in static.joinpath("uPlot.LICENSE").read_text()
    page = static.joinpath("index.html").read_text() + static.joinpath("app.js").read_text()
    assert "http://" not in page.replace("http://www.w3.org", "")  # no CDN
    assert "https://" not in page


def _python(probe: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`probe` in a new Python (this tree's vmrun, `home` as HOME and cwd): what it said."""
    root = str(Path(__file__).resolve().parent.parent)
    return subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=home,
        timeout=60,
        env={**os.environ, "PYTHONPATH": root, "HOME": str(home)},
    )


def test_without_the_extra_one_line_names_it(tmp_path: Path) -> None:

    probe = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "from vmrun.cli.main import main\n"
        "sys.exit(main(['dashboard', '-H', 'nobody@127.0.0.1:1']))"
    )
    done = _python(probe, tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "pip install 'vmrun[dashboard]'" in line and "aiohttp" in line


def test_pages_asking_at_once_share_one_listing_of_the_hosts(monkeypatch: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from vmrun.config import load_settings
    from vmrun.dashboard.views import Views

    views = Views(load_settings())
    asked, release = [], threading.Event()

    def listing() -> dict[str, Any]:
        asked.append(1)
        release.wait(10)
        return {"runs": [RUN], "unreached": []}

    class Counted:
        """The views' lock, counting who took it: each ask looks at the listing under it."""

        def __init__(self) -> None:
            self.lock, self.taken = threading.Lock(), 0

        def __enter__(self) -> None:
            self.lock.acquire()
            self.taken += 1

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    counted = Counted()
    monkeypatch.setattr(views, "_list", listing)
    monkeypatch.setattr(views, "_lock", counted)
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(views.runs)
        wait_for(lambda: asked, 10, "the first listing")
        others = [pool.submit(views.runs) for _ in range(2)]
        wait_for(lambda: counted.taken >= 3, 10, "two more asks")  # both hold the listing
        release.set()
        answers = [first.result(10), *(o.result(10) for o in others)]
    assert asked == [1] and all(a["runs"] == [RUN] for a in answers)
    views.runs()  # a later ask lists again (release is still set)
    assert asked == [1, 1]


def test_the_servers_first_listing_answers_the_first_page_once(monkeypatch: Any) -> None:
    """The listing made as the server starts answers the first page asking soon after it
    (not listed again); the next ask lists, and so does an ask after FIRST_FRESH_S or after
    a stop."""
    from types import SimpleNamespace

    from vmrun.config import load_settings
    from vmrun.dashboard import views as views_module
    from vmrun.dashboard.views import Views
    from vmrun.operations import stop

    views = Views(load_settings())
    listed: list[int] = []

    def listing() -> dict[str, Any]:
        listed.append(1)
        return {"runs": [dict(RUN, n=len(listed))], "unreached": []}

    def number() -> int:
        return int(views.runs()["runs"][0]["n"])

    monkeypatch.setattr(views, "_list", listing)
    views.warm()
    assert (number(), number()) == (1, 2)
    views.warm()
    monkeypatch.setattr(views_module, "FIRST_FRESH_S", 0.0)
    assert number() == 4
    monkeypatch.setattr(views_module, "FIRST_FRESH_S", 60.0)
    views.warm()
    views._seen[RUN["run"]] = RUN
    stopped = SimpleNamespace(
        outcomes=[], ref=SimpleNamespace(unreached={}), run_id="r", exit_code=0
    )
    monkeypatch.setattr(stop, "stop", lambda *a, **kw: stopped)
    views.stop(RUN["run"])
    assert number() == 6


def test_the_address_is_printed_listening_before_aiohttp_is_imported(tmp_path: Path) -> None:
    """The address comes first (a browser starts meanwhile): its port already takes
    connections, which wait for the server; aiohttp is imported after."""

    probe = (
        "import socket, sys\n"
        "from vmrun.config import load_settings\n"
        "from vmrun.dashboard.server import serve\n"
        "def opened(url):\n"
        "    port = int(url.split(':')[2].split('/')[0])\n"
        "    socket.create_connection(('127.0.0.1', port), 5).close()\n"
        "    print('aiohttp' in sys.modules)\n"
        "    raise SystemExit(0)\n"
        "serve(load_settings(), hosts=['nobody@127.0.0.1:1'], port=0, opened=opened)\n"
    )
    done = _python(probe, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_a_port_in_use_is_refused_and_with_no_port_another_is_taken(monkeypatch: Any) -> None:
    import socket

    from vmrun.config import load_settings
    from vmrun.dashboard import server

    class Opened(Exception):
        pass

    def opened(url: str) -> None:
        raise Opened(url)

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(UsageError) as refused:
            server.serve(load_settings(), port=port, opened=opened)
        assert refused.value.code == "dashboard-port-taken"
        monkeypatch.setattr(server, "DEFAULT_PORT", port)
        with pytest.raises(Opened) as got:
            server.serve(load_settings(), opened=opened)
        assert f":{port}/" not in str(got.value) and "?token=" in str(got.value)


class Row:
    """One node's record as `status` gathers it (the hosts' fields a timeline reads)."""

    def __init__(self, host: str, **kw: Any) -> None:
        from vmrun.runs.state import RunState

        self.id, self.host = "r1", host
        self.started, self.ended, self.began, self.attempts = 100.0, None, None, 1
        self.state, self.exit_code, self.stopped_by = RunState.RUNNING, None, ""
        self.notice = self.hung = self.budget = self.requeued = None
        self.recoveries, self.recovering = 0, ""
        self.__dict__.update(kw)


def test_a_timeline_orders_what_the_records_the_supervisor_and_the_log_say() -> None:
    from vmrun.operations.timeline import timeline
    from vmrun.runs.state import RunState

    done = {"state": RunState.DONE, "exit_code": 0, "attempts": 2, "began": 300.0}
    rows = [
        Row("a", ended=900.0, notice={"kind": "interruption", "seen": 250.0}, **done),
        Row("b", ended=905.0, hung={"since": 400.0, "seen": 460.0, "ranks": [1]}, **done),
    ]
    recoveries = [{"kind": "recovery", "at": 290, "text": "recovery 1 of 5", "downtime_s": 40}]
    saved = [
        (150.0, "[a rank0] snapshot saved at epoch 1 -> /w/snapshot.pt"),
        (151.0, "[a rank0] epoch 2/4 loss 0.5"),
        (None, "[a rank0] checkpoint /w/checkpoints/epoch-3 complete: 2 shards"),
    ]
    events = timeline(rows, recoveries, saved)
    said = [(e.kind, e.at, e.node, e.duration_s) for e in events]
    assert said == [
        ("start", 100.0, None, None),
        ("snapshot", 150.0, None, None),
        ("notice", 250.0, "a", None),
        ("recovery", 290.0, None, 40.0),
        ("attempt", 300.0, None, None),
        ("hang", 460.0, "b", 60.0),
        ("snapshot", None, None, None),  # a line with no time: after the timed ones
        ("end", 905.0, None, None),
    ]
    assert events[0].text == "started on a, b" and events[-1].text == "done (exit 0)"
    assert events[6].text == "snapshot at epoch 3" and "ranks 1" in events[5].text
    stopped = Row("a", state=RunState.STOPPED, ended=50.0, stopped_by="budget")
    stopped.budget = {"seen": 49.0, "cap": 2.5}
    kinds = [(e.kind, e.text) for e in timeline([stopped])]
    assert kinds == [
        ("start", "started on a"),
        ("over-budget", "reached --max-cost 2.5"),
        ("end", "stopped (budget)"),
    ]
    under_way = Row("a", state=RunState.LOST, recovering="1 of 5: lost b")
    assert [e.kind for e in timeline([under_way])] == ["start", "end", "recovering"]


def test_each_ranks_step_time_by_epoch_a_resumed_epoch_its_last_line(tmp_path: Path) -> None:
    from vmrun.results.history import rank_series

    lines = [
        {"epoch": 1, "loss": 2.0, "rank_step_s": [0.1, 0.3], "rank_node": [0, 1]},
        {"epoch": 2, "loss": 1.5, "rank_step_s": [0.1, 0.4], "rank_node": [0, 1]},
        {"epoch": 2, "loss": 1.4, "rank_step_s": [0.2, 0.5], "rank_node": [0, 1]},
        {"epoch": 3, "loss": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot js")
    series, nodes = rank_series(tmp_path)
    assert series == {0: [(1, 0.1), (2, 0.2)], 1: [(1, 0.3), (2, 0.5)]} and nodes == (0, 1)
    assert rank_series(tmp_path / "none") == ({}, None)
    from vmrun.dashboard.charts import rank_series_json  # what the page's chart gets

    assert rank_series_json(tmp_path) == {
        "rank_series": {"0": [[1, 0.1], [2, 0.2]], "1": [[1, 0.3], [2, 0.5]]},
        "rank_node": [0, 1],
    }
    assert rank_series_json(tmp_path / "none") == {"rank_series": None, "rank_node": None}


def test_a_malformed_rank_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    """Lines json reads but that are not a rank's numbers (nodes named, a NaN epoch or step
    time) are left out: the rest of the run's series and its median still come."""
    from vmrun.dashboard.charts import rank_series_json
    from vmrun.results.history import read_rank_times

    text = "\n".join(
        [
            json.dumps({"epoch": 1, "rank_step_s": [0.1, 0.3], "rank_node": [0, 1]}),
            json.dumps({"epoch": 2, "rank_step_s": [0.2, 0.4], "rank_node": ["n1", "n2"]}),
            '{"epoch": NaN, "rank_step_s": [0.1, 0.3]}',
            '{"epoch": Infinity, "rank_step_s": [0.1, 0.3]}',
            '{"epoch": 3, "rank_step_s": [NaN, 0.3]}',
            json.dumps({"epoch": None, "rank_step_s": [0.1, 0.3], "rank_node": [True, 1]}),
        ]
    )
    (tmp_path / "metrics.jsonl").write_text(text + "\n")
    got = rank_series_json(tmp_path)
    assert got["rank_node"] is None  # the last line's nodes were not indices
    assert got["rank_series"]["0"][:2] == [[1, 0.1], [2, 0.2]]
    json.dumps(got, allow_nan=False)  # what the page parses: no NaN in it
    assert read_rank_times(tmp_path / "metrics.jsonl")["rank_node"] is None


_THROTTLE = """
let now = 0, next = 1, current = "r1";
const timers = new Map(), reads = [];
globalThis.setTimeout = (f, ms) => { timers.set(next, [now + ms, f]); return next++; };
globalThis.clearTimeout = (id) => timers.delete(id);
Date.now = () => now;
function loadEvents(runId) { reads.push(now); }
function loadFiles(runId) {}
function until(to) {
  for (;;) {
    const due = [...timers].filter(([, [t]]) => t <= to).sort((a, b) => a[1][0] - b[1][0])[0];
    if (!due) break;
    timers.delete(due[0]);
    now = due[1][0];
    due[1][1]();
  }
  now = to;
}
for (let t = 0; t < 60000; t += EVERY) { until(t); eventsSoon("r1"); }
until(1e6);
console.log(JSON.stringify(reads));
"""


@pytest.mark.parametrize("every_ms", [500, 2000])
def test_the_page_reads_a_runs_events_every_ten_seconds_at_most_and_after_the_last_line(
    every_ms: int,
) -> None:
    """An event-like log line every `every_ms` for a minute: the events (and files) are read
    soon after the first, then at most once every 10 s while lines come, and once after the
    last; never put off for as long as the lines keep coming."""
    import itertools
    import re
    import shutil
    from importlib import resources

    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the page's script")
    js = resources.files("vmrun.dashboard").joinpath("static/app.js").read_text()
    found = re.search(r"const EVENTS_SOON_MS.*?\nfunction eventsSoon\(.*?\n}\n", js, re.S)
    assert found, "eventsSoon and its constants in app.js"
    script = found.group(0) + f"const EVERY = {every_ms};\n" + _THROTTLE
    done = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reads = json.loads(done.stdout)
    assert reads[0] <= 2000  # soon after the first line
    assert all(b - a >= 10000 for a, b in itertools.pairwise(reads))
    assert all(b - a <= 10000 + every_ms for a, b in itertools.pairwise(reads))
    last = 60000 - every_ms
    assert reads[-1] > last and len([r for r in reads if r > last]) == 1  # after the last line


def _views(tmp_path: Path, monkeypatch: Any, hosts: list[str] | None = None) -> Any:
    from dataclasses import replace

    from vmrun.config import load_settings
    from vmrun.dashboard.views import Views

    monkeypatch.chdir(tmp_path)
    views = Views(replace(load_settings(), project_dir=tmp_path), hosts=hosts)
    views._seen["r1"] = {**RUN, "state": "done"}
    return views


def test_a_runs_events_come_from_its_records_recoveries_and_masters_log(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import contextlib

    import vmrun.operations.fetch
    import vmrun.operations.logs
    import vmrun.operations.status
    from vmrun.operations.status import Status
    from vmrun.runs.state import RunState

    views = _views(tmp_path, monkeypatch)
    rows = [Row(h, state=RunState.DONE, exit_code=0, ended=500.0, recoveries=1) for h in "ab"]
    asked: list[Any] = []

    def gather(settings: Any, **place: Any) -> Status:
        asked.append(("status", place))
        return Status([*rows, Row("a", id="other")])

    def fetch(job: Any) -> Any:
        asked.append(("fetch", job.items, job.include, job.run, job.hosts))
        folder = tmp_path / "results" / "r1"
        folder.mkdir(parents=True, exist_ok=True)
        facts = json.dumps({"downtime_s": 42})
        (folder / "recoveries").write_text(f"recovery\t200\trecovery 1 of 5: lost b\t{facts}\n")
        return type("Fetched", (), {"exit_code": 0})()

    class Backend:
        def timed_log(self, ref: Any, node: str) -> list[tuple[float, bytes]]:
            asked.append(("log", node))
            return [(150.0, b"[a rank0] snapshot saved at epoch 1 -> s.pt"), (float("inf"), b"x")]

    @contextlib.contextmanager
    def run_log(settings: Any, run: str, **place: Any) -> Any:
        record = type("Record", (), {"master": "a"})()
        ref = type("Ref", (), {"record": record, "nodes": ("a", "b")})()
        yield type("Log", (), {"ref": ref, "backend": Backend()})()

    monkeypatch.setattr(vmrun.operations.status, "gather", gather)
    monkeypatch.setattr(vmrun.operations.fetch, "fetch", fetch)
    monkeypatch.setattr(vmrun.operations.logs, "run_log", run_log)
    got = views.events("r1")
    assert [(e["kind"], e["at"], e["duration_s"]) for e in got["events"]] == [
        ("start", 100.0, None),
        ("snapshot", 150.0, None),
        ("recovery", 200.0, 42),
        ("end", 500.0, None),
    ]
    assert got["note"] is None
    assert asked == [
        ("status", {"hosts": ["a", "b"], "cluster": None, "watchdog": False}),
        ("fetch", ["logs"], ("recoveries",), "r1", ["a", "b"]),  # only the small file
        ("log", "a"),
    ]
    asked.clear()  # read again, the same recoveries counted: the same events, nothing fetched
    assert views.events("r1")["events"] == got["events"]
    assert [a[0] for a in asked] == ["status", "log"]
    rows[1].recoveries = 2  # its supervisor acted again: fetched again
    asked.clear()
    views.events("r1")
    assert [a[0] for a in asked] == ["status", "fetch", "log"]
    views._seen["gone"] = RUN  # listed before; no node has it now
    with pytest.raises(UsageError, match="no run gone"):
        views.events("gone")


def test_a_runs_files_are_fetchs_own_listing_with_the_command_to_copy(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import vmrun.operations.fetch
    from vmrun.errors import ConnectionLostError
    from vmrun.operations.fetch import Listing, Planned

    asked: list[Any] = []

    def listing(job: Any) -> Listing:
        asked.append((job.items, job.run, job.hosts, job.cluster))
        files = (
            Planned("results/r1/checkpoints/epoch-2/__0_0.distcp", 50, 1.0, ("a",), False),
            Planned("results/r1/finalmodel.pt", 100, 2.0, ("a",), True),
            Planned("results/r1/metrics.jsonl", 20, 2.0, ("a",), False),
            Planned("results/r1/b/log", 30, 2.0, ("b",), False),
            Planned("results/r1/notes.txt", 4, 2.0, ("a", "b"), False),
            Planned("results/r1/versions.json", 4, 2.0, ("a",), False),
        )
        return Listing(files, None, {"b": ConnectionLostError("gone", host="b")})

    monkeypatch.setattr(vmrun.operations.fetch, "listing", listing)
    got = _views(tmp_path, monkeypatch).files("r1")
    kinds = {f["path"].rsplit("/", 1)[1]: f["kind"] for f in got["files"]}
    assert kinds == {
        "__0_0.distcp": "checkpoint",
        "finalmodel.pt": "final model",
        "metrics.jsonl": "metrics",
        "log": "log",
        "notes.txt": "output",
        "versions.json": "provenance",
    }
    assert list(kinds)[:3] == ["finalmodel.pt", "__0_0.distcp", "metrics.jsonl"]  # in order
    assert got["bytes"] == 208 and got["files"][0]["here"] and "gone" in got["failed"]["b"]
    assert got["command"] == "vmrun fetch results --run r1"  # the project's hosts find it
    assert asked == [(["results"], "r1", ["a", "b"], None)]
    given = _views(tmp_path, monkeypatch, hosts=["a", "b", "c"]).files("r1")
    assert given["command"] == "vmrun fetch results --run r1 -H a -H b"  # the run's hosts


def test_the_hosts_gpu_watch_ends_unasked_and_starts_again_at_the_next_ask(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import contextlib

    import vmrun.operations.gpus
    from vmrun.dashboard import cluster_gpus

    watching: list[str] = []  # "on" as a watch starts, "off" as it stops
    fail = [False]

    class Fleet:
        fleet = None

        def drain(self, timeout: float) -> None:
            threading.Event().wait(0.01)
            if fail[0]:
                raise KeyError("not a VmrunError")

        def statuses(self) -> list[Any]:
            return [self]

        def to_json(self) -> dict[str, Any]:
            return {"host": "a", "state": "ok", "gpus": [], "processes": []}

    @contextlib.contextmanager
    def watch(settings: Any, hosts: Any, cluster: Any = None) -> Any:
        watching.append("on")
        fleet = Fleet()
        fleet.fleet = fleet  # type: ignore[assignment]
        try:
            yield fleet
        finally:
            watching.append("off")

    monkeypatch.setattr(vmrun.operations.gpus, "watch", watch)
    monkeypatch.setattr(cluster_gpus, "IDLE_S", 0.2)
    views = _views(tmp_path, monkeypatch, hosts=["a"])
    wait_for(lambda: views.gpus()["hosts"] != [], 10, "the host's status")
    wait_for(lambda: watching == ["on", "off"], 10, "the watch ended, no page asking")
    wait_for(lambda: views.gpus()["hosts"] != [], 10, "watched again")
    assert watching[:3] == ["on", "off", "on"]
    fail[0] = True
    wait_for(lambda: views.gpus()["error"] is not None, 10, "the error shown")
    assert "KeyError" in views.gpus()["error"] and views.gpus()["hosts"] == []


def test_a_backend_that_keeps_no_line_times_gives_its_log_untimed() -> None:
    from vmrun.backends.api import untimed_log

    class Backend:
        def read_log(self, ref: Any, out: Reporter) -> None:
            out.output(b"[a rank0] epoch 1\n[a rank0] snapshot saved at epoch 1\n")

    got = untimed_log(Backend(), None)  # type: ignore[arg-type]
    assert got == [(None, b"[a rank0] epoch 1"), (None, b"[a rank0] snapshot saved at epoch 1")]
