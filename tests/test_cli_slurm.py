"""`vmrun train/status/logs/stop/fetch -C` on a real Slurm (slurmctld on a login test host,
slurmd on two compute hosts, munge; tests/testbed/slurm.py), through the login node's sshd.
No GPUs here: CPU tasks with gloo; the GRES `gpu` has counts only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, error_in, errors_in, wait_for
from train_helpers import Gate, assert_matches_one_process, hook_env

SCRIPTS = Path(__file__).parent / "slurm_scripts"


def use_cluster(client: Client, python: Path, **env: str) -> None:
    """The project's vmrun.toml names the bed's cluster, its interpreter and job variables."""
    extra = ", ".join(f'{k} = "{v}"' for k, v in {"OMP_NUM_THREADS": "1", **env}.items())
    (client.cwd / "vmrun.toml").write_text(
        f'[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'python = "{python}"\nenv = {{ {extra} }}\n'
    )
    for script in SCRIPTS.iterdir():
        shutil.copy(script, client.cwd / script.name)


def run_id_of(text: str) -> str:
    match = re.search(r"run (\S+) submitted to bed as job (\d+)", text)
    assert match, text
    return match.group(1)


def job_of(text: str) -> str:
    match = re.search(r"submitted to bed as job (\d+)", text)
    assert match, text
    return match.group(1)


def out_dir(cluster: Any, client: Client, rid: str) -> Path:
    from vmrun.remote_paths import remote_workdir

    return cluster.login.home / remote_workdir(client.cwd) / "results" / rid


def record_dir(cluster: Any, rid: str) -> Path:
    return cluster.login.home / ".vmrun" / "runs" / rid


def status_rows(client: Client, *where: str) -> dict[str, list[str]]:
    done = client.vmrun("status", *(where or ("-C", "bed")))
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines()[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    return rows


def job_pids(cluster: Any) -> list[int]:
    """Processes of the login user on the compute hosts: the jobs' tasks (by pid)."""
    uid = cluster.login.uid
    found = []
    for host in cluster.computes:
        for pid in host.pids():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    found.append(pid)
            except OSError:
                continue
    return found


def test_template_over_two_nodes_equals_a_one_process_run(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, tmp_path: Path
) -> None:
    """torchrun on 2 nodes (one task each, 1 worker per node) through sbatch: real DDP
    across the nodes, whose final weights equal a 1-process run with the same global batch."""
    use_cluster(slurm_client, host_python)
    args = ["4", "2", "--batch-size", "16", "--dataset-size", "512", "--deterministic"]
    # --cpus-per-task: srun in Slurm 22.05+ takes it only from SRUN_CPUS_PER_TASK
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--cpus-per-task",
        "2",
        "--",
        *args,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    c1, c2 = slurm_cluster.node_names
    ranks = {
        re.match(r"\[(\S+) rank(\d)\]", ln).groups()  # type: ignore[union-attr]
        for ln in done.stdout.splitlines()
        if "started: pid" in ln
    }
    assert ranks == {(c1, "0"), (c2, "1")}, done.stdout
    final = out_dir(slurm_cluster, slurm_client, rid) / "finalmodel.pt"
    one = ["4", "2", "--batch-size", "32", "--dataset-size", "512", "--deterministic"]
    assert_matches_one_process(final, one, tmp_path / "single")
    metrics = [json.loads(x) for x in (final.parent / "metrics.jsonl").read_text().splitlines()]
    assert [m["world_size"] for m in metrics] == [2, 2, 2, 2]
    row = status_rows(slurm_client)[rid]
    assert row[1:4] == ["bed", "done", "epoch 4/4"], row
    # with neither -H nor -C: the project's clusters (here its only place to run)
    assert status_rows(slurm_client, "--all")[rid] == row
    # fetch brings the outputs back from the shared filesystem through the login node
    fetched = slurm_client.vmrun("fetch", "results", "-C", "bed", "--run", rid)
    assert fetched.returncode == 0, fetched.stderr
    local = slurm_client.cwd / "results" / rid
    assert (local / "finalmodel.pt").read_bytes() == final.read_bytes()
    assert (local / "metrics.jsonl").exists()
    # what made it: each node described itself (hostside/run_provenance.py) beside the record
    nodes = {}
    for name in (c1, c2):
        facts = json.loads((local / f"provenance-{name}.json").read_text())
        nodes[name] = facts["slurm"]
        assert facts["hardware"]["hostname"] == name
        assert facts["environment"]["python"]["executable"] == str(host_python)
    assert {n["partition"] for n in nodes.values()} == {"debug"}
    assert nodes[c1]["nodes"] == [c1, c2] and nodes[c1]["job_id"] == job_of(done.stderr)
    assert "node=2" in (nodes[c1]["alloc_tres"] or "")  # node 0 asked scontrol for the allocation
    assert (local / "environment.txt").read_text().startswith("# python ")
    assert json.loads((local / "run.json").read_text())["code"]["files"] == 1  # the template
    # report and status --json read the Slurm record's shape and times
    (row,) = json.loads(slurm_client.vmrun("report", rid, "--json").stdout)
    assert (row["where"], row["nodes"], row["procs_per_node"], row["world_size"]) == (
        "cluster",
        2,
        1,
        2,
    )
    assert (row["epochs"], row["epochs_asked"]) == (4, 4) and row["total_time_s"] > 0
    assert row["versions"]["torch"] and row["versions"]["python"]
    listed = json.loads(slurm_client.vmrun("status", "-C", "bed", "--json").stdout)
    (obj,) = [o for o in listed if o["run"] == rid]
    assert (obj["cluster"], obj["hosts"], obj["state"], obj["exit"]) == ("bed", None, "done", 0)
    assert (obj["world_size"], obj["epochs_done"], obj["epochs_asked"]) == (2, 4, 4)


