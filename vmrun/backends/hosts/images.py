"""A run inside a container image on SSH hosts: what each host offers (its runtime, the
user's ids, the mount sources), the pull (once per host, before the run, progress in the
live view, registry credentials over stdin only), and the argv that starts a node's
processes in the container (vmrun/hostside/container_run.sh: stopping the run stops and
removes the container, whose exit code is the run's).

The container sees the host's network and shared memory, the project's work directory at
the same path (so a script's files land where they would without the image, as the user),
the run's record folder (torchrun's per-rank files), vmrun's read-only lib folder (the
template trainer) and a HOME of its own (~/.vmrun/container-home: caches of torch, pip,
triton), plus the run's mounts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from vmrun import hostside
from vmrun.containers import runtime as rt
from vmrun.containers.image import ImageRef, Mount, check_mount_sources, mount_probe_args
from vmrun.containers.pull import NOT_HERE, PullLines, PullProgress, not_here, pull_error
from vmrun.containers.request import Request
from vmrun.errors import UsageError
from vmrun.remote_paths import CONTAINER_HOME, LIB_DIR
from vmrun.reporting import Reporter
from vmrun.runs.plan import CONTAINER_STOP_GRACE as GRACE
from vmrun.ssh.connection import Connection
from vmrun.transfer.types import Progress

PROBE = "container_probe.sh"  # vmrun/hostside: runtimes, ids, missing mount sources
NGC_USER = "$oauthtoken"  # NGC's registry login: this literal username, the API key


@dataclass(frozen=True)
class NodeImage:
    """One node's container as decided before anything starts."""

    request: Request
    runtime: rt.Runtime
    uid: int
    gid: int
    digest: str | None = None
    image_id: str | None = None  # the image's ID on the host (its config's digest)

    def meta(self) -> dict[str, object]:
        return {
            **self.request.meta(),
            "container_runtime": self.runtime.name,
            "image_digest": self.digest,
            "image_id": self.image_id,
        }


def probe(conn: Connection, request: Request) -> NodeImage:
    """The host's runtime for `request` (refused: none there, one that cannot run on hosts,
    a mount source missing), and the user's ids; one round trip."""
    argv = [*hostside.command(PROBE), CONTAINER_HOME, *mount_probe_args(list(request.mounts))]
    said = conn.run(argv, check=True, what="the container probe").stdout_tail.splitlines()
    ids = next((i for i, line in enumerate(said) if line.startswith("ID ")), None)
    if ids is None or "MISSING" not in said[ids:]:
        raise UsageError("the container probe gave no answer", host=conn.label)
    found = [line.strip() for line in said[:ids] if line.strip()]
    missing = {line for line in said[said.index("MISSING", ids) + 1 :] if line}
    uid, gid = (int(x) for x in said[ids].split()[1:3])
    runtime = rt.engine_for(request.runtime, found, conn.label)
    spec = rt.ContainerSpec(request.image, (), "/", "check", mounts=request.mounts)
    rt.check(runtime, spec, rt.HOSTS)
    check_mount_sources(list(request.mounts), missing, conn.label)
    return NodeImage(request, runtime, uid, gid)


def credentials(image: ImageRef) -> tuple[str, dict[str, str]] | None:
    """The registry login this machine's environment holds for `image`: NGC's API key
    (NGC_API_KEY) for nvcr.io, else VMRUN_REGISTRY_USER and VMRUN_REGISTRY_PASSWORD. The
    password goes to the host as an environment value, which travels over stdin."""
    key = os.environ.get("NGC_API_KEY")
    if image.domain == "nvcr.io" and key:
        return NGC_USER, {rt.PASSWORD_ENV: key}
    user, password = os.environ.get("VMRUN_REGISTRY_USER"), os.environ.get(rt.PASSWORD_ENV)
    if user and password:
        return user, {rt.PASSWORD_ENV: password}
    return None


