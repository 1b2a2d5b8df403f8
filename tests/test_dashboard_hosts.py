"""`vmrun dashboard` in a real headless Chromium, over a real two-node torchrun run on the
test hosts: the runs page lists it and a finished one with their states and costs, a line
a rank writes shows within a second, the loss chart has a point per epoch, the log narrows
to one rank or node and to a search, each rank's step time is a series of its own, the
timeline has the start and the end (a snapshot between, for the finished run), the files to
fetch name the final model and the metrics, "stacks now" shows both ranks, stop asks and
then leaves no process, the GPUs page has each host, a request without the token is
refused, nothing secret is served, and all of it over one SSH connection per host."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser import Page, chromium
from conftest import Client, run_id_of, run_pids, template_out, wait_for
from testbed import TestHost
from train_helpers import Gate
from web_helpers import Lines

SECRET = "dashboard-secret-4f1c9e"  # a run's --env value: never on a page


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _logins(cluster: dict[str, TestHost]) -> dict[str, int]:
    return {h: cluster[h].sshd_log().count("Accepted publickey") for h in ("n1", "n2")}


def test_the_dashboard_shows_follows_charts_and_stops_a_two_node_run(
    cluster: dict[str, TestHost], multi: Client, gate: Gate, tmp_path: Path
) -> None:
    n1, n2 = cluster["n1"], cluster["n2"]
    project = multi.cwd / "vmrun.toml"  # each host's price: what a run costs so far
    project.write_text(project.read_text().replace("python = ", "price = 0.5\npython = "))
    finished = multi.vmrun(
        "train", "--epochs", "1", "--save-every", "1", "--nproc-per-node", "1", timeout=300
    )
    assert finished.returncode == 0, finished.stderr
    done_rid = run_id_of(finished.stderr + finished.stdout)
    fetched = multi.vmrun("fetch", "metrics", "--run", done_rid, timeout=120)
    assert fetched.returncode == 0, fetched.stderr  # as a sweep fetches each of its runs
    _a_sweep_of(multi.cwd, done_rid)
    hooks = gate.options(2, EPOCH_DELAY="4")  # held after epoch 2; then 4 s an epoch
    started = multi.vmrun(
        "train",
        "--epochs",
        "8",
        "--nproc-per-node",
        "1",
        "--detach",
        "-e",
        f"DASH_SECRET={SECRET}",
        *hooks,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr
    rid = run_id_of(started.stderr + started.stdout)
    metrics = template_out(n1, multi, rid) / "metrics.jsonl"
    two = lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2  # noqa: E731
    wait_for(two, 180, "epoch 2's metrics on n1")
    host_log = n1.home / ".vmrun" / "runs" / rid / "log"
    before = _logins(cluster)
    lines = Lines(multi.popen("dashboard", "--port", "0"))
    try:
        url = lines.url(60)
        base, token = url.split("/?token=")
        assert _get(f"{base}/api/runs")[0] == 403  # no token, no cookie
        assert _get(f"{base}/api/runs", {"Cookie": "vmrun_dashboard=guess"})[0] == 403
        status, body = _get(f"{base}/api/runs", {"X-Vmrun-Token": token})
        assert status == 200 and rid in body.decode()
        assert SECRET not in body.decode()
        asyncio.run(_browse(url, (rid, done_rid), gate, host_log, n1, n2, tmp_path))
        for what in ("events", "files", "metrics"):  # the run page's other parts
            status, body = _get(f"{base}/api/runs/{rid}/{what}", {"X-Vmrun-Token": token})
            assert status == 200 and SECRET not in body.decode(), what
        status, body = _get(f"{base}/api/runs/{rid}", {"X-Vmrun-Token": token})
        run = json.loads(body)
        assert run["state"] == "stopped", run
        assert SECRET not in body.decode()
        assert _logins(cluster) == {h: n + 1 for h, n in before.items()}  # one connection each
    finally:
        code, err = lines.finish(signal.SIGINT)
        gate.open()
    assert code == 0, err
    assert run_pids(n1, rid) == [] and run_pids(n2, rid) == []


async def _row(page: Page, rid: str) -> list[str]:
    """The run's row on the runs page, cell by cell."""
    return await page.until(
        f"(() => {{ const r = document.querySelector('tr[data-run=\"{rid}\"]');"
        " return r && [...r.children].map((c) => c.textContent); })()",
        30,
        f"run {rid}'s row",
    )


