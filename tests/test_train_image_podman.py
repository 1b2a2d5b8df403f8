"""`vmrun train --image` with `container_runtime = "podman"`, for real: hosts p1 and p2 join
the Docker bed (tests/testbed/docker.py), and their users run rootless podman
(tests/testbed/podman.py: runc, the kernel's overlayfs, the bed's registry over http), which
pulls the test image (Debian + torch 2.13.0 CPU) from the bed's `reg` host and runs the
run's processes in it with host networking and the user's own ids (--userns=keep-id).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Client, run_id_of, run_pids, slow_fixture, template_out, wait_for
from testbed.docker import DockerBed
from testbed.podman import PodmanHost, skip_reason_no_podman
from testbed.testhost import TestHost
from train_helpers import assert_matches_one_process


@dataclass
class PodmanHosts:
    hosts: list[TestHost]
    podmen: dict[str, PodmanHost]
    image: str


@pytest.fixture(scope="session")
@slow_fixture
def podman_hosts(docker_hosts: DockerBed) -> Iterator[PodmanHosts]:
    if reason := skip_reason_no_podman():
        pytest.skip(f"podman test hosts unavailable: {reason}")
    assert docker_hosts.registry is not None
    address = docker_hosts.registry.address
    podmen: dict[str, PodmanHost] = {}
    try:
        hosts = [docker_hosts.bed.add_host(name) for name in ("p1", "p2")]
        for host in hosts:
            podmen[host.name] = PodmanHost(host, insecure_registries=[address])
        yield PodmanHosts(hosts, podmen, docker_hosts.image)
    finally:
        for podman in podmen.values():
            podman.close()
    for podman in podmen.values():
        assert not podman.host.user_pids(), f"processes left on {podman.host.name}"
        assert not any(d.exists() for d in podman.tmp_dirs())


@pytest.fixture
def pclient(podman_hosts: PodmanHosts, docker_hosts: DockerBed, client: Client) -> Iterator[Client]:
    """A project on p1 and p2 with `container_runtime = "podman"`; afterwards no run
    process, container or vmrun file is left on them."""
    bed = docker_hosts.bed
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    (client.cwd / "vmrun.toml").write_text(
        'container_runtime = "podman"\n'
        + "".join(f'\n[[hosts]]\naddress = "{h.name}"\n' for h in podman_hosts.hosts)
    )
    client.extra_env["OMP_NUM_THREADS"] = "1"
    yield client
    left: dict[str, list[str]] = {}
    for host in podman_hosts.hosts:
        podman = podman_hosts.podmen[host.name]
        left[host.name] = podman.containers()
        if left[host.name]:
            podman.podman("rm", "-af", "-t", "0", check=False)
        for pid in run_pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda h=host: not run_pids(h), 10, f"no run process left on {host.name}")
        for folder in (".vmrun", "vmrun"):
            host.run(["rm", "-rf", str(host.home / folder)], as_user=True)
    assert not any(left.values()), f"containers left behind: {left}"


def _record(host: TestHost, rid: str) -> dict:
    return json.loads((host.home / ".vmrun" / "runs" / rid / "run.json").read_text())


@pytest.mark.timeout(600)
def test_podman_runs_the_template_on_two_hosts_as_the_user(
    podman_hosts: PodmanHosts, pclient: Client, tmp_path: Path
) -> None:
    """2 hosts x 1 process in the image under rootless podman: the pull is real and shown,
    the weights equal a one-process run's (DDP across the containers), the files are the
    user's (keep-id), no container is left; a second pull finds the image there."""
    image = podman_hosts.image
    args = ["3", "1", "--batch-size", "8", "--dataset-size", "256", "--deterministic"]
    done = pclient.vmrun(
        "train", "--image", image, "--nproc-per-node", "1", "--", *args, timeout=500
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert "2 nodes x 1 process(es)" in done.stderr
    for host in podman_hosts.hosts:  # the bytes come from podman's own progress bars
        assert re.search(
            rf"{host.name}: pulled {re.escape(image)} \(\d+ layers, \d+ MiB", done.stderr
        ), done.stderr
        rec = _record(host, rid)
        assert rec["container_runtime"] == "podman"
        assert str(rec["image_digest"]).startswith("sha256:")
        assert podman_hosts.podmen[host.name].containers() == []
    p1 = podman_hosts.hosts[0]
    final = template_out(p1, pclient, rid) / "finalmodel.pt"
    assert (final.stat().st_uid, final.stat().st_gid) == (p1.uid, p1.gid)
    one = ["3", "1", "--batch-size", "16", "--dataset-size", "256", "--deterministic"]
    assert_matches_one_process(final, one, tmp_path / "single")

    (pclient.cwd / "hello.py").write_text("print('hello from the image')\n")  # no torch: quick
    again = pclient.vmrun(
        "train", "hello.py", "--launcher", "python", "--image", image, "-H", p1.name, timeout=300
    )
    assert again.returncode == 0, again.stderr + again.stdout
    assert f"{p1.name}: image {image} is there already" in again.stderr
    assert "hello from the image" in again.stdout


@pytest.mark.timeout(300)
def test_stop_leaves_no_podman_container(podman_hosts: PodmanHosts, pclient: Client) -> None:
    p1 = podman_hosts.hosts[0]
    podman = podman_hosts.podmen[p1.name]
    done = pclient.vmrun(
        "train",
        "-H",
        p1.name,
        "--image",
        podman_hosts.image,
        "--epochs",
        "100000",
        "--save-every",
        "1000",
        "--detach",
        timeout=240,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    wait_for(lambda: len(podman.containers()) == 1, 60, "the run's container")
    logs = lambda: pclient.vmrun("logs", rid, timeout=60).stdout  # noqa: E731
    wait_for(lambda: "epoch" in logs(), 120, "the first epoch in the log", interval=1)
    t = time.monotonic()
    stopped = pclient.vmrun("stop", rid, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - t < 30
    assert podman.containers() == []  # `podman ps -a` is empty
    wait_for(lambda: not run_pids(p1, rid), 10, "the run's processes to end")
    status = pclient.vmrun("status", "--json", timeout=60)
    runs = {r["run"]: r for r in json.loads(status.stdout) if r.get("run")}
    assert runs[rid]["state"] == "stopped"
