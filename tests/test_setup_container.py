"""`vmrun setup --container docker` on a test host with a real Docker Engine (tests/testbed/
docker.py): its own dockerd, the bed's registry, and a user who starts outside the `docker`
group.

Real here: the step logic (what runs, in what order, skipped when fingerprinted), the user
added to the real `docker` group of this machine (/etc/group), the new SSH session that makes
the group count, `docker info` as the user against the real daemon, and the GPU check's
container (pulled from the bed's registry and run by the real daemon).

STAND-INs, where the test hosts cannot be real (no root, no package archive, no route out,
no GPU), each saying so in its text: sudo (it runs only stand-ins; `install` only into the
home), apt-get and dpkg-query (a package list in ~/standin-dpkg), curl (the repository key),
systemctl (the bed's dockerd is already running; it remembers `enable --now`), nvidia-ctk
(writes the runtime into the docker config it is given), lspci and nvidia-smi (a Tesla T4),
usermod (the one root act, done for real by the test process, which is root), and `docker
run --gpus all`, which the bed's daemon cannot do without the NVIDIA runtime: the stand-in
hands the container a stand-in nvidia-smi instead of the GPUs and passes everything else
through to the real docker client.
"""

from __future__ import annotations

import grp
import json
import threading
from collections.abc import Iterator

import pytest
from conftest import Client, error_in, install_standin
from test_cli_setup import APT_GET, DPKG_QUERY, T4_LSPCI, T4_SMI
from testbed import TestHost
from testbed.docker import DOCKER, DockerBed, DockerDaemon, _retry

STEPS = ("container-engine", "nvidia-container-toolkit", "docker-group", "container-check")

# runs the other stand-ins (as this same user: the test hosts have no root) and `install`
# into the home only (where the test points apt's keyrings and sources)
SUDO = r"""# passwordless; runs only stand-ins, and install into $HOME, as this same user
while [ "${1#-}" != "$1" ]; do shift; done
[ "$1" = true ] && exit 0
case "$(command -v "$1")" in "$HOME/.vmrun/bin/"*) exec "$@" ;; esac
if [ "$1" = install ]; then
  for last; do :; done
  case "$last" in "$HOME/"*) exec "$@" ;; esac
fi
echo "STAND-IN sudo: refusing $*" >&2
exit 1
"""

CURL = r"""# no route out of the test hosts: `curl -fSL -o FILE URL` writes an armored key there
echo "curl $*" >> "$HOME/standin-calls"
out=
while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done
printf '%s\n' '-----BEGIN PGP PUBLIC KEY BLOCK-----' 'STAND-IN' \
  '-----END PGP PUBLIC KEY BLOCK-----' > "$out"
"""

SYSTEMCTL = r"""# the bed's dockerd runs already; this remembers `enable --now docker`
echo "systemctl $*" >> "$HOME/standin-calls"
case "$*" in
  "is-active --quiet docker") test -e "$HOME/standin-docker-enabled" ;;
  "enable --now docker") touch "$HOME/standin-docker-enabled" ;;
  "restart docker") ;;
  *) echo "STAND-IN systemctl: unexpected $*" >&2; exit 1 ;;
esac
"""

NVIDIA_CTK = r"""# writes the runtime into the config it is given, as nvidia-ctk does
echo "nvidia-ctk $*" >> "$HOME/standin-calls"
case "$1 $2" in
  "runtime configure")
    for a; do case "$a" in --config=*) config=${a#--config=} ;; esac; done
    mkdir -p "$(dirname "$config")"
    printf '%s\n' '{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}' \
      > "$config" ;;
  *) echo "STAND-IN nvidia-ctk: unexpected $*" >&2; exit 1 ;;
esac
"""

# the one root act: asks the test process (root) to do it, and waits for its answer
USERMOD = r"""# the test process (root) runs the real usermod for it
echo "usermod $*" >> "$HOME/standin-calls"
dir="$HOME/standin-root"
rm -f "$dir/done"
printf '%s\n' "$*" > "$dir/request.new" && mv "$dir/request.new" "$dir/request"
i=0
while [ ! -e "$dir/done" ]; do
  i=$((i + 1)); [ "$i" -lt 300 ] || { echo "STAND-IN usermod: no answer" >&2; exit 1; }
  sleep 0.1
done
exit "$(cat "$dir/done")"
"""

