"""Fixtures for tests with a real Docker Engine on the test hosts (tests/testbed/docker.py);
loaded by tests/conftest.py through `pytest_plugins`.

`docker_hosts` (session): a bed of its own with hosts `d1`, `d2` (one dockerd each, their
users in the `docker` group with a CLI context naming their host's socket) and `reg`, which
serves the test image (`docker_hosts.image`, Debian + python3 + torch 2.13.0 CPU) over http
from Debian's docker-registry; nothing is pulled yet. The image's rootfs comes from the
test cache (.ci/run builds it once); the tests reach no network.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import CACHE, slow_fixture
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns
from testbed.docker import DockerBed, image_tarball, skip_reason_no_docker
from testbed.procs import pid_alive


@pytest.fixture(scope="session")
@slow_fixture
def docker_hosts(
    tmp_path_factory: pytest.TempPathFactory, client_keys: ClientKeys
) -> Iterator[DockerBed]:
    reason = skip_reason_no_netns() or skip_reason_no_docker(CACHE)
    if reason:
        pytest.skip(f"Docker test hosts unavailable: {reason}")
    tar = image_tarball(CACHE)
    assert tar is not None
    with (
        NetnsBed(tmp_path_factory.mktemp("docker-bed"), client_keys) as bed,
        DockerBed(bed, tar) as docker_bed,
    ):
        yield docker_bed
        pids = docker_bed.pids()
    if alive := [p for p in pids if pid_alive(p)]:  # the daemons and the registry, by pid
        raise AssertionError(f"Docker bed processes survived its close(): {alive}")