async def _browse(
    url: str,
    runs: tuple[str, str],
    gate: Gate,
    host_log: Path,
    n1: TestHost,
    n2: TestHost,
    tmp: Path,
) -> None:
    rid, done_rid = runs
    async with chromium(tmp) as page:
        await page.call("Page.navigate", url=url)
        running, done = await _row(page, rid), await _row(page, done_rid)
        assert running[1] == "n1, n2" and running[2].startswith("running"), running
        assert done[1] == "n1, n2" and done[2] == "done", done
        for row in (running, done):  # STATE, PROGRESS, STARTED, DURATION, COST, ...
            assert row[6].startswith("$"), row  # cost so far, at the hosts' prices
        began = time.monotonic()
        await _filters(page, rid, done_rid)
        await _the_sweeps_page(page, done_rid)
        print(f"the filters and the sweep's page took {time.monotonic() - began:.2f} s")
        await page.value(f"location.hash = '#/run/{rid}'")
        chart = "document.getElementById('chart').dataset.points === '2'"
        await page.until(chart, 60, "a point for each of 2 epochs")
        log = "document.getElementById('log').textContent.includes('epoch 2/8')"
        await page.until(log, 30, "the log so far")
        html = await page.value("document.documentElement.outerHTML")
        assert SECRET not in html
        await _log_by_rank_and_search(page)
        await _charts_timeline_and_files(page, rid)
        await _a_new_line_within_a_second(page, gate, host_log)
        await _stacks_now(page)
        await _stop_asks_first(page, rid, n1, n2)
        await _the_end_on_the_timeline(page)
        await _a_finished_runs_page(page, done_rid)
        await _gpus(page)


ROWS = "[...document.querySelectorAll('#runs tbody tr')].map((r) => r.dataset.run)"


async def _filter(page: Page, control: str, value: str, event: str) -> list[str]:
    """Set a filter of the runs page as a person would; the rows it leaves."""
    await page.value(
        f"(() => {{ const c = document.getElementById('{control}'); c.value = '{value}';"
        f" c.dispatchEvent(new Event('{event}')); }})()"
    )
    return list(await page.value(ROWS))


async def _reloaded(page: Page, expression: str, timeout: float, what: str) -> Any:
    """`until` across a reload: while the old page goes, evaluating may fail; retried."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = await page.value(expression)
        except AssertionError:
            found = None  # the old document went away mid-call
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _filters(page: Page, rid: str, done_rid: str) -> None:
    """The state filter hides the finished run and the host filter narrows the rows; both
    are kept in the address, so a reload keeps them."""
    shown = await _filter(page, "state-filter", "running", "change")
    assert rid in shown and done_rid not in shown, shown
    assert "state=running" in await page.value("location.hash")
    await page.call("Page.reload")
    has = f"(() => {{ const r = {ROWS}; return r.includes('{rid}') && r; }})()"
    shown = await _reloaded(page, has, 30, "the running run's row after a reload")
    assert done_rid not in shown, shown
    assert await page.value("document.getElementById('state-filter').value") == "running"
    assert rid in await _filter(page, "state-filter", "", "change")
    both = await _filter(page, "host-filter", "n2", "input")
    assert rid in both and done_rid in both, both
    assert await _filter(page, "host-filter", "n9", "input") == []  # no run there
    assert "host=n9" in await page.value("location.hash")
    assert done_rid in await _filter(page, "host-filter", "", "input")


SWEEP = "sweep-20260101-000000-dash"


def _a_sweep_of(project: Path, rid: str) -> None:
    """A sweep's record whose one size is the finished run (its files fetched here)."""
    from vmrun.runs.state import RunState
    from vmrun.runs.sweep import Size, Sweep, save

    assert list((project / "results" / rid).rglob("metrics.jsonl"))
    save(project, Sweep(SWEEP, {"hosts": ["n1", "n2"]}, {}, [Size(2, 1, rid, RunState.DONE)]))


async def _the_sweeps_page(page: Page, rid: str) -> None:
    """The runs page marks the sweep's run and links to the sweep's page: its report's row
    and its loss plot (a point for the run's one epoch)."""
    link = f'document.querySelector(\'tr[data-run="{rid}"] a[href^="#/sweep/"]\')'
    await page.until(f"!!{link}", 30, "the run's sweep, marked on its row")
    await page.value(f"{link}.click()")
    row = f"document.querySelector('#sweep-report tr[data-run=\"{rid}\"]')"
    await page.until(f"!!{row}", 30, "the sweep's report row")
    plot = "document.querySelector('#sweep-plots .sweep-chart[data-metric=\"loss\"]')"
    points = await page.until(f"{plot} && {plot}.dataset.points", 30, "the sweep's loss plot")
    assert points == "1", points
    assert SWEEP in await page.value("document.getElementById('sweep-id').textContent")