# no GPU here: `run ... --gpus all ...` gets a stand-in nvidia-smi in place of the GPUs
DOCKER_GPUS = r"""# passes everything to the real client but --gpus all
echo "docker $*" >> "$HOME/standin-calls"
gpus=
for a; do [ "$a" = --gpus ] && gpus=1; done
[ -n "$gpus" ] || exec @DOCKER@ "$@"
first=1
for a; do
  if [ -n "$first" ]; then set --; first=; fi
  if [ "$skip" = 1 ]; then skip=; continue; fi
  if [ "$a" = --gpus ]; then
    skip=1; set -- "$@" -v "$HOME/standin-gpu/nvidia-smi:/usr/bin/nvidia-smi:ro"; continue
  fi
  set -- "$@" "$a"
done
exec @DOCKER@ "$@"
"""

CONTAINER_SMI = """#!/bin/sh
# STAND-IN nvidia-smi inside the container: no GPU here
echo "GPU 0: Tesla T4 (UUID: GPU-1b2c)"
"""


@pytest.fixture(scope="module")
def d3(docker_hosts: DockerBed) -> Iterator[tuple[TestHost, DockerDaemon]]:
    """A host of the docker bed with its own dockerd, its user taken out of the `docker`
    group (the daemon gives it the group and a CLI context naming its socket)."""
    host = docker_hosts.bed.add_host("d3")
    assert docker_hosts.registry is not None
    with DockerDaemon(host, insecure_registries=[docker_hosts.registry.address]) as daemon:
        yield host, daemon
    _leave_docker_group(host.user)


def _in_docker_group(user: str) -> bool:
    return user in grp.getgrnam("docker").gr_mem


def _leave_docker_group(user: str) -> None:
    if _in_docker_group(user):
        _retry(["gpasswd", "-d", user, "docker"], f"gpasswd -d {user} docker")


def _root_agent(host: TestHost, stop: threading.Event, done: list[str]) -> None:
    """Answers the stand-in usermod: exactly `-aG docker USER`, done for real."""
    folder = host.home / "standin-root"
    while not stop.wait(0.05):
        request = folder / "request"
        if not request.exists():
            continue
        words = request.read_text().split()
        request.unlink()
        rc = 1
        if words == ["-aG", "docker", host.user]:
            _retry(["usermod", *words], "usermod")
            done.append(" ".join(words))
            rc = 0
        (folder / "done").write_text(f"{rc}\n")


def _calls(host: TestHost) -> list[str]:
    path = host.home / "standin-calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def gpu_host(
    d3: tuple[TestHost, DockerDaemon], docker_hosts: DockerBed, client: Client
) -> Iterator[tuple[TestHost, Client, list[str]]]:
    host, _daemon = d3
    _leave_docker_group(host.user)
    assert not _in_docker_group(host.user)
    bed = docker_hosts.bed
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    for name, script in (
        ("sudo", SUDO),
        ("apt-get", APT_GET),
        ("dpkg-query", DPKG_QUERY),
        ("curl", CURL),
        ("systemctl", SYSTEMCTL),
        ("nvidia-ctk", NVIDIA_CTK),
        ("usermod", USERMOD),
        ("lspci", T4_LSPCI),
        ("nvidia-smi", T4_SMI),
        ("docker", DOCKER_GPUS.replace("@DOCKER@", DOCKER)),
    ):
        install_standin(host, name, script)
    for folder in ("standin-root", "standin-gpu", "etc"):
        host.run(["mkdir", "-p", str(host.home / folder)], as_user=True)
    smi = host.home / "standin-gpu" / "nvidia-smi"
    smi.write_text(CONTAINER_SMI)
    smi.chmod(0o755)
    stop, done = threading.Event(), []
    agent = threading.Thread(target=_root_agent, args=(host, stop, done), daemon=True)
    agent.start()
    yield host, client, done
    stop.set()
    agent.join()
    host.run(
        [
            "rm",
            "-rf",
            *(
                str(host.home / n)
                for n in (
                    ".vmrun",
                    "standin-root",
                    "standin-gpu",
                    "etc",
                    "standin-calls",
                    "standin-dpkg",
                    "standin-docker-enabled",
                )
            ),
        ],
        as_user=True,
    )


