"""`vmrun dashboard` with 50 runs on 8 hosts: the runs page from a cold start, a live log
line's way to the page, and the server's CPU while idle with a page open.

Goals (the dashboard's): the runs page with 50 runs on 8 hosts in <= 2 s from a cold start,
a live log line in <= 1 s, the server below 2% of a CPU while idle with a page open.

Runs the real CLI against 8 netns test hosts (root only; see tests/testbed) and a real
headless Chromium (tests/browser.py): 49 finished runs spread over the hosts and one that
prints a line a second on the first. "Cold start" is from starting `vmrun dashboard` (a new
Python, no connection open) to the page showing all 50 rows; the line's way is from when
it is in the run's log on the host to when it is on the run's page; the idle CPU is the
server's user+system time over `--idle` seconds with the runs page open (it asks for the
runs every 10 s), the ticking run's log still followed (a line a second).

    sudo python benchmarks/dashboard.py [--idle 30] [--screenshots docs/img]

Measured here (2 shared cores, netns hosts): see docs/dashboard.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
# benchmarks/queue.py would stand in for the standard library's queue (asyncio's threads need
# it): this folder goes last on the path, after the standard library's is imported
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import queue  # noqa: E402, F401

sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
sys.path.append(str(HERE))

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402

HOSTS = 8
RUNS = 50
TICKER = "i=0; while [ $i -lt 900 ]; do echo tick-$i; i=$((i+1)); sleep 1; done"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_runs(bed: NetnsBed, home: Path, cwd: Path) -> str:
    from vmrun.backends.hosts import records
    from vmrun.config import load_settings
    from vmrun.results.record import RunRecord
    from vmrun.ssh.connection import Connection

    settings = load_settings({}, cwd=cwd, environ={"HOME": str(home)})
    live = "ticker-20250101-000000-live"
    for n in range(HOSTS):
        with Connection(f"d{n + 1}", settings) as conn:
            for r in range(n, RUNS - 1, HOSTS):
                rid = f"done{r:02d}-20250101-000000-{r:04x}"
                records.start(conn, rid, ".", ["sh", "-c", f"echo run {r}"], RunRecord())
            if n == 0:
                records.start(conn, live, ".", ["sh", "-c", TICKER], RunRecord())
    return live


async def _shot(page: Any, folder: Path | None, name: str) -> None:
    """The page as it is now, as folder/dashboard-NAME.png (no folder: none taken)."""
    if folder is not None:
        await asyncio.sleep(0.3)  # the chart's and table's last paint
        got = await page.call("Page.captureScreenshot", format="png")
        (folder / f"dashboard-{name}.png").write_bytes(base64.b64decode(got["data"]))


async def _measure(
    url: str,
    began: float,
    live: str,
    log: Path,
    tmp: Path,
    pid: int,
    idle: float,
    shots: Path | None,
) -> dict[str, float]:
    from browser import chromium

    async with chromium(tmp) as page:
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=1280,
            height=800,
            deviceScaleFactor=1,
            mobile=False,
        )
        navigated = time.monotonic()
        await page.call("Page.navigate", url=url)
        rows = "document.querySelectorAll('#runs tbody tr').length"
        await page.until(f"{rows} >= {RUNS}", 60, f"{RUNS} rows")
        cold = time.monotonic() - began
        print(f"  the browser was ready at {navigated - began:.2f} s; from its navigation")
        print(f"  to {RUNS} rows: {time.monotonic() - navigated:.2f} s")
        timing = await page.value(
            "(() => { const r = performance.getEntriesByType('resource')"
            ".find((e) => e.name.endsWith('/api/runs'));"
            " return r ? [r.startTime, r.duration] : null; })()"
        )
        if timing:  # from the page's own start (after the redirect): when asked, how long
            print(f"  the page asked for the runs at {timing[0] / 1000:.2f} s of its life,")
            print(f"  answered in {timing[1] / 1000:.2f} s")
        await _shot(page, shots, "runs")
        await page.value(f"location.hash = '#/run/{live}'")
        await page.until("document.getElementById('log').textContent.includes('tick-')", 30, "")
        ways = []
        for _ in range(5):
            text = log.read_text()
            last = int(text.rsplit("tick-", 1)[1].split()[0])
            needle = f"tick-{last + 1}\n"
            while needle not in log.read_text():
                await asyncio.sleep(0.005)
            on_host = time.monotonic()
            shown = f"document.getElementById('log').textContent.includes('tick-{last + 1}')"
            await page.until(shown, 10, "the line")
            ways.append(time.monotonic() - on_host)
        await _shot(page, shots, "run")
        await page.value("location.hash = '#/gpus'")
        await page.until(f"document.querySelectorAll('#gpus tbody tr').length >= {HOSTS}", 60, "")
        await _shot(page, shots, "gpus")
        await page.value("location.hash = '#/'")
        await page.until(f"{rows} >= {RUNS}", 60, "the runs again")
        cpu, wall = _cpu_s(pid), time.monotonic()
        await asyncio.sleep(idle)
        idle_pct = 100 * (_cpu_s(pid) - cpu) / (time.monotonic() - wall)
    line = {"line_median": statistics.median(ways), "line_max": max(ways)}
    return {"cold": cold, **line, "idle_pct": idle_pct}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--screenshots", type=Path, help="a folder: a PNG of each page there")
    args = parser.parse_args()
    reason = skip_reason_no_netns()
    if reason:
        sys.exit(f"needs the netns test bed: {reason}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetnsBed(Path(tmp) / "bed", ClientKeys.generate(Path(tmp) / "keys")) as bed,
    ):
        hosts = [bed.add_host(f"d{n + 1}") for n in range(HOSTS)]
        home, cwd, env = client_dirs(bed, Path(tmp))
        (cwd / "vmrun.toml").write_text(
            "".join(f'[[hosts]]\naddress = "{h.name}"\n\n' for h in hosts)
        )
        live = _start_runs(bed, home, cwd)
        log = hosts[0].home / ".vmrun" / "runs" / live / "log"
        floor = time.monotonic()
        listed = subprocess.run(
            [sys.executable, "-m", "vmrun", "status", "--json", "--all"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        floor = time.monotonic() - floor
        assert listed.stdout.count('"run":') == RUNS, listed.stdout + listed.stderr
        began = time.monotonic()
        server = subprocess.Popen(
            [sys.executable, "-m", "vmrun", "dashboard", "--port", "0"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            printed = time.monotonic() - began
            got = asyncio.run(
                _measure(url, began, live, log, Path(tmp), server.pid, args.idle, args.screenshots)
            )
        finally:
            server.terminate()
            server.wait(30)
    print(f"runs page, {RUNS} runs on {HOSTS} hosts, from a cold start: {got['cold']:.2f} s")
    print(f"  (its address printed after {printed:.2f} s; the floor, `vmrun status --json --all`")
    print(f"  in a new process: {floor:.2f} s)")
    print(
        f"a live log line, host's log to the page: median {got['line_median']:.3f} s,"
        f" max {got['line_max']:.3f} s (5 lines)"
    )
    print(f"server CPU while idle with the runs page open: {got['idle_pct']:.2f} % of a core")


if __name__ == "__main__":
    main()
