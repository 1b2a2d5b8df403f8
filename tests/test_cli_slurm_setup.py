"""`vmrun setup -C` on a real Slurm (tests/testbed/slurm.py): the env built on the login node
under the cluster's workdir (the login home, shared with the compute hosts here), checked on a
compute node with srun, and then used by `vmrun train -C`. Offline: torch comes from the
local wheelhouse; no GPUs here, so the check says CUDA False and 0 GPUs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from conftest import TORCH_SPEC, Client, error_in, errors_in

NO_PYTHON_TOML = '[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'


def _setup(client: Client, wheelhouse: Path, *extra: str) -> Any:
    return client.vmrun(
        "setup", "-C", "bed", "--wheelhouse", str(wheelhouse), "--torch", TORCH_SPEC, *extra
    )


def test_setup_builds_the_env_on_the_shared_filesystem_and_train_uses_it(
    slurm_cluster: Any, slurm_client: Client, wheelhouse: Path
) -> None:
    (slurm_client.cwd / "vmrun.toml").write_text(NO_PYTHON_TOML)
    home = slurm_cluster.login.home
    done = _setup(slurm_client, wheelhouse)
    assert done.returncode == 0, done.stdout + done.stderr
    python = home / ".vmrun" / "envs" / "vmrun" / "bin" / "python"
    assert python.exists()
    assert "nvidia-driver" not in done.stdout.split("ran ", 1)[1].split(")")[0]
    assert f"python={python}" in done.stdout and "torch=2.13.0" in done.stdout
    check = re.search(
        r"on compute node (\S+): torch=(\S+) cuda_available=(\S+) gpus=(\S+)", done.stdout
    )
    assert check, done.stdout
    assert check.group(1) in slurm_cluster.node_names
    assert check.group(2).startswith("2.13.0") and check.groups()[2:] == ("False", "0")
    record = json.loads((home / ".vmrun" / "host.json").read_text())
    assert record["python"] == str(python)
    assert slurm_cluster.squeue_ids() == []

    again = _setup(slurm_client, wheelhouse)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "ran 0 (nothing)" in again.stdout and "nothing changed" in again.stdout
    assert "on compute node" in again.stdout

    trained = slurm_client.vmrun(
        "train", "-C", "bed", "--epochs", "1", "--save-every", "1", timeout=300
    )
    assert trained.returncode == 0, trained.stdout + trained.stderr
    runs = list((home / ".vmrun" / "runs").iterdir())
    assert len(runs) == 1
    script = (runs[0] / "job.sh").read_text()
    assert f"VMRUN_PYTHON={python}" in script or str(python) in script


def test_dry_run_skips_the_root_steps_and_changes_nothing(
    slurm_cluster: Any, slurm_client: Client, wheelhouse: Path
) -> None:
    done = _setup(slurm_client, wheelhouse, "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"skip nvidia-driver: needs root", done.stdout), done.stdout
    assert re.search(r"skip python-venv-package: needs root", done.stdout), done.stdout
    assert "would run python-env" in done.stdout
    assert not (slurm_cluster.login.home / ".vmrun" / "envs").exists()


def test_an_unknown_partition_is_one_line(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    (slurm_client.cwd / "vmrun.toml").write_text(NO_PYTHON_TOML.replace('"debug"', '"nosuchpart"'))
    done = slurm_client.vmrun(
        "setup", "-C", "bed", "--python", str(host_python), "--torch", TORCH_SPEC
    )
    assert done.returncode == 14, done.stdout + done.stderr  # a remote error
    [(code, said)] = errors_in(done.stderr)
    assert code == "remote-failed" and "check on a compute node failed" in said, done.stderr
    assert "partition" in said.lower(), said


def test_unknown_cluster_is_bad_input(slurm_client: Client) -> None:
    done = slurm_client.vmrun("setup", "-C", "nosuch")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert error_in(done.stderr)[0] == "cluster-not-found", done.stderr
    both = slurm_client.vmrun("setup", "-C", "bed", "login")
    assert both.returncode == 2 and "use one" in both.stderr
