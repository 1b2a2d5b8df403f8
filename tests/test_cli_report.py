"""`vmrun report` and `status --json`, the real CLI process: over real `train --local` runs,
and over a real two-host run fetched by report itself, then reported again with the hosts'
copies deleted and the hosts cut off."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from conftest import Client, error_in, run_id_of, template_out
from results_fixtures import local_run
from testbed import TestHost

from vmrun.results.report import HEADERS


def _copy_runs(local_runs: Path, client: Client) -> list[str]:
    shutil.copytree(local_runs / "results", client.cwd / "results")
    return sorted(p.name for p in (client.cwd / "results").iterdir())


def _median_rate(folder: Path) -> float:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return statistics.median(json.loads(x)["samples_per_s"] for x in lines)


def test_two_local_runs_as_json_markdown_and_a_table(local_runs: Path, client: Client) -> None:
    one, two = _copy_runs(local_runs, client)  # 1 process, then 2 (ids sort by time)
    done = client.vmrun("report", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)  # stdout holds the JSON alone
    assert [r["run"] for r in rows] == [one, two]  # every run under results/, oldest first
    for row, procs in zip(rows, (1, 2), strict=True):
        assert (row["where"], row["launcher"], row["nodes"]) == ("local", "torchrun", 1)
        assert (row["procs_per_node"], row["world_size"]) == (procs, procs)
        assert (row["epochs"], row["epochs_asked"]) == (3, 3)
        assert row["total_time_s"] > 0 and row["epoch_time_s"] > 0
        assert row["final_loss"] < 1.0 and row["final_accuracy"] is None
        assert row["samples_per_s"] == _median_rate(client.cwd / "results" / row["run"])
    base, pair = rows
    assert (base["speedup"], base["efficiency"], base["baseline"]) == (1.0, 1.0, one)
    assert pair["speedup"] == pytest.approx(pair["samples_per_s"] / base["samples_per_s"])
    assert pair["efficiency"] == pytest.approx(pair["speedup"] / 2)

    by_name = client.vmrun("report", two, f"results/{one}", "--markdown")  # an id, a path
    assert by_name.returncode == 0, by_name.stderr
    lines = by_name.stdout.splitlines()
    assert lines[0].startswith("| RUN | NODES |") and lines[2].startswith(f"| {two} | 1 | 2 |")
    assert lines[3].startswith(f"| {one} | 1 | 1 | 1 | torchrun | 3/3 |")
    assert lines[-1].startswith(f"speed-up: samples/s over {one} (world size 1)")

    table = client.vmrun("report")  # not a terminal: plain aligned columns
    assert table.returncode == 0, table.stderr
    head, first, second = table.stdout.splitlines()[:3]
    assert head.split() == [w for h in HEADERS for w in h.split()]
    assert first.split()[:6] == [one, "1", "1", "1", "torchrun", "3/3"]
    assert second.split()[:6] == [two, "1", "2", "2", "torchrun", "3/3"]


def test_bad_runs_are_named_and_left_out(local_runs: Path, client: Client) -> None:
    one, _ = _copy_runs(local_runs, client)
    (client.cwd / "results" / "bare-1").mkdir()
    (client.cwd / "results" / "bare-1" / "run.json").write_text("{}")
    done = client.vmrun("report", one, "bare-1", "nope-1", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["run"], r["error"] and r["error"]["code"]) for r in rows] == [
        (one, None),
        ("bare-1", "run-data-missing"),
        ("nope-1", "run-data-missing"),
    ]
    warned = done.stderr.splitlines()
    assert len(warned) == 2 and "Traceback" not in done.stderr, done.stderr
    results = client.cwd / "results"
    why = (
        "and there are no hosts, clusters or store to fetch it from (-H, -C, --store, or"
        " vmrun.toml); left out"
    )
    assert warned == [
        f"vmrun: warning: run bare-1: no metrics.jsonl in {results / 'bare-1'} here, {why}",
        f"vmrun: warning: run nope-1: not in {results}/ here, {why}",
    ]

    none_left = client.vmrun("report", "bare-1")
    assert none_left.returncode == 2 and none_left.stdout == ""
    assert error_in(none_left.stderr)[0] == "usage"
    both = client.vmrun("report", "--json", "--markdown")
    assert both.returncode == 2 and error_in(both.stderr)[0] == "usage"


def test_no_runs_at_all(client: Client) -> None:
    done = client.vmrun("report")
    assert done.returncode == 2 and done.stdout == ""
    code, said = error_in(done.stderr)
    assert code == "run-not-found" and "vmrun train --local" in said, done.stderr
    assert "vmrun fetch" in said  # runs on hosts are here once fetched


def test_differing_metrics_leave_blank_cells(client: Client) -> None:
    results = client.cwd / "results"
    local_run(results, "acc-1", [{"epoch": 1, "loss": 0.5, "eval_accuracy": 0.875}])
    local_run(results, "plain-1", [{"epoch": 1, "loss": 0.25}])
    done = client.vmrun("report", "--json")
    rows = {r["run"]: r for r in json.loads(done.stdout)}
    assert rows["acc-1"]["final_accuracy"] == 0.875 and rows["plain-1"]["final_accuracy"] is None
    assert rows["plain-1"]["samples_per_s"] is None and rows["plain-1"]["speedup"] is None


# its own deadlines: train 300 s, then report/status/plot 5 x 120 s
@pytest.mark.timeout(900)
def test_a_two_host_run_is_fetched_then_reported_with_the_hosts_gone(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    done = multi.vmrun("train", "--epochs", "3", "--nproc-per-node", "1", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    status = multi.vmrun("status", "--json", timeout=120)
    assert status.returncode == 0, status.stderr
    (obj,) = [o for o in json.loads(status.stdout) if o["run"] == rid]
    assert (obj["hosts"], obj["cluster"], obj["state"], obj["exit"]) == (
        ["n1", "n2"],
        None,
        "done",
        0,
    )
    assert (obj["nodes"], obj["procs_per_node"], obj["world_size"]) == (2, 1, 2)
    assert (obj["epochs_done"], obj["epochs_asked"]) == (3, 3) and obj["duration_s"] > 0

    first = multi.vmrun("report", rid, "--json", timeout=120)  # not here: fetched first
    assert first.returncode == 0, first.stderr
    here = multi.cwd / "results" / rid  # the outputs and the master's record; n2's apart
    assert (here / "run.json").is_file() and (here / "n2" / "run.json").is_file()
    assert not (here / "n1").exists()
    assert "fetched" in first.stderr  # fetch's own lines went to stderr, not into the JSON
    (row,) = json.loads(first.stdout)
    assert (row["run"], row["where"], row["launcher"]) == (rid, "hosts", "torchrun")
    assert (row["nodes"], row["procs_per_node"], row["world_size"]) == (2, 1, 2)
    assert (row["epochs"], row["epochs_asked"], row["speedup"]) == (3, 3, 1.0)
    assert row["total_time_s"] > 0 and row["final_loss"] < 1.0

    for host in cluster.values():  # the VMs are gone: their copies and their network
        shutil.rmtree(host.home / ".vmrun" / "runs" / rid, ignore_errors=True)
        shutil.rmtree(template_out(host, multi, rid), ignore_errors=True)
        host.cut_link()
    again = multi.vmrun("report", rid, "--json", timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == [row] and again.stderr == ""
    plotted = multi.vmrun("plot", rid, "-o", "p.svg", timeout=120)
    assert plotted.returncode == 0, plotted.stderr
    assert f'id="run-{rid}"' in (multi.cwd / "p.svg").read_text()
