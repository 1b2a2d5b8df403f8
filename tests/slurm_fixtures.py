"""Fixtures for tests against a real Slurm cluster (tests/testbed/slurm.py); loaded by
tests/conftest.py through `pytest_plugins`.

`slurm_cluster` (session): a bed of its own (the `bed` fixture's hosts stay untouched) with
a login host `login` (munged, slurmctld) and compute hosts `c1`, `c2` (slurmd each).
`slurm_client`: a Client that reaches them over SSH (aliases `login`, `c1`, `c2`) and whose
project names the cluster `bed` in vmrun.toml; after each test, every job is cancelled,
the nodes are idle again, and the test's files on the shared filesystem are gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, slow_fixture, wait_for
from testbed import ClientKeys, NetnsBed, SlurmCluster, skip_reason_no_slurm


@pytest.fixture(scope="session")
@slow_fixture
def slurm_cluster(
    tmp_path_factory: pytest.TempPathFactory, client_keys: ClientKeys
) -> Iterator[SlurmCluster]:
    reason = skip_reason_no_slurm()
    if reason:
        pytest.skip(f"Slurm test cluster unavailable: {reason}")
    with (
        NetnsBed(tmp_path_factory.mktemp("slurm-bed"), client_keys) as bed,
        SlurmCluster(bed) as cluster,
    ):
        yield cluster


def cluster_toml(python: Path) -> str:
    return (
        f'[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\npython = "{python}"\n'
    )


@pytest.fixture
def slurm_client(
    slurm_cluster: SlurmCluster, client: Client, host_python: Path
) -> Iterator[Client]:
    """A client whose ssh config and known_hosts know the cluster's hosts and whose
    vmrun.toml declares it as `bed` (partition debug, the hosts' interpreter with torch)."""
    (client.ssh_dir / "config").write_text(slurm_cluster.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(slurm_cluster.known_hosts_text())
    (client.cwd / "vmrun.toml").write_text(cluster_toml(host_python))
    yield client
    clean_cluster(slurm_cluster)


def clean_cluster(cluster: SlurmCluster) -> None:
    """A test's leftovers: its jobs, their processes (by pid), its files on the shared
    filesystem (the shared dir's contents, the login user's ~/.vmrun and ~/vmrun)."""
    try:
        cluster.cancel_all_and_wait()
    finally:
        for pid in cluster.job_pids():  # a task that left its job (setsid, nohup)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not cluster.job_pids(), 10, "no job process on the compute hosts")
        for entry in cluster.shared.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        for name in (".vmrun", "vmrun"):
            shutil.rmtree(cluster.login.home / name, ignore_errors=True)
