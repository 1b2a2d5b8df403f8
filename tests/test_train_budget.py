"""`vmrun train --max-cost` on real sshd hosts: each node's budget watcher
(hostside/budget_watch.py) stops the run once it has cost its cap at the hosts' prices in
vmrun.toml, its work saved, with vmrun attached or not; a resume goes on only with a higher
cap. The prices are the test's own (3600 an hour: a unit a second per node), so the cap is
a few seconds of the bed's clock."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, error_in, run_id_of, template_out, wait_for
from testbed import NetnsBed
from train_helpers import env_options, hook_env

HOOKED = ("PYTHONPATH", "VMRUN_TEST_HOOK_EPOCH_DELAY")


@pytest.fixture
def project(bed: NetnsBed, bed_client: Client, host_python: Path) -> Iterator[Client]:
    """h1 and h2 at 3600 USD an hour each, h3 in DKK, h4 without a price."""
    hosts = [
        ("h1", "price = 3600\n"),
        ("h2", "price = 3600\n"),
        ("h3", 'price = 3600\ncurrency = "DKK"\n'),
        ("bastion", ""),
    ]
    (bed_client.cwd / "vmrun.toml").write_text(
        "\n".join(
            f'[[hosts]]\naddress = "{h}"\npython = "{host_python}"\n{extra}' for h, extra in hosts
        )
    )
    bed_client.extra_env["OMP_NUM_THREADS"] = "1"
    yield bed_client
    for name in ("h1", "h2", "h3", "bastion"):
        clean_host(bed[name])


def _status(project: Client, rid: str, *hosts: str) -> dict:
    done = project.vmrun("status", *[w for h in hosts for w in ("-H", h)], "--json")
    (row,) = [r for r in json.loads(done.stdout) if r.get("run") == rid]
    return row


def test_a_detached_run_stops_at_its_cap_with_its_work_saved_and_goes_on_with_a_higher_one(
    bed: NetnsBed, project: Client, trainer_hooks: Path
) -> None:
    """--max-cost 8 at $1 a second: the host's watcher stops the run after some 8 s (the
    epoch under way finished, its snapshot taken), the laptop gone; the run is stopped,
    not failed; --resume keeps the spent cap and is refused, a higher one lets it finish."""
    paced = env_options(hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    done = project.vmrun(
        "train",
        "-H",
        "h1",
        "--epochs",
        "40",
        "--save-every",
        "100",
        "--max-cost",
        "8",
        "--detach",
        *paced,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    wait_for(lambda: _status(project, rid, "h1")["state"] != "running", 120, "the cap's stop")
    row = _status(project, rid, "h1")
    assert row["state"] == "stopped" and row["error"]["code"] == "run-over-budget", row
    assert row["cost"]["currency"] == "USD" and 8 <= row["cost"]["amount"] < 60, row
    log = (bed["h1"].home / ".vmrun" / "runs" / rid / "log").read_text()
    assert "the run has cost --max-cost $8.00: snapshot and stop after this epoch" in log, log
    stopped = re.search(r"stopping after epoch (\d+) for requeue \(SIGUSR2\): snapshot saved", log)
    assert stopped, log[-2000:]
    epoch = int(stopped.group(1))
    assert 0 < epoch < 40
    listed = project.vmrun("status", "-H", "h1")
    assert re.search(rf"{rid}\s+h1\s+stopped, at --max-cost \$8\.00", listed.stdout), listed.stdout
    again = project.vmrun("train", "--resume", rid, *paced, timeout=120)  # the same cap: spent
    code, said = error_in(again.stderr)
    assert again.returncode == 2 and code == "over-budget" and "already cost" in said, said
    assert _status(project, rid, "h1")["attempts"] == 1  # nothing started
    quick = env_options(hook_env(trainer_hooks, EPOCH_DELAY="0"))
    more = project.vmrun("train", "--resume", rid, "--max-cost", "1000", *quick, timeout=300)
    assert more.returncode == 0, more.stderr + more.stdout
    assert f"resumed from snapshot at epoch {epoch + 1} " in more.stdout, more.stdout
    metrics = template_out(bed["h1"], project, rid) / "metrics.jsonl"
    assert [json.loads(x)["epoch"] for x in metrics.read_text().splitlines()] == list(range(1, 41))
    # its cost counts both attempts (at $1 a second: the first's seconds are its dollars)
    meta = json.loads((bed["h1"].home / ".vmrun" / "runs" / rid / "run.json").read_text())
    assert abs(meta["ran_before_s"] - row["cost"]["amount"]) < 2, (meta, row)
    assert _status(project, rid, "h1")["cost"]["amount"] > row["cost"]["amount"] + 1


def test_a_followed_run_on_two_nodes_ends_with_its_code_and_a_cap_without_prices_is_refused(
    bed: NetnsBed, project: Client, trainer_hooks: Path
) -> None:
    """Two nodes at $1 a second each: the cap of 6 is 3 s; the follower says the run was
    stopped at its cap (run-over-budget, 143) with how to go on. A host without a price, or
    prices in two currencies, cannot be capped: refused before anything starts."""
    paced = env_options(hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    done = project.vmrun(
        "train",
        "-H",
        "h1",
        "-H",
        "h2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "40",
        "--save-every",
        "100",
        "--max-cost",
        "6",
        *paced,
        timeout=300,
    )
    code, said = error_in(done.stderr)
    assert done.returncode == 143 and code == "run-over-budget", done.stderr
    assert "--max-cost $6.00" in said and "--resume" in done.stderr, done.stderr
    rid = run_id_of(done.stderr)
    row = _status(project, rid, "h1", "h2")
    assert row["state"] == "stopped" and row["cost"]["per_hour"] == 7200, row
    for hosts, why in (
        (["-H", "h1", "-H", "bastion"], "no price for bastion"),
        (["-H", "h1", "-H", "h3"], "different currencies"),
    ):
        refused = project.vmrun(
            "train",
            *hosts,
            "--nproc-per-node",
            "1",
            "--epochs",
            "2",
            "--max-cost",
            "5",
            timeout=120,
        )
        code, said = error_in(refused.stderr)
        assert refused.returncode == 2 and code == "over-budget" and why in said, said
    for host in ("h1", "bastion", "h3"):
        runs = bed[host].home / ".vmrun" / "runs"
        started = [p.name for p in runs.glob("[!.]*")] if runs.is_dir() else []
        assert started in ([], [rid]), (host, started)  # nothing new started


def test_a_sweeps_cap_is_shared_by_its_sizes_and_resume_with_a_higher_one_finishes_it(
    bed: NetnsBed, project: Client, trainer_hooks: Path
) -> None:
    """`sweep --max-cost 8` on h1 at $1 a second: the first size gets the whole cap and is
    stopped at it (its 20 paced epochs take longer); the second is not started. Resumed with
    a higher cap, both finish, and the report adds up what they cost."""
    paced = env_options(hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    done = project.vmrun(
        "sweep",
        "-H",
        "h1",
        "--nproc-per-node",
        "1,2",
        "--epochs",
        "20",
        "--max-cost",
        "8",
        *paced,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr + done.stdout
    assert "its --max-cost 8 is spent" in done.stderr, done.stderr
    (folder,) = (project.cwd / "results").glob("sweep-*")
    record = json.loads((folder / "sweep.json").read_text())
    assert [s["state"] for s in record["sizes"]] == ["failed", "pending"], record
    assert "--max-cost $8.00" in record["sizes"][0]["detail"], record
    quick = env_options(hook_env(trainer_hooks, EPOCH_DELAY="0"))
    more = project.vmrun(
        "sweep", "--resume", folder.name, "--max-cost", "1000", *quick, timeout=600
    )
    assert more.returncode == 0, more.stderr + more.stdout
    assert re.search(r"cost in all: \$[\d.]+ \(2 runs\)", more.stdout), more.stdout
