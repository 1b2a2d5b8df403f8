"""`vmrun train -C --recover` on a real Slurm (tests/testbed/slurm.py): a failed attempt
brings the job back by itself, with nothing of vmrun's running anywhere but the job (the
run is submitted with --detach; the follower comes only to read the end), never again on a
node that was lost, within --max-recoveries."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from conftest import Client, wait_for
from test_cli_slurm import (
    epochs_in,
    follow_to_the_end,
    job_of,
    out_dir,
    record_dir,
    run_id_of,
    status_rows,
    use_cluster,
)
from train_helpers import hook_env


def recoveries_of(rec: Path) -> list[list[str]]:
    path = rec / "recoveries"
    return [ln.split("\t") for ln in path.read_text().splitlines()] if path.exists() else []


def test_a_lost_node_is_left_out_and_the_run_goes_on_from_its_snapshot_elsewhere(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, trainer_hooks: Path
) -> None:
    """The batch host dies with everything on it (slurmd, the step, the batch shell: nothing
    of the attempt is left to say so) and the controller marks it down; Slurm requeues the
    job. The node comes back at once, before the job may start again: only the job's own
    record keeps it off. The run goes on from its snapshot on the other node, epochs 1..N
    each once, and says what the recovery cost."""
    use_cluster(slurm_client, host_python, **hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    toml = slurm_client.cwd / "vmrun.toml"  # $1.50 a node an hour: what the run cost
    toml.write_text(
        toml.read_text().replace('partition = "debug"\n', 'partition = "debug"\nprice = 1.5\n')
    )
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--recover",
        "--nproc-per-node",
        "2",
        "--epochs",
        "14",
        "--save-every",
        "2",
        "--detach",
    )
    assert done.returncode == 0, done.stderr
    rid, job = run_id_of(done.stderr), job_of(done.stderr)
    metrics = out_dir(slurm_cluster, slurm_client, rid) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(epochs_in(metrics)) >= 3, 120, "three epochs")
    rec = record_dir(slurm_cluster, rid)
    lost = (rec / "nodes").read_text().split()[0]
    host = next(h for h in slurm_cluster.computes if h.hostname == lost)
    try:
        slurm_cluster.lose_node(host)
        slurm_cluster.bring_back(host)
        code, out, err = follow_to_the_end(slurm_client, rid)
    finally:
        slurm_cluster.bring_back(host)
    assert code == 0, err + out
    assert epochs_in(metrics) == list(range(1, 15))
    assert "resumed from snapshot at epoch" in out, out
    assert lost not in (rec / "nodes").read_text().split()
    shown = slurm_cluster.run_on_login(["scontrol", "show", "job", job]).stdout
    assert re.search(rf"ExcNodeList=\S*{lost}", shown), shown
    told = [r for r in recoveries_of(rec) if r[0] == "recovery"]
    assert len(told) == 1 and f"node(s) {lost} lost" in told[0][2], told
    assert f'"lost": ["{lost}"]' in told[0][3] and '"downtime_s": ' in told[0][3], told
    assert f"attempt 1 failed (node(s) {lost} lost)" in out, out
    # said where the run went on, with the whole downtime (an attempt placed on the lost
    # node again, back in service, left at once)
    assert f" on {lost} " not in told[0][2], told
    assert status_rows(slurm_client)[rid][2].endswith("recovered 1x")
    fetched = slurm_client.vmrun("fetch", "results", "-C", "bed", "--run", rid)
    assert fetched.returncode == 0, fetched.stderr
    (row,) = json.loads(slurm_client.vmrun("report", rid, "--json").stdout)
    assert row["cost"] is not None and row["cost"] >= 0 and row["currency"] == "USD", row
    (recovery,) = row["recoveries"]
    assert recovery["cost_s"] >= recovery["downtime_s"] > 0, recovery
    assert recovery["cost"] == round(recovery["cost_s"] / 3600 * 1.5, 2), recovery


def test_a_node_that_slurm_takes_down_under_the_job_is_kept_off_the_next_attempt(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """A health check (or an admin) sets the job's node down while its slurmd lives: Slurm
    aborts the step and requeues the job itself, srun says "Node failure" (and exits 0); the
    batch shell keeps the node off the job while it waits, so the node's return (its slurmd
    registers again within seconds) changes nothing."""
    use_cluster(slurm_client, host_python)
    flag = slurm_cluster.shared / "go"
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--recover",
        "wait_for_file.py",
        "--launcher",
        "python",
        "--detach",
        "--",
        str(flag),
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    rec = record_dir(slurm_cluster, rid)
    log = rec / "job.log"
    wait_for(lambda: log.exists() and "waiting for the flag" in log.read_text(), 60, "a start")
    node = (rec / "nodes").read_text().split()[0]
    update = ["scontrol", "update", f"NodeName={node}"]
    try:
        down = slurm_cluster.login.run([*update, "State=DOWN", "Reason=gpu"], check=False)
        assert down.returncode == 0
        wait_for(lambda: (rec / "lost").exists(), 30, "the node remembered as lost")
    finally:
        slurm_cluster.login.run([*update, "State=RESUME"], check=False)
    wait_for(lambda: log.read_text().count("waiting for the flag") == 2, 60, "attempt 2")
    flag.touch()
    code, out, err = follow_to_the_end(slurm_client, rid)
    assert code == 0, err + out
    assert (rec / "nodes").read_text().split() != [node]
    assert (rec / "lost").read_text().split() == [node]
    told = [r for r in recoveries_of(rec) if r[0] == "recovery"]
    assert len(told) == 1 and f"node(s) {node} lost" in told[0][2], told


def test_a_crash_is_requeued_and_a_crash_loop_stops_at_the_limit(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """A step that fails on nodes that all still answer: the job is requeued on any nodes
    (none is left out); the same failure again and again ends after --max-recoveries, with
    one line saying why and the script's own exit code."""
    use_cluster(slurm_client, host_python)
    once = slurm_cluster.shared / "once"
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--recover",
        "fails_times.py",
        "--launcher",
        "python",
        "--",
        str(once),
        "1",
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "run 2: done" in done.stdout, done.stdout
    rid = run_id_of(done.stderr)
    rec = record_dir(slurm_cluster, rid)
    assert not (rec / "lost").exists()
    assert [r[0] for r in recoveries_of(rec)] == ["recovery"]
    assert "attempt 1 failed (exit 5)" in recoveries_of(rec)[0][2]

    loop = slurm_cluster.shared / "loop"
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--recover",
        "--max-recoveries",
        "1",
        "fails_times.py",
        "--launcher",
        "python",
        "--",
        str(loop),
        "99",
    )
    assert done.returncode == 5, done.stderr + done.stdout
    assert len(list(loop.iterdir())) == 2  # the first attempt and one recovery
    rid = run_id_of(done.stderr)
    kinds = [r[0] for r in recoveries_of(record_dir(slurm_cluster, rid))]
    assert kinds == ["recovery", "gave-up"], kinds
    said = done.stdout + done.stderr
    assert said.count("--max-recoveries 1 spent") == 1, said
    assert status_rows(slurm_client)[rid][2] == "failed, attempt 2, gave up after 1 recovery"