def pull(
    conn: Connection, node: NodeImage, out: Reporter, progress: Progress | None = None
) -> NodeImage:
    """Pull the node's image on its host as its pull policy says (a second pull of an
    image already there is one round trip); the node with the image ID it will run and the
    digest it was pulled as."""
    image = node.request.image
    assert isinstance(image, ImageRef)
    login = credentials(image)
    args = rt.pull_script_args(node.runtime, image, node.request.pull, login[0] if login else None)
    host = conn.label

    def show(now: PullProgress) -> None:
        if progress is not None:
            what = f"pull {image} ({now.layers_done}/{now.layers_total} layers)"
            progress.step(host, what, now.bytes_done or 0, now.bytes_total)

    lines = PullLines(show)
    started = time.monotonic()
    result = conn.run(
        [*hostside.command(rt.PULL_SCRIPT), *args],
        env=login[1] if login else None,
        on_output=lines,
        what=f"the pull of {image}",
    )
    done = lines.close()
    if result.exit_status == NOT_HERE:
        raise not_here(str(image), host)
    if not result.ok:
        raise pull_error("\n".join(lines.text) or result.output_tail(), str(image), host)
    digest = done.digest
    if digest is None:
        found = conn.run(rt.digest_argv(node.runtime, image), what="the image's digest")
        digest = rt.parse_digest(found.stdout_tail, image) if found.ok else None
    out.info(f"{host}: {lines.summary(str(image), time.monotonic() - started)}")
    return replace(node, digest=digest, image_id=lines.image_id)


def check_same_image(images: dict[str, NodeImage]) -> None:
    """Every node runs the same image, by its ID (the same image has the same ID on every
    host, pulled or loaded); a tag moved between two hosts' pulls, or two hosts' own
    builds, is refused with the nodes named."""
    seen: dict[str, list[str]] = {}
    for label, node in images.items():
        key = node.image_id or f"{node.request.image}@{node.digest or '?'}"
        seen.setdefault(key, []).append(label)
    if len(seen) > 1:
        which = "; ".join(f"{_short(i)} on {', '.join(hosts)}" for i, hosts in seen.items())
        raise UsageError(
            f"the nodes would run different images of {next(iter(images.values())).request.image}"
            f" ({which}); nothing was started",
            hint="give every host the same image (pull = always, or pin it: IMAGE@sha256:...)",
            code="images-differ",
        )


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12] if image_id.startswith("sha256:") else image_id


def container_argv(
    node: NodeImage,
    argv: Sequence[str],
    env_names: Sequence[str],
    *,
    home: str,
    workdir: str,
    record: str,
    run_id: str,
    index: int,
    gpus: bool,
) -> list[str]:
    """The node's process: container_run.sh running `argv` in the image. `home`: the
    user's home on the host; `workdir`, `record`: relative to it."""
    chome = f"{home}/{CONTAINER_HOME}"
    own = (
        Mount(f"{home}/{record}", f"{home}/{record}"),
        Mount(f"{home}/{LIB_DIR}", f"{home}/{LIB_DIR}", read_only=True),
        Mount(chome, chome),
    )
    spec = rt.ContainerSpec(
        image=node.request.image,
        command=tuple(argv),
        workdir=f"{home}/{workdir}",
        run_id=run_id,
        node=index,
        mounts=rt.with_own_mounts(own, f"{home}/{workdir}", node.request.mounts),
        env=(*env_names, "VMRUN_RUN_DIR", "VMRUN_BEAT_DIR"),
        uid=node.uid,
        gid=node.gid,
        gpus=gpus,
        rootless=node.runtime.name == "podman" and node.uid != 0,
        home=chome,
        ulimits=node.request.ulimits or rt.NGC_ULIMITS,
    )
    return [*hostside.command(rt.RUNNER), *rt.script_args(node.runtime, spec, GRACE)]


def remove_leftovers(conn: Connection, runtime: str, run_id: str) -> list[str]:
    """Remove the run's containers still on the host (a supervisor killed outright leaves
    its container); their names."""
    engine = rt.runtime_named(runtime)
    found = conn.run(rt.ps_argv(engine, run_id), what="the run's containers", activity=False)
    names = [name for name, _ in rt.parse_ps(found.stdout_tail)] if found.ok else []
    for name in names:
        conn.run(rt.rm_argv(engine, name), what=f"the removal of container {name}")
    return names
