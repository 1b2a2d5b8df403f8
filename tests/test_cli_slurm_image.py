"""`vmrun train -C bed --image` on the real Slurm test cluster whose compute hosts each run
a real dockerd (the `slurm_docker` fixture): every node pulls the test image (Debian +
torch 2.13.0 CPU) from the bed's registry, then each Slurm task of the step runs in its
own container (docker, detected on the login node), with the host's network, the work
directory at the same path and the job user's uid.

The bed's daemons cannot raise `memlock` above this machine's hard limit, so the cluster's
table sets `container_ulimits` to that limit (NGC's `memlock=-1` is tested as a value).
pyxis, Apptainer and shifter cannot be installed here: test_slurm_image.py has their
batch scripts as values."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, wait_for
from slurm_fixtures import SLURM_DOCKER_HOST
from test_cli_slurm import (
    SCRIPTS,
    epochs_in,
    follow_to_the_end,
    job_of,
    out_dir,
    record_dir,
    run_id_of,
    status_rows,
)
from testbed.docker import DockerBed, memlock_hard_limit
from train_helpers import Gate, assert_matches_one_process, hook_env


def _toml(python: Path, env: dict[str, str], mounts: list[str] = ()) -> str:  # type: ignore[assignment]
    hard = memlock_hard_limit()
    memlock = "memlock=-1" if hard is None else f"memlock={hard}"
    variables = {"OMP_NUM_THREADS": "1", "DOCKER_HOST": SLURM_DOCKER_HOST, **env}
    listed = ", ".join(f'{k} = "{v}"' for k, v in variables.items())
    return (
        f'[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'python = "{python}"\nenv = {{ {listed} }}\n'
        f'container_ulimits = ["{memlock}", "stack=67108864"]\n'
        # the compute hosts run dockerd; podman, where this machine has it, is not set up
        # there, and the login node's detection would pick it first
        'container_runtime = "docker"\n'
        f"mounts = {json.dumps(list(mounts))}\n"
    )


@pytest.fixture
def dslurm(
    slurm_docker: DockerBed, slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> Iterator[Client]:
    """The cluster `bed` with the daemons' socket in its jobs' DOCKER_HOST; afterwards no
    container is left on any compute host (checked before slurm_client cleans up)."""
    (slurm_client.cwd / "vmrun.toml").write_text(_toml(host_python, {}))
    for script in SCRIPTS.iterdir():
        (slurm_client.cwd / script.name).write_bytes(script.read_bytes())
    yield slurm_client
    left = {name: daemon.containers() for name, daemon in slurm_docker.daemons.items()}
    for name, ids in left.items():
        if ids:
            slurm_docker.daemons[name].docker("rm", "-f", *ids, check=False)
    assert not any(left.values()), f"containers left behind: {left}"


def _no_container(bed: DockerBed) -> dict[str, list[str]]:
    return {name: daemon.containers() for name, daemon in bed.daemons.items()}


@pytest.mark.timeout(900)
def test_template_over_two_nodes_in_the_image_equals_one_process(
    slurm_docker: DockerBed, slurm_cluster: Any, dslurm: Client, tmp_path: Path
) -> None:
    """torchrun on 2 nodes, each node's task in a container on its own daemon: real DDP
    across the containers (c10d over the nodes' network), the final weights equal a
    one-process run's; the outputs belong to the job's user; no container is left."""
    image = slurm_docker.image
    args = ["4", "2", "--batch-size", "16", "--dataset-size", "512", "--deterministic"]
    done = dslurm.vmrun(
        "train",
        "-C",
        "bed",
        "--image",
        image,
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--cpus-per-task",
        "2",
        "--",
        *args,
        timeout=600,
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
    out = out_dir(slurm_cluster, dslurm, rid)
    final = out / "finalmodel.pt"
    one = ["4", "2", "--batch-size", "32", "--dataset-size", "512", "--deterministic"]
    assert_matches_one_process(final, one, tmp_path / "single")
    owners = {p.name: p.stat().st_uid for p in out.iterdir()}
    assert set(owners.values()) == {slurm_cluster.login.uid}, owners
    for host in slurm_cluster.computes:  # pulled on each node, before the step
        assert image in slurm_docker.daemons[host.name].images()
    assert _no_container(slurm_docker) == {c.name: [] for c in slurm_cluster.computes}
    meta = json.loads((record_dir(slurm_cluster, rid) / "run.json").read_text())
    assert (meta["image"], meta["container_runtime"]) == (image, "docker")
    assert status_rows(dslurm)[rid][2:4] == ["done", "epoch 4/4"]


@pytest.mark.timeout(900)
def test_env_launcher_tasks_each_run_in_their_own_container(
    slurm_docker: DockerBed, slurm_cluster: Any, dslurm: Client
) -> None:
    """2 nodes x 2 tasks: four containers, two per daemon, each with its task's Slurm
    variables (rank from SLURM_PROCID inside), the script unchanged."""
    done = dslurm.vmrun(
        "train",
        "-C",
        "bed",
        "--image",
        slurm_docker.image,
        "one_task_per_gpu.py",
        "--launcher",
        "env",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    c1, c2 = slurm_cluster.node_names
    lines = sorted(ln for ln in done.stdout.splitlines() if " sum " in ln)
    assert lines == [
        f"[{c1} rank0] rank 0 local 0 of 4 on {c1} sum 6",
        f"[{c1} rank1] rank 1 local 1 of 4 on {c1} sum 6",
        f"[{c2} rank2] rank 2 local 0 of 4 on {c2} sum 6",
        f"[{c2} rank3] rank 3 local 1 of 4 on {c2} sum 6",
    ], done.stdout


@pytest.mark.timeout(900)
def test_stop_leaves_no_container(
    slurm_docker: DockerBed,
    slurm_cluster: Any,
    dslurm: Client,
    host_python: Path,
    trainer_hooks: Path,
) -> None:
    hooks = hook_env(trainer_hooks, EPOCH_DELAY="1")
    (dslurm.cwd / "vmrun.toml").write_text(
        _toml(host_python, hooks, [f"{trainer_hooks}:{trainer_hooks}:ro"])
    )
    done = dslurm.vmrun(
        "train",
        "-C",
        "bed",
        "--image",
        slurm_docker.image,
        "--nodes",
        "2",
        "--epochs",
        "300",
        "--save-every",
        "100",
        "--detach",
    )
    assert done.returncode == 0, done.stderr
    rid, job = run_id_of(done.stderr), job_of(done.stderr)
    metrics = out_dir(slurm_cluster, dslurm, rid) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().strip(), 300, "a first epoch")
    running = _no_container(slurm_docker)
    assert all(len(ids) == 1 for ids in running.values()), running
    stopped = dslurm.vmrun("stop", rid, "-C", "bed")
    assert stopped.returncode == 0, stopped.stderr
    assert f"job {job} cancelled; no step left" in stopped.stdout
    # each container stopped and removed by its engine (--rm): Slurm's SIGKILL may end the
    # task's shell first on a loaded machine, which left the exited containers behind
    none = {c.name: [] for c in slurm_cluster.computes}
    wait_for(lambda: _no_container(slurm_docker) == none, 30, "the containers to be removed")
    assert status_rows(dslurm)[rid][2] == "stopped"


@pytest.mark.timeout(900)
def test_usr2_in_the_image_snapshots_requeues_and_resumes(
    slurm_docker: DockerBed,
    slurm_cluster: Any,
    dslurm: Client,
    host_python: Path,
    trainer_hooks: Path,
) -> None:
    """The time-limit warning (scancel --signal=USR2, as Slurm sends it) reaches the
    processes in the containers; the template snapshots into the run's folder, the batch
    script requeues the job, and the next attempt's containers resume at the next epoch."""
    hooks = hook_env(trainer_hooks, EPOCH_DELAY="0.5")
    (dslurm.cwd / "vmrun.toml").write_text(
        _toml(host_python, hooks, [f"{trainer_hooks}:{trainer_hooks}:ro"])
    )
    done = dslurm.vmrun(
        "train",
        "-C",
        "bed",
        "--image",
        slurm_docker.image,
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
    metrics = out_dir(slurm_cluster, dslurm, rid) / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(epochs_in(metrics)) >= 2, 300, "two epochs")
    signalled = slurm_cluster.run_on_login(["scancel", "--signal=USR2", job])
    assert signalled.returncode == 0, signalled.stderr
    code, out, err = follow_to_the_end(dslurm, rid)
    assert code == 0, err + out
    assert "--- attempt 2 (requeued) ---" in err, err
    assert epochs_in(metrics) == list(range(1, 17))
    assert [ln for ln in out.splitlines() if "resumed from snapshot at epoch" in ln], out
    assert _no_container(slurm_docker) == {c.name: [] for c in slurm_cluster.computes}


@pytest.mark.timeout(900)
def test_a_job_in_the_image_at_its_time_limit_is_requeued_and_finishes(
    slurm_docker: DockerBed,
    slurm_cluster: Any,
    dslurm: Client,
    host_python: Path,
    gate: Gate,
) -> None:
    """A real --time limit: Slurm's warning reaches the batch shell, which marks it and
    passes it on to the step; the template in the container saves, the job is requeued,
    and the epochs run 1..N once each. The first attempt holds after epoch 6 (a trainer
    hook that the warning ends) so the warning finds it however slow the machine."""
    hooks = gate.env(6)
    (dslurm.cwd / "vmrun.toml").write_text(
        _toml(host_python, hooks, [f"{gate.hooks}:{gate.hooks}:ro"])
    )
    done = dslurm.vmrun(
        "train",
        "-C",
        "bed",
        "--image",
        slurm_docker.image,
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
    metrics = out_dir(slurm_cluster, dslurm, rid) / "metrics.jsonl"
    wait_for(lambda: (metrics.parent / "snapshot.pt").exists(), 240, "the warned attempt's save")
    gate.open()
    code, out, err = follow_to_the_end(dslurm, rid)
    assert code == 0, err + out
    assert "(requeued)" in err, err
    assert epochs_in(metrics) == list(range(1, 13))
    assert _no_container(slurm_docker) == {c.name: [] for c in slurm_cluster.computes}
