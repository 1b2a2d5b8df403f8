"""Hangs, stacks and stragglers on real network-namespace hosts: real torchrun over gloo on
2 hosts x 2 ranks, real py-spy (sent by vmrun from the wheel .ci/run keeps), each node's
hang watcher (hostside/hang_watch.py) as it runs beside a run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import Client, run_id_of, wait_for
from testbed import TestHost

from vmrun.remote_paths import remote_workdir
from vmrun.trainer import template as template_module

SCRIPTS = Path(__file__).resolve().parent / "hang_scripts"
TIMEOUT_S = 6


def _copy(multi: Client, *names: str) -> None:
    for name in names:
        shutil.copy(SCRIPTS / name, multi.cwd / name)


def _record(host: TestHost, rid: str) -> Path:
    return host.home / ".vmrun/runs" / rid


@pytest.mark.timeout(300)
def test_a_rank_that_stops_before_all_reduce_is_found_hung_with_every_ranks_stack(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """Rank 3 waits for a file before its 3rd all_reduce, the others wait in it: each node's
    watcher finds the stall within 2x --hang-timeout, takes its ranks' stacks (naming the
    right file and line), and --on-hang stop ends the run with 124; `vmrun stacks --hang`
    groups the four ranks into the two places."""
    _copy(multi, "hang_rank.py")
    done = multi.vmrun("train", "hang_rank.py", "--nproc-per-node", "2", "--hang-timeout",
                       f"{TIMEOUT_S}s", "--on-hang", "stop", "--env", "HANG_RANK=3",
                       timeout=240)  # fmt: skip
    assert done.returncode == 124, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert re.search(r"hung on \S+: ranks 0-1; stacks in", done.stdout), done.stdout
    assert re.search(r"hung on \S+: ranks 2-3; stacks in", done.stdout), done.stdout
    # the follower took every node's stacks too, before the stop
    assert "every rank's stacks now" in done.stderr, done.stderr
    live = multi.cwd / "results" / rid / "stacks" / "hang-live-1"
    assert sorted(p.name for p in live.glob("rank-*.json")) == [f"rank-{r}.json" for r in range(4)]
    for host in ("n1", "n2"):
        seen = json.loads((_record(cluster[host], rid) / "hang").read_text())
        assert TIMEOUT_S <= seen["seen"] - seen["since"] <= 2 * TIMEOUT_S, seen
        assert seen["action"] == "stop"
    hang_line = next(i for i, line in enumerate(Path(SCRIPTS / "hang_rank.py").read_text()
                                                .splitlines(), 1) if "the place its stack" in line)
    reduce_line = next(i for i, line in enumerate(Path(SCRIPTS / "hang_rank.py").read_text()
                                                  .splitlines(), 1) if "the others wait" in line)
    shown = multi.vmrun("stacks", rid, "--hang", timeout=60)
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert f"ranks 0-2 (n1, n2): all_reduce at hang_rank.py:{reduce_line}" in shown.stdout, \
        shown.stdout
    assert f"rank 3 (n2): in wait_forever at hang_rank.py:{hang_line}" in shown.stdout, \
        shown.stdout
    assert "ranks 0-2 wait in all_reduce for rank 3" in shown.stdout, shown.stdout
    kept = multi.cwd / "results" / rid / "stacks" / "hang"
    assert sorted(p.name for p in kept.glob("rank-*.json")) == [f"rank-{r}.json" for r in range(4)]
    # the status tells why it failed
    status = multi.vmrun("status")
    assert re.search(rf"{rid}\s+n1\s+failed, hung \(stopped\)", status.stdout), status.stdout
    # the dumps come with the run's logs
    fetched = multi.vmrun("fetch", "logs", "--run", rid, timeout=120)
    assert fetched.returncode == 0, fetched.stderr
    local = multi.cwd / "results" / rid
    assert (local / "n2" / "stacks" / "hang-1" / "rank-3.json").is_file(), sorted(
        str(p.relative_to(local)) for p in local.rglob("*"))
    assert json.loads((local / "n1" / "hang").read_text())["action"] == "stop"


@pytest.mark.timeout(300)
def test_stacks_of_a_live_run_are_grouped_and_quick(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """`vmrun stacks` on a healthy 2 x 2 run: every rank found, in the user's file, taken in
    under 3 s once py-spy is on the hosts; the run is not disturbed."""
    _copy(multi, "hang_rank.py")
    started = multi.vmrun("train", "hang_rank.py", "--nproc-per-node", "2", "--detach",
                          "--env", "HANG_RANK=-1", timeout=120)  # fmt: skip
    assert started.returncode == 0, started.stderr + started.stdout
    rid = run_id_of(started.stderr)
    try:
        log = _record(cluster["n2"], rid) / "log"
        wait_for(lambda: log.exists() and "step 2" in log.read_text(), 120, "the run's steps")
        shown = multi.vmrun("stacks", rid, timeout=60)
        assert shown.returncode == 0, shown.stderr + shown.stdout
        ranks = {int(r) for line in shown.stdout.splitlines()
                 for r in re.findall(r"\d+", line.split("(")[0])}  # fmt: skip
        assert ranks >= {0, 1, 2, 3} or "ranks 0-3" in shown.stdout, shown.stdout
        assert "hang_rank.py:" in shown.stdout, shown.stdout
        took = float(re.search(r"\(([\d.]+) s\)", shown.stderr).group(1))
        assert took < 3.0, shown.stderr
        assert "no progress" not in log.read_text()
    finally:
        multi.vmrun("stop", rid, timeout=60)


@pytest.mark.timeout(300)
def test_a_slow_rank_is_named_in_the_log_metrics_and_status(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """The template with rank 3 sleeping 20 ms in each forward pass: its log names rank 3
    (node 1) as slow, metrics.jsonl has every rank's step time, status names it."""
    _copy(multi, "slow_rank.py")
    shutil.copy(template_module.__file__, multi.cwd / "template.py")
    done = multi.vmrun("train", "slow_rank.py", "--nproc-per-node", "2", "--env", "SLOW_RANK=3",
                       "--", "3", "3", timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert re.search(r"slow rank 3 \(node 1\): [\d.]+x the others' step time", done.stdout), \
        done.stdout
    assert not re.search(r"slow rank [012]", done.stdout), done.stdout
    out = cluster["n1"].home / remote_workdir(multi.cwd)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(len(m["rank_step_s"]) == 4 and m["rank_node"] == [0, 0, 1, 1] for m in lines)
    assert all(max(m["rank_step_s"]) == m["rank_step_s"][3] for m in lines), lines
    fetched = multi.vmrun("fetch", "metrics", "--run", rid, timeout=120)
    assert fetched.returncode == 0, fetched.stderr
    report = multi.vmrun("report", rid, "--json")
    (row,) = json.loads(report.stdout)
    assert [(s["rank"], s["node"]) for s in row["slow_ranks"]] == [(3, 1)], row
    status = multi.vmrun("status")
    assert re.search(rf"{rid}\s+n1\s+done\s+epoch 3\S*, rank 3 \(node 1\) slow: [\d.]+x",
                     status.stdout), status.stdout