def _params(host: TestHost, image: str) -> list[str]:
    etc = host.home / "etc"
    return [
        "--param",
        f"container_test_image={image}",
        "--param",
        f"apt_keyrings={etc}/keyrings",
        "--param",
        f"apt_sources={etc}/sources.list.d",
        "--param",
        f"docker_config={etc}/docker/daemon.json",
    ]


@pytest.mark.timeout(300)
def test_docker_on_a_gpu_host_in_order_the_group_counts_and_a_rerun_skips_it_all(
    docker_hosts: DockerBed, gpu_host: tuple[TestHost, Client, list[str]]
) -> None:
    host, client, root_acts = gpu_host
    only = [w for s in STEPS for w in ("--only", s)]
    args = [
        "setup",
        "d3",
        "--container",
        "docker",
        *only,
        *_params(host, docker_hosts.image),
        "--no-record",
    ]
    # outside the group, the real daemon refuses the user: the check says which and why
    refused = client.vmrun(
        *args[:4], "--only", "container-check", *args[4 + len(only) :], timeout=120
    )
    assert refused.returncode == 1, refused.stderr + refused.stdout
    code, said = error_in(refused.stderr)
    assert code == "setup-step-failed" and said.startswith("d3: step container-check failed")
    assert f"{host.user} cannot use the Docker engine: permission denied" in said, said
    (host.home / "standin-calls").unlink()

    plan = client.vmrun(*args, "--dry-run", timeout=120)
    assert plan.returncode == 0, plan.stderr + plan.stdout
    for step in STEPS:
        assert f"would run {step}" in plan.stdout, plan.stdout
    assert "nvidia-ctk runtime configure --runtime=docker" in plan.stdout
    assert _calls(host) == ["systemctl is-active --quiet docker"]  # the checks: read-only

    done = client.vmrun(*args, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    lock = "apt-get -o DPkg::Lock::Timeout=300"
    before = _calls(host)
    calls = [c for c in before if not c.startswith("systemctl is-active")]
    fetched = [c for c in calls if c.startswith("curl ")]
    assert [c.split()[-1] for c in fetched] == [
        "https://nvidia.github.io/libnvidia-container/gpgkey"
    ], calls
    assert [("curl" if c in fetched else c) for c in calls] == [
        f"{lock} update",
        f"{lock} install -y docker.io",
        "systemctl enable --now docker",
        "curl",
        f"{lock} update",  # again: the new repository's lists
        f"{lock} install -y nvidia-container-toolkit",
        "nvidia-ctk runtime configure --runtime=docker"
        f" --config={host.home}/etc/docker/daemon.json",
        "systemctl restart docker",
        f"usermod -aG docker {host.user}",
        "docker info",
        f"docker run --rm --gpus all {docker_hosts.image} nvidia-smi -L",
    ], calls
    assert root_acts == [f"-aG docker {host.user}"] and _in_docker_group(host.user)
    keyring = host.home / "etc" / "keyrings" / "nvidia-container-toolkit.asc"
    sources = (host.home / "etc" / "sources.list.d" / "nvidia-container-toolkit.list").read_text()
    assert sources.startswith(f"deb [signed-by={keyring}] https://nvidia.github.io/"), sources
    assert "container=docker" in done.stdout and "container_gpus=1" in done.stdout, done.stdout
    log = (client.cwd / ".vmrun" / "logs" / "setup-d3.log").read_text()
    assert "logging in again after docker-group" in log
    state = json.loads((host.home / ".vmrun" / "setup" / "state.json").read_text())
    assert state["steps"]["container-check"]["record"]["container"] == "docker"

    again = client.vmrun(*args, timeout=120)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "ran 0 (nothing), 4 already done" in again.stdout, again.stdout
    # only the checks ran (read-only): nothing installed, restarted or changed again
    assert _calls(host)[len(before) :] == ["systemctl is-active --quiet docker"], _calls(host)
    assert root_acts == [f"-aG docker {host.user}"]