VISIBLE = (
    "[...document.getElementById('log').children].filter((d) => !d.hidden)"
    ".map((d) => d.textContent)"
)


async def _choose(page: Page, select: str, value: str) -> None:
    await page.value(
        f"(() => {{ const s = document.getElementById('{select}'); s.value = '{value}';"
        " s.dispatchEvent(new Event(s.tagName === 'INPUT' ? 'input' : 'change')); })()"
    )


async def _log_by_rank_and_search(page: Page) -> None:
    """One rank's lines alone, one node's, then the lines holding a text (any case)."""
    has_rank1 = "[...document.getElementById('log-rank').options].some((o) => o.value === '1')"
    await page.until(has_rank1, 30, "rank 1 among the log's ranks")
    every = await page.value("document.getElementById('log').children.length")
    for rank, prefix in (("1", "[n2 rank1] "), ("0", "[n1 rank0] ")):
        await _choose(page, "log-rank", rank)
        lines = await page.value(VISIBLE)
        assert lines and all(x.startswith(prefix) for x in lines), (rank, lines)
        assert len(lines) < every
    assert any("epoch 2/8" in x for x in lines)  # rank 0's progress
    await _choose(page, "log-rank", "")
    await _choose(page, "log-node", "n2")
    lines = await page.value(VISIBLE)
    assert lines and all(x.startswith("[n2") for x in lines), lines
    await _choose(page, "log-node", "")
    await _choose(page, "log-search", "EPOCH 2/8")
    lines = await page.value(VISIBLE)
    assert lines and all("epoch 2/8" in x.lower() for x in lines), lines
    count = await page.value("document.getElementById('log-count').textContent")
    assert count.startswith(f"{len(lines)} of "), count
    await _choose(page, "log-search", "")
    assert len(await page.value(VISIBLE)) >= every


async def _charts_timeline_and_files(page: Page, rid: str) -> None:
    """Each rank's step time a series of its own, samples/s by epoch, the start on the
    timeline, the files fetch would bring and its command."""
    ranks = "document.getElementById('chart-ranks').dataset"
    await page.until(f"{ranks}.series === '2' && {ranks}.points === '2'", 60, "2 ranks' series")
    labels = await page.value(f"{ranks}.labels")
    assert labels.startswith("rank 0") and ",rank 1" in labels, labels
    assert await page.value("document.getElementById('chart-rate').dataset.points") == "2"
    start = await page.until(
        "(() => { const r = document.querySelector('#events tr[data-kind=\"start\"]');"
        " return r && r.textContent; })()",
        60,
        "the start on the timeline",
    )
    assert "started on n1, n2" in start, start
    assert await page.value("document.querySelector('#timeline .mark.start') !== null")
    await _files(page, rid, ("metrics.jsonl", "log"))


async def _files(page: Page, rid: str, names: tuple[str, ...]) -> dict[str, str]:
    """The files list (each name's kind), once it names all of `names`; its command."""
    kinds = await page.until(
        "(() => { const k = {}; for (const r of document.querySelectorAll('#files tbody tr'))"
        " k[r.dataset.path.split('/').pop()] = r.dataset.kind;"
        f" return {list(names)}.every((n) => n in k) && k; }})()",
        60,
        f"{', '.join(names)} in the files to fetch",
    )
    command = await page.value("document.getElementById('fetch-command').textContent")
    assert command == f"vmrun fetch results --run {rid}", command
    return kinds


async def _the_end_on_the_timeline(page: Page) -> None:
    """The stopped run's log ends; its timeline then has its end."""
    end = await page.until(
        "(() => { const r = document.querySelector('#events tr[data-kind=\"end\"]');"
        " return r && r.textContent; })()",
        60,
        "the end on the timeline",
    )
    assert "stopped" in end, end


