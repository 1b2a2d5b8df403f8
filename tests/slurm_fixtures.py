"""Fixtures for tests against a real Slurm cluster (tests/testbed/slurm.py); loaded by
tests/conftest.py through `pytest_plugins`.

`slurm_cluster` (session): a bed of its own (the `bed` fixture's hosts stay untouched) with
a login host `login` (munged, slurmctld) and compute hosts `c1`, `c2` (slurmd each).
`slurm_client`: a Client that reaches them over SSH (aliases `login`, `c1`, `c2`) and whose
project names the cluster `bed` in vmrun.toml; after each test, every job is cancelled,
the nodes are idle again, and the test's files on the shared filesystem are gone.
`slurm_docker` (session): a real dockerd on each compute host of that cluster and a
registry host `reg` serving the test image (testbed.docker.DockerBed on the cluster's
hosts); jobs reach their node's daemon at `DOCKER_HOST` = `SLURM_DOCKER_HOST`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CACHE, Client, slow_fixture, wait_for
from testbed import ClientKeys, NetnsBed, SlurmCluster, skip_reason_no_slurm
from testbed.docker import DockerBed, image_tarball, skip_reason_no_docker

# Where a job step finds its node's dockerd: each compute host's /etc/slurm is a directory
# of its own (the bed's per-namespace /etc), so one path names a different socket on each
# node, as /var/run/docker.sock does on a real cluster.
SLURM_DOCKER_HOST = "unix:///etc/slurm/docker.sock"


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


@pytest.fixture(scope="session")
@slow_fixture
def slurm_docker(slurm_cluster: SlurmCluster) -> Iterator[DockerBed]:
    """A dockerd on each compute host of `slurm_cluster`, its socket's group the login
    user's (the jobs' user), and the test image in a registry on host `reg`."""
    reason = skip_reason_no_docker(CACHE)
    if reason:
        pytest.skip(f"Docker on the Slurm test hosts unavailable: {reason}")
    tar = image_tarball(CACHE)
    assert tar is not None
    computes = slurm_cluster.computes
    with DockerBed(
        slurm_cluster.bed, tar, hosts=computes, group=str(slurm_cluster.login.gid)
    ) as docker_bed:
        links = [slurm_cluster.etc_slurm(host) / "docker.sock" for host in computes]
        try:
            for host, link in zip(computes, links, strict=True):
                link.symlink_to(docker_bed.daemons[host.name].socket)
            yield docker_bed
        finally:
            for link in links:
                link.unlink(missing_ok=True)


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