def test_one_task_per_gpu_script_with_the_env_launcher(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """The university workflow: 2 nodes x 2 tasks (one per GPU of the GRES), rank from
    SLURM_PROCID, the script unchanged; every line prefixed with its node and rank."""
    use_cluster(slurm_client, host_python)
    args = ["one_task_per_gpu.py", "--launcher", "env", "--nodes", "2", "--gpus-per-node", "2"]
    done = slurm_client.vmrun("train", "-C", "bed", *args, "--", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    c1, c2 = slurm_cluster.node_names
    lines = sorted(ln for ln in done.stdout.splitlines() if " sum " in ln)
    assert lines == [
        f"[{c1} rank0] rank 0 local 0 of 4 on {c1} sum 6",
        f"[{c1} rank1] rank 1 local 1 of 4 on {c1} sum 6",
        f"[{c2} rank2] rank 2 local 0 of 4 on {c2} sum 6",
        f"[{c2} rank3] rank 3 local 1 of 4 on {c2} sum 6",
    ], done.stdout
    assert (
        "--gpus-per-node=2"
        in (record_dir(slurm_cluster, run_id_of(done.stderr)) / "job.sh").read_text()
    )


def test_mp_spawn_script_with_the_python_launcher(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    use_cluster(slurm_client, host_python)
    done = slurm_client.vmrun(
        "train", "-C", "bed", "mp_spawn.py", "--launcher", "python", "--", "2", timeout=300
    )
    assert done.returncode == 0, done.stderr + done.stdout
    spawned = sorted(re.findall(r"spawned rank (\d) of 2 sum 2", done.stdout))
    assert spawned == ["0", "1"], done.stdout


def test_a_failed_worker_s_own_code_and_rank_are_the_run_s(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """Two nodes under torchrun, rank 1 (on the second) exits 3: torchrun and srun say 1,
    vmrun says 3 and names the rank, and so do the record, status and the job's own exit."""
    use_cluster(slurm_client, host_python)
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "rank1_fails.py",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--",
        timeout=300,
    )
    assert done.returncode == 3, done.stderr + done.stdout
    c2 = slurm_cluster.node_names[1]
    said = rf"exit code 3: rank 1 \(local rank 0\) on {c2}\S* exited with 3"
    assert re.search(said, done.stderr), done.stderr
    rid = run_id_of(done.stderr)
    failure = json.loads((record_dir(slurm_cluster, rid) / "failure.json").read_text())
    assert (failure["rank"], failure["exit"], failure["launcher_exit"]) == (1, 3, 1), failure
    status = slurm_client.vmrun("status", "-C", "bed", "--json")
    (row,) = [r for r in json.loads(status.stdout) if r["run"] == rid]
    assert (row["state"], row["exit"], row["failure"]["rank"]) == ("failed", 3, 1), row


def test_train_data_goes_once_to_the_shared_filesystem_and_the_job_reads_it(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    use_cluster(slurm_client, host_python)
    data = slurm_client.cwd / "data"
    made = {f"part{i}.bin": os.urandom(5000 + i) for i in range(3)}
    (data / "sub").mkdir(parents=True)
    for name, blob in made.items():
        (data / "sub" / name).write_bytes(blob)
    (slurm_client.cwd / "read_data.py").write_text(
        "import hashlib, pathlib\n"
        "files = sorted(p for p in pathlib.Path('data').rglob('*') if p.is_file())\n"
        "print('data', len(files), hashlib.sha256(b''.join(p.read_bytes() for p in files))"
        ".hexdigest())\n"
    )
    (slurm_client.cwd / ".vmrunignore").write_text("data/\n")  # it travels by --data alone
    args = ["read_data.py", "--launcher", "python", "--data", "data"]
    dry = slurm_client.vmrun("train", "-C", "bed", *args, "--dry-run", "--")
    assert dry.returncode == 0 and "# push " in dry.stdout and "/data" in dry.stdout, dry.stderr
    done = slurm_client.vmrun("train", "-C", "bed", *args, "--", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    digest = hashlib.sha256(b"".join(made[n] for n in sorted(made))).hexdigest()
    assert f"data 3 {digest}" in done.stdout and "pushed 3 file(s)" in done.stderr, done.stdout
    meta = json.loads((record_dir(slurm_cluster, run_id_of(done.stderr)) / "run.json").read_text())
    (entry,) = meta["data"]
    assert entry["files"] == 3 and entry["manifest"] and entry["remote"].endswith("/data")
    again = slurm_client.vmrun("train", "-C", "bed", *args, "--", timeout=300)
    assert again.returncode == 0 and "pushed" not in again.stderr  # nothing changed: nothing sent


def fill_partition(cluster: Any) -> str:
    """A job of the login user that holds every node of `debug` until cancelled."""
    held = cluster.run_on_login(
        ["sbatch", "--parsable", "-p", "debug", "-N", "2", "--exclusive", "--wrap", "sleep 600"]
    )
    assert held.returncode == 0, held.stderr
    job = held.stdout.strip()
    wait_for(
        lambda: "RUNNING" in cluster.run_on_login(["squeue", "-h", "-j", job, "-o", "%T"]).stdout,
        30,
        "the blocking job to run",
    )
    return job


def test_pending_with_its_reason_then_running_then_done_and_logs_f_prints_each_line_once(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    use_cluster(slurm_client, host_python)
    blocker = fill_partition(slurm_cluster)
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "3",
        "--save-every",
        "1",
        "--detach",
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    row = status_rows(slurm_client)[rid]
    assert re.fullmatch(r"pending \((Resources|Priority)\)", row[2]), row
    follower = slurm_client.popen("logs", "-f", rid, "-C", "bed")
    notes: list[str] = []
    reader = threading.Thread(target=lambda: notes.extend(follower.stderr or ()), daemon=True)
    reader.start()
    try:
        # attached while pending; then the partition frees up and the run goes through
        pending = re.compile(r"job \d+ is PENDING \((Resources|Priority)\)")
        wait_for(lambda: any(pending.search(n) for n in notes), 60, "the pending state")
        slurm_cluster.run_on_login(["scancel", blocker])
        out = follower.stdout.read() if follower.stdout else ""
        follower.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        follower.kill()
    assert follower.returncode == 0, "".join(notes) + out
    epochs = [ln for ln in out.splitlines() if re.search(r"\] epoch \d/3 loss", ln)]
    assert [re.search(r"epoch (\d)/3", ln).group(1) for ln in epochs] == ["1", "2", "3"], out  # type: ignore[union-attr]
    assert status_rows(slurm_client)[rid][2:4] == ["done", "epoch 3/3"]


def test_stop_cancels_the_job_and_leaves_no_step_and_no_process(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, trainer_hooks: Path
) -> None:
    use_cluster(slurm_client, host_python, **hook_env(trainer_hooks, EPOCH_DELAY="1"))
    done = slurm_client.vmrun(
        "train", "-C", "bed", "--nodes", "2", "--epochs", "300", "--save-every", "100", "--detach"
    )
    assert done.returncode == 0, done.stderr
    rid, job = run_id_of(done.stderr), job_of(done.stderr)
    metrics = out_dir(slurm_cluster, slurm_client, rid) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().strip(), 120, "a first epoch")
    assert job_pids(slurm_cluster), "the run's processes are on the compute hosts"
    assert status_rows(slurm_client)[rid][2] == "running"
    stopped = slurm_client.vmrun("stop", rid, "-C", "bed")
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {job} cancelled; no step left" in stopped.stdout
    assert slurm_cluster.run_on_login(["squeue", "-h", "-j", job]).stdout.strip() == ""
    assert slurm_cluster.run_on_login(["squeue", "-h", "-s", "-j", job]).stdout.strip() == ""
    wait_for(lambda: not job_pids(slurm_cluster), 30, "no job process on the compute hosts")
    assert status_rows(slurm_client)[rid][2] == "stopped"


def test_bad_input_gets_one_line_and_exit_2_with_nothing_submitted(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    use_cluster(slurm_client, host_python)
    for args, code, words in (
        (["-C", "nosuch"], "cluster-not-found", "-C nosuch"),
        (["-C", "bed", "--time", "1h"], "usage", "--time '1h'"),
        (["-C", "bed", "--nodes", "0"], "usage", "--nodes must be >= 1"),
        (["--nodes", "2"], "needs-cluster", "--nodes"),
        (["-C", "bed", "--partition", "nosuch"], "job-refused", "sbatch: error:"),
    ):
        done = slurm_client.vmrun("train", *args, "--epochs", "1", "--save-every", "1")
        said = errors_in(done.stderr)
        assert done.returncode == 2 and said[0][0] == code and words in said[0][1], (args, said)
        assert not slurm_cluster.squeue_ids()
    # more nodes than the partition has: cancelled and said so, never followed forever
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--partition",
        "one",
        "--nodes",
        "2",
        "--epochs",
        "1",
        "--save-every",
        "1",
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "job-never-starts" and "it was cancelled" in said, done.stderr
    wait_for(lambda: not slurm_cluster.squeue_ids(), 30, "the job gone from the queue")


def test_dry_run_prints_the_batch_script_and_submits_nothing(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    use_cluster(slurm_client, host_python, WANDB_API_KEY="s3cret-value")
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--nodes",
        "2",
        "--time",
        "00:10:00",
        "--dry-run",
        "--epochs",
        "2",
        "--save-every",
        "1",
    )
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=2" in done.stdout and "#SBATCH --time=00:10:00" in done.stdout
    assert "sbatch --parsable" in done.stdout and "WANDB_API_KEY" in done.stdout
    assert "s3cret-value" not in done.stdout + done.stderr
    assert not slurm_cluster.squeue_ids()
    assert not (slurm_cluster.login.home / ".vmrun" / "runs").exists()


def epochs_in(metrics: Path) -> list[int]:
    return [json.loads(x)["epoch"] for x in metrics.read_text().splitlines() if x.strip()]


def follow_to_the_end(client: Client, rid: str) -> tuple[int, str, str]:
    done = client.vmrun("logs", "-f", rid, "-C", "bed", timeout=600)
    return done.returncode, done.stdout, done.stderr


def test_usr2_snapshots_requeues_and_resumes_at_the_next_epoch(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, trainer_hooks: Path
) -> None:
    """The national-lab workflow: the warning signal (scancel --signal=USR2, as Slurm sends
    it before the time limit) makes the template snapshot and exit; the batch script requeues
    the job, which resumes at the next epoch: one run, two attempts, epochs 1..N once each."""
    use_cluster(slurm_client, host_python, **hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "16",
        "--save-every",
        "100",
        "--detach",
    )
    assert done.returncode == 0, done.stderr
    rid, job = run_id_of(done.stderr), job_of(done.stderr)
    metrics = out_dir(slurm_cluster, slurm_client, rid) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(epochs_in(metrics)) >= 2, 120, "two epochs")
    signalled = slurm_cluster.run_on_login(["scancel", "--signal=USR2", job])
    assert signalled.returncode == 0, signalled.stderr
    code, out, err = follow_to_the_end(slurm_client, rid)
    assert code == 0, err + out
    assert "--- attempt 2 (requeued) ---" in err, err
    assert epochs_in(metrics) == list(range(1, 17))
    resumed = [ln for ln in out.splitlines() if "resumed from snapshot at epoch" in ln]
    assert resumed, out
    assert status_rows(slurm_client)[rid][2] == "done, attempt 2"


def test_a_job_at_its_time_limit_snapshots_is_requeued_and_finishes(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, gate: Gate
) -> None:
    """A real --time limit: Slurm's warning signal comes 50 s before the minute is up (its
    time checks run every 30 s); the attempt saves and is requeued, the next one finishes;
    the epochs run 1..N with none missing or repeated. The first attempt holds after epoch
    6 (a trainer hook: the warning ends the hold) so the warning finds it however slow the
    machine; the gate opens once it has saved."""
    use_cluster(slurm_client, host_python, **gate.env(6))
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--epochs",
        "12",
        "--save-every",
        "100",
        "--nproc-per-node",
        "1",
        "--time",
        "1",
        "--max-requeues",
        "10",
        "--sbatch-arg=--signal=B:USR2@50",
        "--detach",
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    metrics = out_dir(slurm_cluster, slurm_client, rid) / "metrics.jsonl"
    wait_for(lambda: (metrics.parent / "snapshot.pt").exists(), 240, "the warned attempt's save")
    gate.open()
    code, out, err = follow_to_the_end(slurm_client, rid)
    assert code == 0, err + out
    assert "(requeued)" in err, err
    assert epochs_in(metrics) == list(range(1, 13))


def test_a_run_at_its_max_cost_saves_and_stops_and_is_never_requeued(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, trainer_hooks: Path
) -> None:
    """The cluster's `price` (3600 a node an hour: a unit a second) and its own `max_cost`
    (6: six seconds from the job's start): the job's agent sends the batch shell the warning
    as at a time limit, the template saves its epoch, and the job ends stopped, not requeued
    (--max-requeues 3 notwithstanding); the follower says run-over-budget. Without a
    price, --max-cost is refused before anything is submitted."""
    use_cluster(slurm_client, host_python, **hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    toml = slurm_client.cwd / "vmrun.toml"
    toml.write_text(toml.read_text() + "price = 3600\nmax_cost = 6\n")
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--epochs",
        "100",
        "--save-every",
        "100",
        "--nproc-per-node",
        "1",
        "--max-requeues",
        "3",
        timeout=300,
    )
    code, said = error_in(done.stderr)
    assert done.returncode == 143 and code == "run-over-budget", done.stderr
    assert "--max-cost $6.00" in said and "(requeued)" not in done.stderr, done.stderr
    rid = run_id_of(done.stderr)
    metrics = out_dir(slurm_cluster, slurm_client, rid) / "metrics.jsonl"
    assert (metrics.parent / "snapshot.pt").exists() and 0 < len(epochs_in(metrics)) < 100
    log = (record_dir(slurm_cluster, rid) / "job.log").read_text()
    assert "the run has cost --max-cost $6.00 (SIGUSR2): it saves and stops" in log, log
    assert "the run has cost --max-cost $6.00: stopped, its work saved" in log, log
    row = status_rows(slurm_client)[rid]
    assert row[2].startswith("stopped"), row
    (listed,) = [
        r
        for r in json.loads(slurm_client.vmrun("status", "-C", "bed", "--json").stdout)
        if r["run"] == rid
    ]
    assert listed["error"]["code"] == "run-over-budget" and listed["cost"]["currency"] == "USD"
    toml.write_text(toml.read_text().replace("price = 3600\nmax_cost = 6\n", ""))
    refused = slurm_client.vmrun(
        "train", "-C", "bed", "--epochs", "1", "--save-every", "1", "--max-cost", "5"
    )
    code, said = error_in(refused.stderr)
    assert refused.returncode == 2 and code == "over-budget" and "no `price`" in said, said
    assert not slurm_cluster.squeue_ids()


def test_max_requeues_bounds_the_requeues(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, trainer_hooks: Path
) -> None:
    """--max-requeues 0: the run saves on the warning but is not requeued; it ends failed,
    saying why, with its snapshot kept for `--resume`-style reruns."""
    use_cluster(slurm_client, host_python, **hook_env(trainer_hooks, EPOCH_DELAY="0.5"))
    args = ["--epochs", "40", "--save-every", "100", "--nproc-per-node", "1"]
    done = slurm_client.vmrun("train", "-C", "bed", *args, "--max-requeues", "0", "--detach")
    assert done.returncode == 0, done.stderr
    rid, job = run_id_of(done.stderr), job_of(done.stderr)
    metrics = out_dir(slurm_cluster, slurm_client, rid) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(epochs_in(metrics)) >= 1, 120, "an epoch")
    assert slurm_cluster.run_on_login(["scancel", "--signal=USR2", job]).returncode == 0
    code, out, err = follow_to_the_end(slurm_client, rid)
    assert code != 0 and "--max-requeues 0 is spent" in err, err + out
    assert (metrics.parent / "snapshot.pt").exists()
    assert status_rows(slurm_client)[rid][2] == "failed"


def test_the_clusters_modules_are_loaded_before_the_run(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """`modules = [...]` runs `module load` in the job (Environment Modules, as Debian ships
    it): the module puts the interpreter with torch on PATH, so `python = "python"` (which
    the nodes do not have otherwise) finds it; MODULEPATH comes from the cluster's env."""
    if not Path("/usr/share/modules/init/bash").exists():
        pytest.skip("Environment Modules is not installed (apt-get install environment-modules)")
    modules = slurm_cluster.shared / "modulefiles"
    (modules / "torchenv").mkdir(parents=True, exist_ok=True)
    (modules / "torchenv" / "1.0").write_text(
        f"#%Module1.0\nprepend-path PATH {host_python.parent}\n"
    )
    (slurm_client.cwd / "vmrun.toml").write_text(
        '[[clusters]]\nname = "bed"\nlogin = "login"\npython = "python"\n'
        'modules = ["torchenv/1.0"]\n'
        f'env = {{ MODULEPATH = "{modules}", OMP_NUM_THREADS = "1" }}\n'
    )
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--nproc-per-node",
        "1",
        "--epochs",
        "1",
        "--save-every",
        "1",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "epoch 1/1" in done.stdout
    text = (slurm_client.cwd / "vmrun.toml").read_text().replace("torchenv/1.0", "nosuch/9")
    (slurm_client.cwd / "vmrun.toml").write_text(text)
    failed = slurm_client.vmrun(
        "train", "-C", "bed", "--epochs", "1", "--save-every", "1", timeout=300
    )
    assert failed.returncode != 0 and "module load nosuch/9 failed" in failed.stderr


def test_live_stacks_of_a_job_then_its_hang_found_on_every_node_and_stopped(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """2 nodes x 2 ranks. `vmrun stacks -C` on the live job: one task per node beside its
    step (srun --overlap), py-spy from the shared home (vmrun sends it to the login node),
    every rank in the user's file, named by its node. Then rank 3 waits before its 30th
    all_reduce: the job's hang watcher (in its batch script) sees no rank's line and no
    heartbeat for --hang-timeout, takes every node's ranks' stacks, and --on-hang stop ends
    the job with 124; `vmrun stacks -C --hang` reads them from the record."""
    use_cluster(slurm_client, host_python)
    shutil.copy(Path(__file__).parent / "hang_scripts" / "hang_rank.py", slurm_client.cwd)
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "hang_rank.py",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--env",
        "HANG_RANK=3",
        "--env",
        "HANG_AT=30",
        "--hang-timeout",
        "6s",
        "--on-hang",
        "stop",
        "--detach",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    log = record_dir(slurm_cluster, rid) / "job.log"
    try:
        wait_for(lambda: log.exists() and "step 2 " in log.read_text(), 120, "the job's steps")
        live = slurm_client.vmrun("stacks", "-C", "bed", rid, timeout=120)
        assert live.returncode == 0, live.stderr + live.stdout
        c1, c2 = slurm_cluster.node_names
        places = [line for line in live.stdout.splitlines() if "hang_rank.py:" in line]
        ranks = {
            int(n)
            for line in places
            for part in line.split(" (")[0].split()[1].split(",")
            for n in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)
        }
        assert ranks == {0, 1, 2, 3}, live.stdout
        assert c1 in live.stdout and c2 in live.stdout, live.stdout
        ended = slurm_client.vmrun("logs", "-f", rid, "-C", "bed", timeout=180)
        assert ended.returncode == 124, ended.stderr + ended.stdout
    finally:
        slurm_client.vmrun("stop", rid, "-C", "bed", timeout=120)
    assert re.search(r"hung on job \d+: ranks 0-3; stacks in", log.read_text()), log.read_text()
    seen = json.loads((record_dir(slurm_cluster, rid) / "hang").read_text())
    assert 6 <= seen["seen"] - seen["since"] <= 12, seen
    listed = slurm_client.vmrun("status", "-C", "bed", "--json", timeout=60)
    (run,) = [r for r in json.loads(listed.stdout) if r["run"] == rid]
    assert run["hung"] == seen, run  # the listing reads REC/hang, as a host's does
    shown = slurm_client.vmrun("stacks", "-C", "bed", rid, "--hang", timeout=60)
    assert shown.returncode == 0, shown.stderr + shown.stdout
    assert re.search(r"^ranks 0-2 \(.+\): all_reduce at hang_rank\.py:\d+$", shown.stdout, re.M), (
        shown.stdout
    )
    assert re.search(
        r"^rank 3 \(.+\): in wait_forever at hang_rank\.py:\d+$", shown.stdout, re.M
    ), shown.stdout
