"""`vmrun watch-gpus -C bed` on a real Slurm (tests/testbed/slurm.py): the GPUs of the nodes
the user's running jobs hold, each node read by a real `srun --overlap` step started from the
login node, every step on one channel of the one SSH connection to it.

No GPU here: `nvidia-smi` on the nodes is the STAND-IN (tests/standins/nvidia-smi), put in the
login user's ~/.vmrun/bin (the home is shared, and vmrun puts that directory first on PATH,
which srun carries to the step), behind a wrapper that replays another recording per node.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, place_hostlib, wait_for
from test_cli_watch_gpus import FIXTURES, STANDIN, JsonReader, alive, starts

# what each node's stand-in replays: different GPUs per node, so rows show which is which
REPLAYS = {"vmt-c1": "t4x2_training", "vmt-c2": "h100x2_constructed"}


@pytest.fixture
def standin(slurm_cluster: Any, slurm_client: Client) -> Iterator[dict[str, Path]]:
    """~/.vmrun/bin/nvidia-smi on every node: the stand-in replaying REPLAYS[hostname]."""
    login = slurm_cluster.login
    root = login.home / ".vmrun" / "bin"
    login.run(["mkdir", "-p", str(root)], as_user=True)
    shutil.copy(STANDIN, root / "nvidia-smi-standin")
    replays = {}
    for node, fixture in REPLAYS.items():
        replay = root / f"replay-{node}"
        shutil.copytree(FIXTURES / fixture, replay)
        (replay / "starts.log").touch()
        replays[node] = replay
    (root / "nvidia-smi").write_text(
        "#!/bin/sh\n# STAND-IN for nvidia-smi: no GPU hardware in the test bed; it replays the"
        " recording named for this node\n"
        'NVIDIA_SMI_STANDIN_REPLAY="$HOME/.vmrun/bin/replay-$(hostname)" exec python3'
        ' "$HOME/.vmrun/bin/nvidia-smi-standin" "$@"\n'
    )
    for path in [root, *root.rglob("*")]:
        os.chown(path, login.uid, login.gid)
        path.chmod(0o755 if path.is_dir() or path.parent == root else 0o644)
    yield replays  # slurm_client's cleanup removes ~/.vmrun and cancels every job


def submit(cluster: Any, *args: str) -> str:
    """A job of the login user, running before this returns."""
    done = cluster.run_on_login(["sbatch", "--parsable", *args, "--wrap", "sleep 300"])
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    wait_for(
        lambda: (
            cluster.run_on_login(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
            == "RUNNING"
        ),
        30,
        f"job {job} to run",
    )
    return job


def steps(cluster: Any, job: str) -> list[str]:
    """The job's steps squeue lists (its batch step; an overlap step while a watch runs)."""
    done = cluster.run_on_login(["squeue", "-h", "-s", "-j", job, "-o", "%i"])
    return done.stdout.split()


def assert_no_step_left(cluster: Any, job: str, replays: dict[str, Path]) -> None:
    pids = [pid for replay in replays.values() for pid, _ in starts(replay)]
    wait_for(
        lambda: steps(cluster, job) == [f"{job}.batch"] and not any(alive(p) for p in pids),
        30,
        f"the watch's steps of job {job} and their nvidia-smi to end",
    )


def test_once_shows_every_node_of_a_running_job_through_the_login_node(
    slurm_cluster: Any, slurm_client: Client, standin: dict[str, Path]
) -> None:
    job = submit(slurm_cluster, "-N2")
    place_hostlib(slurm_cluster.login)  # as any earlier command leaves the login node
    channels = slurm_cluster.login.sshd_log().count("Starting session")
    done = slurm_client.vmrun("watch-gpus", "-C", "bed", "--once", "--json")
    assert done.returncode == 0, done.stderr
    samples = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["host"] for s in samples] == [f"vmt-c1 (job {job})", f"vmt-c2 (job {job})"]
    assert all(s["state"] == "ok" for s in samples), samples
    assert [g["name"] for g in samples[0]["gpus"]] == ["Tesla T4", "Tesla T4"]
    assert [g["name"] for g in samples[1]["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert samples[0]["gpus"][0]["utilization_pct"] == 93.0
    # each node's stand-in ran on that node, inside a step of the job
    for node, replay in standin.items():
        assert len(starts(replay)) == 2, node
    # two nodes, one connection: listing the jobs and runs, then one channel per node
    assert slurm_cluster.login.sshd_log().count("Starting session") - channels == 4
    assert_no_step_left(slurm_cluster, job, standin)

    table = slurm_client.vmrun("watch-gpus", "-C", "bed", "--once", "--job", job)
    assert table.returncode == 0, table.stderr
    rows = [" ".join(line.split()) for line in table.stdout.splitlines()]
    assert rows[0].startswith("vmrun watch-gpus 2 host(s) 4 GPU(s) snapshot"), rows
    assert f"vmt-c1 (job {job}) 0 T4 93% 2.3/15.0G 38C 49/70W 2312 python 1.3G" in rows
    assert any(r.startswith(f"vmt-c2 (job {job}) 0 H100 80GB HBM3") for r in rows), rows
    assert_no_step_left(slurm_cluster, job, standin)


def test_live_json_then_ctrl_c_leaves_no_step(
    slurm_cluster: Any, slurm_client: Client, standin: dict[str, Path]
) -> None:
    one = submit(slurm_cluster, "-N1", "-w", "vmt-c2")
    proc = slurm_client.popen("watch-gpus", "-C", "bed", "--json", "--interval", "0.3")
    try:
        reader = JsonReader(proc)
        for _ in range(3):
            reader.until(lambda s: s["state"] == "ok", 30, "a sample of vmt-c2")
        assert {s["host"] for s in reader.seen} == {f"vmt-c2 (job {one})"}
        assert len(steps(slurm_cluster, one)) == 2  # the batch step and the watch's
        assert all(args.endswith("--loop-ms=300") for _, args in starts(standin["vmt-c2"]))
        code, err = reader.interrupt()
        assert code == 0 and err == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_no_step_left(slurm_cluster, one, standin)


def test_no_running_job_is_one_line_and_exit_0(
    slurm_cluster: Any, slurm_client: Client, standin: dict[str, Path]
) -> None:
    pending = slurm_cluster.run_on_login(["sbatch", "--hold", "--wrap", "sleep 300"])
    assert pending.returncode == 0, pending.stderr
    done = slurm_client.vmrun("watch-gpus", "-C", "bed", "--once")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr == "vmrun: no running job of yours on cluster bed: no GPU to watch\n"
    assert slurm_client.vmrun("watch-gpus", "-C", "bed", "--job", "999999").returncode == 0
    wrong = slurm_client.vmrun("watch-gpus", "--run", "r-1")
    assert wrong.returncode == 2 and "add -C NAME" in wrong.stderr
    both = slurm_client.vmrun("watch-gpus", "-C", "bed", "-H", "login")
    assert both.returncode == 2 and "use one" in both.stderr