async def _a_finished_runs_page(page: Page, rid: str) -> None:
    """A finished run: its start, snapshot and end in order; its final model, snapshot and
    metrics among the files to fetch; a step-time series per rank. With
    VMRUN_DASHBOARD_SHOTS=DIR, the page is kept there as dashboard-run-torchrun.png."""
    shots = os.environ.get("VMRUN_DASHBOARD_SHOTS")
    if shots:  # the docs' screenshots' width, tall enough for all but the log
        metrics = {"width": 1280, "height": 1350, "deviceScaleFactor": 1, "mobile": False}
        await page.call("Emulation.setDeviceMetricsOverride", **metrics)
    await page.value(f"location.hash = '#/run/{rid}'")
    kinds = await page.until(
        "(() => { const k = [...document.querySelectorAll('#events tbody tr')]"
        ".map((r) => r.dataset.kind); return k.includes('end') && k; })()",
        60,
        "the finished run's timeline",
    )
    assert kinds == ["start", "snapshot", "end"], kinds
    end = await page.value("document.querySelector('#events tr[data-kind=\"end\"]').textContent")
    assert "done (exit 0)" in end, end
    files = await _files(page, rid, ("finalmodel.pt", "snapshot.pt", "metrics.jsonl"))
    assert files["finalmodel.pt"] == "final model" and files["snapshot.pt"] == "checkpoint"
    assert files["metrics.jsonl"] == "metrics", files
    ranks = "document.getElementById('chart-ranks').dataset"
    await page.until(f"{ranks}.series === '2' && {ranks}.points === '1'", 60, "2 ranks' series")
    if shots:
        paint = "new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
        await page.call("Runtime.evaluate", expression=paint, awaitPromise=True)
        got = await page.call("Page.captureScreenshot", format="png")
        Path(shots, "dashboard-run-torchrun.png").write_bytes(base64.b64decode(got["data"]))


async def _gpus(page: Page) -> None:
    """Each host as `watch-gpus` sees it (these hosts have no GPU: said, not failed)."""
    await page.value("location.hash = '#/gpus'")
    for host in ("n1", "n2"):
        state = await page.until(
            f"(() => {{ const r = document.querySelector('#gpus tr[data-host=\"{host}\"]');"
            " return r && r.children[1].textContent; })()",
            60,
            f"{host}'s GPUs row",
        )
        assert state.startswith(("no-gpu", "ok")), state


async def _a_new_line_within_a_second(page: Page, gate: Gate, host_log: Path) -> None:
    """Epoch 3's line, from when it is in the run's log on the host to when it is on the page."""
    needle = "epoch 3/8"
    gate.open()
    on_host = on_page = None
    deadline = time.monotonic() + 120
    while on_page is None and time.monotonic() < deadline:
        if on_host is None and needle in host_log.read_text(errors="replace"):
            on_host = time.monotonic()
        if await page.value(f"document.getElementById('log').textContent.includes('{needle}')"):
            on_page = time.monotonic()
        await asyncio.sleep(0.02)
    assert on_page is not None, "epoch 3's line never reached the page"
    assert needle in host_log.read_text(errors="replace")  # seen there first, or just now
    took = on_page - (on_host if on_host is not None else on_page)
    print(f"a rank's line reached the page {took:.3f} s after it was in the host's log")
    assert took <= 1.0, took


async def _stacks_now(page: Page) -> None:
    await page.value("document.getElementById('stacks-button').click()")
    text = await page.until(
        "(() => { const s = document.getElementById('stacks');"
        " return !s.hidden && s.textContent; })()",
        120,
        "the stacks",
    )
    assert "rank 0 on n1" in text and "rank 1 on n2" in text, text


async def _stop_asks_first(page: Page, rid: str, n1: TestHost, n2: TestHost) -> None:
    page.answer = False
    await page.value("document.getElementById('stop-button').click()")
    await page.until("document.getElementById('action-note').textContent === 'not stopped'", 10, "")
    assert len(page.dialogs) == 1 and rid in page.dialogs[0]
    assert run_pids(n1, rid) and run_pids(n2, rid)  # asked, told no: nothing stopped
    page.answer = True
    await page.value("document.getElementById('stop-button').click()")
    note = await page.until(
        "(() => { const t = document.getElementById('action-note').textContent;"
        " return t !== 'stopping...' && t; })()",
        120,
        "the stop",
    )
    assert note == "stopped", note
    assert len(page.dialogs) == 2
    assert run_pids(n1, rid) == [] and run_pids(n2, rid) == []
    text = await page.value("document.getElementById('stopped').textContent")
    assert "n1: stopped" in text and "n2: stopped" in text, text


pytestmark = pytest.mark.timeout(900)
