"""Self-test of Docker on the test hosts (tests/testbed/docker.py): a real Docker Engine.

The hosts' users reach their host's dockerd over real SSH, pull the test image from the
bed's own registry, and run it with host networking as themselves.  Needs root, `ip netns`,
docker.io + docker-registry and the cached image rootfs (.ci/run); skips otherwise.
Timings are printed (`-s`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from testbed.docker import (  # noqa: E402
    DockerBed,
    DockerDaemon,
    ImageRegistry,
    memlock_hard_limit,
)
from testbed.procs import pid_alive, wait_until  # noqa: E402


def ssh(bed: DockerBed, tmp: Path, host: str, command: str, timeout: float = 180):
    """The system ssh client to `host` as its user (strict host keys, no agent)."""
    config, known = tmp / "ssh_config", tmp / "known_hosts"
    known.write_text(bed.bed.known_hosts_text())
    config.write_text(bed.bed.ssh_config_text(known_hosts=known))
    return subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host, command],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp)},
    )


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_the_image_was_pushed_once_and_each_daemon_answers(docker_hosts: DockerBed) -> None:
    print(f"\ntimings: {docker_hosts.timings}, image {docker_hosts.image_bytes / 2**20:.0f} MiB")
    print({name: round(d.started_in, 2) for name, d in docker_hosts.daemons.items()})
    reg = docker_hosts.registry
    assert reg is not None
    status, body = reg.get("/v2/vmrun-test/torch/tags/list")
    assert status == 200 and b'"2.13.0"' in body
    for daemon in docker_hosts.daemons.values():
        assert isinstance(daemon.images(), list)  # it answers (other tests may have pulled)
        assert daemon.containers() == []


def test_the_user_pulls_and_runs_the_image_over_ssh(
    docker_hosts: DockerBed, tmp_path: Path
) -> None:
    host = docker_hosts.hosts[0]
    daemon = docker_hosts.daemons[host.name]
    image = docker_hosts.image
    daemon.docker("rmi", image, check=False)  # an earlier test's pull: this one is real
    assert image not in daemon.images()
    t = time.monotonic()
    pull = ssh(docker_hosts, tmp_path, host.name, f"docker pull {image}")
    pulled_in = time.monotonic() - t
    assert pull.returncode == 0, pull.stderr
    assert "Pull complete" in pull.stdout  # layers came over the wire
    assert image in daemon.images()
    t = time.monotonic()
    again = ssh(docker_hosts, tmp_path, host.name, f"docker pull {image}")
    assert again.returncode == 0 and "Image is up to date" in again.stdout
    second_pull = time.monotonic() - t

    work = host.home / "work"
    host.run(["mkdir", "-p", str(work)], as_user=True)
    script = (
        "import os, torch; "
        "open('out.txt', 'w').write(f'{torch.__version__} {torch.ones(3).sum().item()} "
        "{os.getuid()} {os.uname().nodename}')"
    )
    command = (
        f"docker run --rm --net=host --user $(id -u):$(id -g) -v {work}:{work} -w {work} "
        f"{image} python3 -c {shlex.quote(script)}"
    )
    t = time.monotonic()
    run = ssh(docker_hosts, tmp_path, host.name, command)
    ran_in = time.monotonic() - t
    assert run.returncode == 0, run.stderr
    out = work / "out.txt"
    assert out.stat().st_uid == host.uid and out.stat().st_gid == host.gid
    version, total, uid, nodename = out.read_text().split()
    assert version.startswith("2.13.0") and float(total) == 3.0
    assert int(uid) == host.uid
    assert nodename == host.hostname  # host networking and the host's UTS name
    ps = ssh(docker_hosts, tmp_path, host.name, "docker ps -aq")
    assert ps.returncode == 0 and ps.stdout.strip() == ""
    print(
        f"\npull {pulled_in:.1f} s, second pull {second_pull:.2f} s, "
        f"docker run (ssh + start + import torch) {ran_in:.1f} s"
    )


def test_hosts_reach_each_other_from_containers(docker_hosts: DockerBed, tmp_path: Path) -> None:
    """Host networking: a container on d2 connects to d1's sshd (what c10d will need)."""
    d1, d2 = docker_hosts.hosts[:2]
    pull = ssh(docker_hosts, tmp_path, d2.name, f"docker pull -q {docker_hosts.image}")
    assert pull.returncode == 0, pull.stderr
    probe = (
        f"import socket; socket.create_connection(('{d1.addr}', 22), timeout=5).close(); "
        "print('ok')"
    )
    command = f"docker run --rm --net=host {docker_hosts.image} python3 -c {shlex.quote(probe)}"
    run = ssh(docker_hosts, tmp_path, d2.name, command)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_ngc_limits_as_far_as_this_machine_allows(docker_hosts: DockerBed) -> None:
    """NGC's `--ulimit stack=67108864` and `--ipc=host` work; `--ulimit memlock=-1` works only
    where the machine's hard limit is unlimited (raising it needs CAP_SYS_RESOURCE)."""
    daemon = docker_hosts.daemons[docker_hosts.hosts[1].name]
    daemon.docker("pull", "-q", docker_hosts.image, timeout=300)
    base = ["run", "--rm", "--net=host", "--ipc=host", "--ulimit", "stack=67108864"]
    shown = daemon.docker(*base, docker_hosts.image, "sh", "-c", "ulimit -s")
    assert shown.stdout.strip() == "65536"  # KiB
    hard = memlock_hard_limit()
    unlimited = daemon.docker(
        *base, "--ulimit", "memlock=-1", docker_hosts.image, "true", check=False
    )
    assert (unlimited.returncode == 0) == (hard is None), unlimited.stderr
    if hard is not None:
        assert "error setting rlimit" in unlimited.stderr
        capped = daemon.docker(
            *base, "--ulimit", f"memlock={hard}", docker_hosts.image, "sh", "-c", "ulimit -l"
        )
        assert capped.stdout.strip() == str(hard // 1024)
    assert daemon.containers() == []


def test_close_stops_daemon_containers_and_registry_by_pid(docker_hosts: DockerBed) -> None:
    """A daemon with a running container, and a registry, on a host of their own: close()
    leaves no process (daemon, containerd, shim, container), cgroup or file behind."""
    bed = docker_hosts.bed
    assert docker_hosts.registry is not None
    host = bed.add_host("d9")
    daemon = DockerDaemon(host, insecure_registries=[docker_hosts.registry.address])
    registry = ImageRegistry(host, port=5001)
    try:
        daemon.docker("pull", "-q", docker_hosts.image, timeout=300)
        daemon.docker(
            "run",
            "-d",
            "--net=host",
            "--user",
            f"{host.uid}:{host.gid}",
            docker_hosts.image,
            "sleep",
            "600",
        )

        def sleeping() -> list[int]:
            return [p for p in daemon.leftover_pids() if b"sleep" in _cmdline(p)]

        in_container = wait_until(sleeping, 10, "the container's process")
        helpers = daemon.leftover_pids()  # dockerd, containerd, the shim, the container
        assert in_container and all(p in host.user_pids() for p in in_container)
    finally:
        t = time.monotonic()
        daemon.close()
        print(f"\nclose() with a running container {time.monotonic() - t:.2f} s")
        registry.close()
    assert daemon.pid is not None and registry.pid is not None
    for pid in [daemon.pid, registry.pid, *helpers]:
        assert not pid_alive(pid), pid
    assert daemon.leftover_pids() == [] and host.user_pids() == []
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{daemon.cgroup_parent.lstrip('/')}"))
    assert not daemon.root.exists() and not registry.root.exists()
    assert not (host.home / ".docker").exists()


def test_a_rebooted_host_leaves_close_nothing_to_stop(docker_hosts: DockerBed) -> None:
    """stop_sshd() (a reboot: every process in the host dies, dockerd and its containers
    with it): close() then removes the dead daemon's cgroups and files."""
    assert docker_hosts.registry is not None
    host = docker_hosts.bed.add_host("d8")
    daemon = DockerDaemon(host, insecure_registries=[docker_hosts.registry.address])
    try:
        daemon.docker("pull", "-q", docker_hosts.image, timeout=300)
        daemon.docker("run", "-d", "--net=host", docker_hosts.image, "sleep", "600")
        wait_until(
            lambda: any(b"sleep" in _cmdline(p) for p in daemon.leftover_pids()),
            10,
            "the container's process",
        )
        host.stop_sshd()
        assert daemon.pid is not None and not pid_alive(daemon.pid)
        # a killed process leaves its namespaces before its cgroups: wait for it to end
        wait_until(lambda: not daemon.leftover_pids(), 5, "the container to end")
        # the dead container's cgroups are usually left for close(); a shim that saw the
        # container end before it was killed may have removed them itself (then close() has
        # only the daemon's own to remove): either way none may be left after close()
        left = [
            p
            for p in Path("/sys/fs/cgroup").glob(f"*/{daemon.cgroup_parent.lstrip('/')}/*")
            if p.is_dir()
        ]
        print(f"\ncgroups the dead daemon left: {len(left)}")
    finally:
        daemon.close()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{daemon.cgroup_parent.lstrip('/')}"))
    assert not daemon.root.exists()
