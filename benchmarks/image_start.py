"""Training in a container image: what it costs to start, and what a second pull costs.

1. Time from `vmrun train` to the first epoch line, the template with 2 CPU processes on one
   host: without an image (the host's own Python), with `--image` (the image already on the
   host), and by hand as the seed tutorial does it (`ssh host docker run --rm --net=host
   --ipc=host ... IMAGE python3 -m torch.distributed.run ...`). The image's cost is
   `image / bare`; vmrun against the hand-written line is `image / by hand`.
2. The pull of an image the host already has (vmrun.backends.hosts.images.pull, which every
   `train --image` runs) against one command over the same open connection (`true`): it
   should cost about one round trip and the registry's answer.

Needs root (a network-namespace test host), docker.io, runc and docker-registry, the test
image's cached rootfs and the cached interpreter with torch (.ci/run builds both).

    python benchmarks/image_start.py [--runs 3]

Measured here (2 cores, Debian docker.io 20.10 with runc, medians of 3): no image 3.51 s,
--image 5.55 s (1.58x: the container's start and torch's import in it), by hand 5.19 s
(vmrun 1.07x the hand-written docker run). A second pull: 51 ms, one command, against 33 ms
for a bare `docker pull -q` on the same connection and 7 ms for `true` (the rest is the
pull's terminal for byte counts, script(1)).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402
from testbed.docker import (  # noqa: E402
    DockerBed,
    image_tarball,
    memlock_hard_limit,
    skip_reason_no_docker,
)
from train_start import until_first_epoch  # noqa: E402

CACHE = Path("/opt/vmrun-test-cache")
CACHED_PYTHON = CACHE / "venv-py3-torch-2.13.0" / "bin" / "python"


def second_pull(
    bed: NetnsBed, image: str, env: dict[str, str], runs: int
) -> tuple[float, float, float]:
    """Median seconds, on one connection, of vmrun's pull of a present image, of a bare
    `docker pull -q` of it, and of `true`."""
    import os

    from vmrun.backends.hosts.images import NodeImage, pull
    from vmrun.config import load_settings
    from vmrun.containers.image import parse_image
    from vmrun.containers.request import Request
    from vmrun.containers.runtime import RUNTIMES
    from vmrun.reporting import QUIET
    from vmrun.ssh.connection import Connection
    from vmrun.ssh.hosts import HostSpec

    old = dict(os.environ)
    os.environ.update(env)
    try:
        settings = load_settings({})
        node = NodeImage(Request(parse_image(image)), RUNTIMES["docker"], 0, 0)
        pulls, bare, trues = [], [], []
        with Connection(HostSpec("d1"), settings) as conn:
            conn.run(["true"])  # vmrun's host-side files in place first
            for _ in range(runs):
                t = time.perf_counter()
                pull(conn, node, QUIET)
                pulls.append(time.perf_counter() - t)
                t = time.perf_counter()
                conn.run(["docker", "pull", "-q", image], check=True)
                bare.append(time.perf_counter() - t)
                t = time.perf_counter()
                conn.run(["true"])
                trues.append(time.perf_counter() - t)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return statistics.median(pulls), statistics.median(bare), statistics.median(trues)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    missing = skip_reason_no_netns() or skip_reason_no_docker(CACHE)
    if missing or not CACHED_PYTHON.exists():
        sys.exit(f"image_start: cannot run here: {missing or f'no {CACHED_PYTHON} (.ci/run)'}")
    tar = image_tarball(CACHE)
    assert tar is not None
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    try:
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed, DockerBed(bed, tar, names=("d1",)) as docker:
            home, project, env = client_dirs(bed, work)
            env.update({"NO_COLOR": "1", "OMP_NUM_THREADS": "1"})
            hard = memlock_hard_limit()
            limit = "memlock=-1" if hard is None else f"memlock={hard}"
            (project / "vmrun.toml").write_text(
                f'container_ulimits = ["{limit}", "stack=67108864"]\n\n'
                f'[[hosts]]\naddress = "d1"\npython = "{CACHED_PYTHON}"\n'
            )
            image = docker.image
            host = docker.hosts[0]
            docker.daemons["d1"].docker("pull", "-q", image, timeout=600)
            template = host.home / "template.py"
            shutil.copy(ROOT / "vmrun" / "trainer" / "template.py", template)
            host.run(["chown", f"{host.uid}:{host.gid}", str(template)])
            known = home / ".ssh" / "known_hosts"
            by_hand = [
                "ssh",
                "-F",
                str(home / ".ssh" / "config"),
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "BatchMode=yes",
                "d1",
                "docker",
                "run",
                "--rm",
                "--net=host",
                "--ipc=host",
                "--ulimit",
                limit,
                "--ulimit",
                "stack=67108864",
                "--user",
                f"{host.uid}:{host.gid}",
                "-v",
                f"{host.home}:{host.home}",
                "-w",
                str(host.home),
                "-e",
                "OMP_NUM_THREADS=1",
                image,
                "python3",
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "template.py",
                "3",
                "1",
                "--out-dir",
            ]
            bare = [sys.executable, "-m", "vmrun", "train", "-H", "d1", "--", "3", "1"]
            in_image = [*bare[:4], "--image", image, *bare[4:]]
            times: dict[str, list[float]] = {"bare": [], "image": [], "hand": []}
            for i in range(args.runs):  # interleaved, so drift hits all alike
                times["bare"].append(until_first_epoch(bare, project, env))
                times["image"].append(until_first_epoch(in_image, project, env))
                times["hand"].append(until_first_epoch([*by_hand, f"by-hand-{i}"], project, env))
            pull_s, docker_s, true_s = second_pull(bed, image, env, max(args.runs, 5))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"vmrun train, no image, median:         {med['bare']:6.2f} s")
    print(f"vmrun train --image, median:           {med['image']:6.2f} s")
    print(f"ssh host docker run ... (by hand):      {med['hand']:6.2f} s")
    print(f"the image's start-up cost: {med['image'] / med['bare']:.2f}x the bare run")
    print(f"vmrun --image / docker run by hand: {med['image'] / med['hand']:.2f}")
    print(
        f"second pull: vmrun {pull_s * 1000:.0f} ms (one command), `docker pull -q` over the"
        f" same connection {docker_s * 1000:.0f} ms, `true` {true_s * 1000:.0f} ms"
    )
    print(f"vmrun's second pull / a bare docker pull: {pull_s / docker_s:.2f}")


if __name__ == "__main__":
    main()
