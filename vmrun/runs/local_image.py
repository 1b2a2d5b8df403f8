"""`vmrun train --local --image`: the run on this machine with its processes in a container
of the local engine (docker, else podman), as on a host: host network and IPC, the project
at its own path and the user's uid (its files are the user's), the template trainer's
folder read-only, a HOME of its own for caches (~/.cache/vmrun/container-home). The image
is pulled first (the engine's login is the user's own here); hostside/container_run.sh
stops and removes the container when the run is stopped (Ctrl-C).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from vmrun import hostside
from vmrun.containers import runtime as rt
from vmrun.containers.image import ImageRef, Mount, check_mount_sources
from vmrun.containers.pull import NOT_HERE, PullLines, not_here, pull_error
from vmrun.containers.request import Request
from vmrun.reporting import Reporter
from vmrun.runs.plan import CONTAINER_STOP_GRACE

HERE = "local"


@dataclass(frozen=True)
class LocalImage:
    request: Request
    runtime: rt.Runtime
    gpus: int
    digest: str | None = None
    image_id: str | None = None

    def meta(self) -> dict[str, object]:
        return {
            **self.request.meta(),
            "container_runtime": self.runtime.name,
            "image_digest": self.digest,
            "image_id": self.image_id,
        }


def prepare(request: Request, out: Reporter) -> LocalImage:
    """The engine here (refused: none, or one that runs only in Slurm jobs), the mounts'
    sources, then the pull; before anything starts."""
    found = [name for name in ("docker", "podman") if shutil.which(name)]
    runtime = rt.engine_for(request.runtime, found, HERE)
    rt.check(
        runtime, rt.ContainerSpec(request.image, (), "/", "check", mounts=request.mounts), rt.HOSTS
    )
    missing = {m.source for m in request.mounts if not os.path.exists(m.source)}
    check_mount_sources(list(request.mounts), missing, HERE)
    image = request.image
    assert isinstance(image, ImageRef)
    lines = PullLines()
    started = time.monotonic()
    args = rt.pull_script_args(runtime, image, request.pull)
    argv = ["sh", str(hostside.HERE / rt.PULL_SCRIPT), *args]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=3600)
    lines("out", done.stdout + b"\n" + done.stderr)
    pulled = lines.close()
    if done.returncode == NOT_HERE:
        raise not_here(str(image), None)
    if done.returncode != 0:
        raise pull_error("\n".join(lines.text), str(image), HERE)
    out.info(lines.summary(str(image), time.monotonic() - started))
    return LocalImage(request, runtime, _gpus(), pulled.digest, lines.image_id)


def _gpus() -> int:
    """NVIDIA GPUs here, by nvidia-smi (torch is the image's, not this machine's)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines())


def wrap(
    local: LocalImage,
    argv: list[str],
    env_names: list[str],
    *,
    project: Path,
    rid: str,
    script: Path,
) -> list[str]:
    """`argv` run in the image by container_run.sh; `env_names`: the variables it gets."""
    home = Path.home() / ".cache" / "vmrun" / "container-home"
    home.mkdir(parents=True, exist_ok=True)
    own = [Mount(str(home), str(home))]
    if not script.is_relative_to(project):  # the template: vmrun's own folder
        own.append(Mount(str(script.parent), str(script.parent), read_only=True))
    spec = rt.ContainerSpec(
        image=local.request.image,
        command=tuple(argv),
        workdir=str(project),
        run_id=rid,
        mounts=rt.with_own_mounts(own, str(project), local.request.mounts),
        env=tuple(env_names),
        uid=os.getuid(),
        gid=os.getgid(),
        gpus=local.gpus > 0,
        rootless=local.runtime.name == "podman" and os.getuid() != 0,
        home=str(home),
        ulimits=local.request.ulimits or rt.NGC_ULIMITS,
    )
    runner = str(hostside.HERE / rt.RUNNER)
    return ["sh", runner, *rt.script_args(local.runtime, spec, CONTAINER_STOP_GRACE)]