def test_submit_recover_brings_back_a_bash_scripts_job_and_refuses_other_scripts(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """The user's own bash script, submitted with --recover: a copy with vmrun's lines after
    its header runs; its failure requeues the job, which then ends well. A script in
    another language is refused before anything is submitted."""
    use_cluster(slurm_client, host_python)
    (slurm_client.cwd / "again.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --output=again-%j.out\n\n"
        'set -euo pipefail\n"$1" fails_times.py "$2" 1\necho "the script ends"\n'
    )
    times = slurm_cluster.shared / "times"
    done = slurm_client.vmrun(
        "submit", "again.sh", "-C", "bed", "--recover", "--", str(host_python), str(times)
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "run 2: done" in done.stdout and "the script ends" in done.stdout, done.stdout
    rid = run_id_of(done.stderr)
    rec = record_dir(slurm_cluster, rid)
    ran = (rec / "batch.sh").read_text()
    assert (
        ran.index("#SBATCH --output")
        < ran.index("VMRUN_MAX_RECOVERIES=5")
        < ran.index("set -euo pipefail")
    )
    told = recoveries_of(rec)
    assert [r[0] for r in told] == ["recovery"] and "attempt 1 failed (exit 5)" in told[0][2]
    assert status_rows(slurm_client)[rid][2].endswith("recovered 1x")

    # a stop is no failure to recover from: the job ends, nothing is requeued or left out
    (slurm_client.cwd / "waits.sh").write_text(
        '#!/bin/bash -e\n#SBATCH --nodes=1\n  # an indented comment\n"$1" wait_for_file.py "$2"\n'
    )
    flag = slurm_cluster.shared / "never"
    done = slurm_client.vmrun(
        "submit",
        "waits.sh",
        "-C",
        "bed",
        "--recover",
        "--detach",
        "--",
        str(host_python),
        str(flag),
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    rec = record_dir(slurm_cluster, rid)
    wait_for(lambda: (rec / "starts").exists(), 60, "the job's start")
    stopped = slurm_client.vmrun("stop", rid, "-C", "bed")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not slurm_cluster.squeue_ids(), 60, "the job gone from the queue")
    assert not (rec / "recoveries").exists() and not (rec / "lost").exists()
    assert (rec / "exit").read_text().split()[1] == "terminated"

    (slurm_client.cwd / "job.py").write_text("#!/usr/bin/env python3\n#SBATCH --nodes=1\n")
    refused = slurm_client.vmrun("submit", "job.py", "-C", "bed", "--recover")
    assert refused.returncode == 2 and "error[flags-conflict]" in refused.stderr, refused.stderr
    assert "not a bash script" in refused.stderr
    assert slurm_cluster.squeue_ids() == []
