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
def test_live_stacks_then_a_rank_that_stops_before_all_reduce_is_found_hung(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """2 x 2 ranks; first `vmrun stacks` on the live run: every rank in the user's file, in
    under 3 s. Then rank 3 waits for a file before its 30th all_reduce, the others wait in
    it: each node's watcher finds the stall within 2x --hang-timeout and takes its ranks'
    stacks (naming the right file and line), the follower takes every node's, and
    --on-hang stop ends the run with 124; `vmrun stacks --hang` groups the four ranks into
    the two places and names who holds the collective up."""
    _copy(multi, "hang_rank.py")
    runs = cluster["n1"].home / ".vmrun" / "runs"
    proc = multi.popen(
        "train",
        "hang_rank.py",
        "--nproc-per-node",
        "2",
        "--hang-timeout",
        f"{TIMEOUT_S}s",
        "--on-hang",
        "stop",
        "--env",
        "HANG_RANK=3",
        "--env",
        "HANG_AT=30",
        "--env",
        "HANG_FR=1",
    )
    try:
        wait_for(
            lambda: runs.is_dir() and any(p.is_dir() for p in runs.iterdir()),
            120,
            "the run's record",
        )
        (rid,) = [p.name for p in runs.iterdir() if p.is_dir()]
        log = _record(cluster["n2"], rid) / "log"
        wait_for(lambda: log.exists() and "step 2 " in log.read_text(), 120, "the run's steps")
        live = multi.vmrun("stacks", rid, timeout=60)
        assert live.returncode == 0, live.stderr + live.stdout
        assert "hang_rank.py:" in live.stdout, live.stdout
        assert _ranks(live.stdout) == {0, 1, 2, 3}, live.stdout
        took = float(re.search(r"\(([\d.]+) s\)", live.stderr).group(1))
        assert took < 3.0, live.stderr
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 124, stderr + stdout
    assert re.search(r"hung on \S+: ranks 0-1; stacks in", stdout), stdout
    assert re.search(r"hung on \S+: ranks 2-3; stacks in", stdout), stdout
    # the follower took every node's stacks too, before the stop
    assert "every rank's stacks now" in stderr, stderr
    kept = multi.cwd / "results" / rid / "stacks" / "hang-live-1"
    assert sorted(p.name for p in kept.glob("rank-*.json")) == [f"rank-{r}.json" for r in range(4)]
    for host in ("n1", "n2"):
        seen = json.loads((_record(cluster[host], rid) / "hang").read_text())
        assert TIMEOUT_S <= seen["seen"] - seen["since"] <= 2 * TIMEOUT_S, seen
        assert seen["action"] == "stop"
    text = Path(SCRIPTS / "hang_rank.py").read_text().splitlines()
    hang_line = next(i for i, line in enumerate(text, 1) if "the place its stack" in line)
    reduce_line = next(i for i, line in enumerate(text, 1) if "the others wait" in line)
    shown = multi.vmrun("stacks", rid, "--hang", timeout=60)
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert f"ranks 0-2 (n1, n2): all_reduce at hang_rank.py:{reduce_line}" in shown.stdout, (
        shown.stdout
    )
    assert f"rank 3 (n2): in wait_forever at hang_rank.py:{hang_line}" in shown.stdout, shown.stdout
    assert "ranks 0-2 wait in all_reduce for rank 3" in shown.stdout, shown.stdout
    # torch's flight recorder dumps (real gloo records; the dump's trigger is the STAND-IN
    # for NCCL's watchdog): rank 3 never reached the 30th collective
    assert (
        "flight recorder: ranks 0-2 reached collective #30 (gloo:all_reduce); rank 3 did"
        " not (last: #29)"
    ) in shown.stdout, shown.stdout
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
        str(p.relative_to(local)) for p in local.rglob("*")
    )
    # the master's record beside the run's outputs, each other node's in a folder of its own
    assert json.loads((local / "hang").read_text())["action"] == "stop"


def _ranks(said: str) -> set[int]:
    """The ranks `vmrun stacks` names, from its `rank(s) 0-2,5 (hosts): place` lines."""
    found: set[int] = set()
    for spans in re.findall(r"^ranks? ([\d,-]+) \(", said, re.M):
        for part in spans.split(","):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


@pytest.mark.timeout(300)
def test_a_slow_rank_is_named_in_the_log_metrics_and_status(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """The template with rank 3 sleeping 20 ms in each forward pass: its log names rank 3
    (node 1) as slow, metrics.jsonl has every rank's step time, status names it."""
    _copy(multi, "slow_rank.py")
    shutil.copy(template_module.__file__, multi.cwd / "template.py")
    done = multi.vmrun(
        "train",
        "slow_rank.py",
        "--nproc-per-node",
        "2",
        "--env",
        "SLOW_RANK=3",
        "--",
        "3",
        "3",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert re.search(r"slow rank 3 \(node 1\): [\d.]+x the others' step time", done.stdout), (
        done.stdout
    )
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
    assert re.search(
        rf"{rid}\s+n1\s+done\s+epoch 3\S*, rank 3 \(node 1\) slow: [\d.]+x", status.stdout
    ), status.stdout
