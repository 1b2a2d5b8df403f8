"""The container runtimes as values: what each can do, what it refuses, and the argv it needs.

On SSH hosts the run's processes start through `docker run` (or `podman run`) with what
NVIDIA documents for multi-GPU and multi-node work in its NGC images: host networking (c10d
and NCCL see the host's interfaces), `--ipc=host` (PyTorch's shared memory), unlimited
locked memory and a 64 MiB stack, the GPUs where the host has them; the work directory
mounted at the same path and the user's uid, so the script's files land where they would
without the image and belong to the user. On a Slurm cluster the cluster's runtime runs the
step: pyxis (srun options), apptainer or shifter (a prefix of the step's command), or
docker/podman on the compute nodes. Nothing here runs anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from vmrun.containers.image import Image, ImageRef, Mount, SifImage
from vmrun.errors import ConfigError, UsageError
from vmrun.remote_paths import RUN_ENV

HOSTS, SLURM = "hosts", "slurm"  # where a run executes (the two backends)
LABEL_RUN, LABEL_NODE = "vmrun.run", "vmrun.node"  # how stop and status find a run's containers
STACK_BYTES = 67108864  # NGC's `--ulimit stack=67108864`
# NGC's limits. Raising memlock above the host's hard limit needs CAP_SYS_RESOURCE in the
# daemon: a GPU host's dockerd has it, a sandboxed one (the test bed's) may not, and runc
# then refuses to start the container ("error setting rlimits"); such a caller gives others.
NGC_ULIMITS = ("memlock=-1", f"stack={STACK_BYTES}")


@dataclass(frozen=True)
class Runtime:
    """One runtime and what it supports; `gpus`: the flags that hand it the GPUs (empty
    where it does so itself); `user`: how the processes get the user's uid (`flag`: `--user
    UID:GID`; `caller`: it always runs as whoever starts it)."""

    name: str
    binary: str | None  # None: pyxis, which is options of srun
    where: frozenset[str]
    gpus: tuple[str, ...]
    user: str
    mounts: bool = True
    read_only: bool = True
    sif: bool = False
    registry: bool = True
    pull: str = "pull"  # "pull": an explicit pull first; "on-start": the runtime pulls itself
    note: str = ""


RUNTIMES: dict[str, Runtime] = {
    r.name: r
    for r in (
        Runtime(
            "docker",
            "docker",
            frozenset({HOSTS, SLURM}),
            ("--gpus", "all"),
            "flag",
            note="NVIDIA Container Toolkit for --gpus",
        ),
        Runtime(
            # CDI names the GPUs (`nvidia-ctk cdi generate`); rootless podman maps the user
            # with --userns=keep-id (see `_user_flags`)
            "podman",
            "podman",
            frozenset({HOSTS, SLURM}),
            ("--device", "nvidia.com/gpu=all"),
            "flag",
            note="GPUs through CDI",
        ),
        Runtime(
            "pyxis",
            None,
            frozenset({SLURM}),
            (),
            "caller",
            pull="on-start",
            note="srun --container-*; enroot imports the image on each node",
        ),
        Runtime(
            "apptainer",
            "apptainer",
            frozenset({SLURM}),
            ("--nv",),
            "caller",
            sif=True,
            pull="on-start",
            note="docker:// references are converted to a .sif on first use",
        ),
        Runtime(
            "shifter",
            "shifter",
            frozenset({SLURM}),
            ("--module=gpu",),
            "caller",
            read_only=False,
            pull="on-start",
            note="the image must be in the site's shifter store (shifterimg pull)",
        ),
    )
}
RUNNER = "container_run.sh"  # vmrun/hostside: runs, stops and removes one container
DETECT_SCRIPT = "container_detect.sh"  # vmrun/hostside: the runtimes a host has, by name
PULL_SCRIPT = "container_pull.sh"  # vmrun/hostside: login (password from stdin) and pull
PASSWORD_ENV = "VMRUN_REGISTRY_PASSWORD"  # the registry password PULL_SCRIPT reads
DETECT_ORDER = ("pyxis", "apptainer", "shifter", "podman", "docker")  # a login node's first
IMAGE_PYTHON = "python3"  # the interpreter inside an image (NGC's images have it on the PATH)


def runtime_named(name: str) -> Runtime:
    """The runtime `container_runtime = NAME` names."""
    try:
        return RUNTIMES[name]
    except KeyError:
        known = ", ".join(RUNTIMES)
        raise ConfigError(f"container_runtime = {name!r}: not one of {known}") from None


def detect(found: Iterable[str]) -> Runtime | None:
    """The runtime to use among those DETECT_SCRIPT found (its output's lines), in
    DETECT_ORDER: a site's own (pyxis, apptainer, shifter) before a general one."""
    have = set(found)
    return next((RUNTIMES[n] for n in DETECT_ORDER if n in have), None)


def require_present(runtime: Runtime, present: bool, host: str | None = None) -> None:
    """Refuse, before anything starts, an image on a host or cluster without its runtime."""
    if present:
        return
    if runtime.name in ("docker", "podman") and host != "local":
        hint = f"`vmrun setup --container {runtime.name}` installs it"
    elif host == "local":
        hint = f"install {runtime.name} here, or train on hosts"
    else:
        hint = "set container_runtime in the cluster's [[clusters]] table"
    raise UsageError(
        f"--image needs {runtime.name}, which is not there",
        host=host,
        hint=hint,
        code="container-runtime-missing",
    )


def engine_for(name: str, found: Iterable[str], host: str) -> Runtime:
    """The runtime of a machine that runs containers itself (an SSH host, this machine):
    `auto` is docker where it is there, else podman; a runtime named is that one. Refused
    (exit 2) when it is not there."""
    have = set(found)
    if name == "auto":
        name = next((n for n in ("docker", "podman") if n in have), "docker")
    runtime = runtime_named(name)
    if HOSTS in runtime.where:  # one that runs only in Slurm jobs: `check` refuses it
        require_present(runtime, name in have, host)
    return runtime


def with_own_mounts(
    own: Iterable[Mount], workdir: str, asked: Iterable[Mount]
) -> tuple[Mount, ...]:
    """vmrun's own mounts, then the run's, less any that would land on one of vmrun's or on
    the work directory (which is mounted at its own path)."""
    mine = tuple(own)
    taken = {m.target for m in mine} | {workdir}
    return (*mine, *(m for m in asked if m.target not in taken))


# -- what a run asks of the container --------------------------------------------------------


@dataclass(frozen=True)
class ContainerSpec:
    """One node's container: the image, the command, and what it sees of the host.

    `env` names variables passed by name only (`-e NAME`): their values travel in the
    environment of the runtime's client, never on its command line (secrets, `ps`)."""

    image: Image
    command: tuple[str, ...]
    workdir: str
    run_id: str
    node: int = 0
    mounts: tuple[Mount, ...] = ()
    env: tuple[str, ...] = ()
    uid: int | None = None
    gid: int | None = None
    gpus: bool = False  # the host has NVIDIA GPUs (a probe's answer)
    rootless: bool = False  # podman run by a user: --userns=keep-id instead of --user
    # HOME inside: a uid the image's /etc/passwd lacks gets `/`, where caches (torch,
    # triton, pip) cannot be written; a directory mounted from the host, not a secret
    home: str | None = None
    ulimits: tuple[str, ...] = NGC_ULIMITS
    extra: tuple[str, ...] = field(default=())  # more `run` options, as given

    @property
    def name(self) -> str:
        """`vmrun-RUN-NODE`, in the characters a container name may hold."""
        return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"vmrun-{self.run_id}-{self.node}")

    @property
    def env_names(self) -> tuple[str, ...]:
        """The variables passed in: the run's id first (how `stop` finds every process of a
        run, inside a container too), then the ones asked for."""
        return tuple(dict.fromkeys((RUN_ENV, *self.env)))


# -- refusal rules, as data: (applies, message, hint) ---------------------------------------
Rule = tuple[Callable[[Runtime, ContainerSpec, str], bool], str, str]
RULES: tuple[Rule, ...] = (
    (
        lambda rt, spec, where: where not in rt.where,
        "{rt.name} runs only inside Slurm jobs",
        "on SSH hosts use docker or podman",
    ),
    (
        lambda rt, spec, where: isinstance(spec.image, SifImage) and not rt.sif,
        "{rt.name} cannot run a .sif file",
        "give a registry image, or use apptainer",
    ),
    (
        lambda rt, spec, where: isinstance(spec.image, ImageRef) and not rt.registry,
        "{rt.name} cannot pull a registry image",
        "give a .sif file",
    ),
    (
        lambda rt, spec, where: bool(spec.mounts) and not rt.mounts,
        "{rt.name} cannot mount host paths",
        "drop --mount",
    ),
    (
        lambda rt, spec, where: any(m.read_only for m in spec.mounts) and not rt.read_only,
        "{rt.name} mounts are read-write only here",
        "drop :ro from --mount",
    ),
)


def check(runtime: Runtime, spec: ContainerSpec, where: str) -> None:
    """Refuse what the runtime cannot do, before anything starts (one line, exit 2)."""
    for applies, message, hint in RULES:
        if applies(runtime, spec, where):
            raise UsageError(
                f"--image {spec.image}: " + message.format(rt=runtime),
                hint=hint,
                code="container-option-unsupported",
            )


# -- docker and podman: on SSH hosts, and on Slurm compute nodes -----------------------------


def _binary(runtime: Runtime) -> str:
    if runtime.binary is None or runtime.name not in ("docker", "podman"):
        raise ValueError(f"{runtime.name} has no `run` of its own")
    return runtime.binary


def _user_flags(runtime: Runtime, spec: ContainerSpec) -> list[str]:
    if runtime.name == "podman" and spec.rootless:
        return ["--userns=keep-id"]  # the user's uid inside is the user's outside
    if spec.uid is None:
        return []
    return ["--user", f"{spec.uid}:{spec.gid if spec.gid is not None else spec.uid}"]


def _ulimits(runtime: Runtime, spec: ContainerSpec) -> list[str]:
    if runtime.name == "podman" and spec.rootless:
        return ["--ulimit", "host"]  # a user's podman cannot raise limits above the host's
    return [word for limit in spec.ulimits for word in ("--ulimit", limit)]


# podman's --ipc=host binds the host's /dev/mqueue, which a host without systemd may lack
# ("statfs /dev/mqueue: no such file or directory"); a message queue is the IPC namespace's
# (mq_open), not the mount's, so a tmpfs there changes nothing a run uses
PODMAN_MQUEUE = ("--mount", "type=tmpfs,destination=/dev/mqueue")


def run_options(runtime: Runtime, spec: ContainerSpec, *, node_label: bool = True) -> list[str]:
    """Every option of `run` after `--name`, then the image and the command (`node_label`
    False: the caller adds the node's label, known only where the container starts)."""
    _binary(runtime)
    node = ["--label", f"{LABEL_NODE}={spec.node}"] if node_label else []
    argv = [
        "--label",
        f"{LABEL_RUN}={spec.run_id}",
        *node,
        "--init",  # a PID 1 that passes signals on and reaps (torchrun's workers)
        "--net=host",
        "--ipc=host",
        *(PODMAN_MQUEUE if runtime.name == "podman" else ()),
        *_ulimits(runtime, spec),
        *(runtime.gpus if spec.gpus else ()),
        *_user_flags(runtime, spec),
        "-v",
        f"{spec.workdir}:{spec.workdir}",
        "-w",
        spec.workdir,
    ]
    for mount in spec.mounts:
        argv += ["-v", str(mount)]
    if spec.home is not None:
        argv += ["-e", f"HOME={spec.home}"]
    for name in spec.env_names:
        argv += ["-e", name]
    return [*argv, *spec.extra, str(spec.image), *spec.command]


def run_argv(runtime: Runtime, spec: ContainerSpec) -> list[str]:
    """The whole `docker run` line, for one that reads its status itself (no --rm; a run's
    container goes through hostside/container_run.sh, which adds it)."""
    return [_binary(runtime), "run", "--name", spec.name, *run_options(runtime, spec)]


def script_args(runtime: Runtime, spec: ContainerSpec, grace: int) -> list[str]:
    """The arguments of vmrun/hostside/container_run.sh: `DOCKER NAME GRACE RUN_OPTIONS...`
    (GRACE: the seconds `docker stop` waits before it kills)."""
    return [_binary(runtime), spec.name, str(grace), *run_options(runtime, spec)]


def pull_argv(runtime: Runtime, image: ImageRef) -> list[str]:
    return [_binary(runtime), "pull", str(image)]


def pull_script_args(
    runtime: Runtime, image: ImageRef, policy: str = "always", username: str | None = None
) -> list[str]:
    """The arguments of PULL_SCRIPT: `DOCKER IMAGE POLICY [REGISTRY USERNAME]` (POLICY:
    vmrun.containers.request.PULL_POLICIES). With a username it logs in first, the password
    in the environment as PASSWORD_ENV (sent through stdin by the command wrapper), into a
    configuration the script removes after the pull."""
    args = [_binary(runtime), str(image), policy]
    if username is not None:
        args += [image.domain, username]
    return args


def login_argv(runtime: Runtime, registry: str, username: str) -> list[str]:
    """`docker login` with the password on stdin (never on a command line or in a log);
    NGC's username is the literal `$oauthtoken`, its password the NGC_API_KEY."""
    return [_binary(runtime), "login", "--username", username, "--password-stdin", registry]


def digest_argv(runtime: Runtime, image: ImageRef) -> list[str]:
    """The repository digests of the local image (`parse_digest` reads them)."""
    return [_binary(runtime), "image", "inspect", "--format", "{{json .RepoDigests}}", str(image)]


def parse_digest(output: str, image: ImageRef) -> str | None:
    """The `sha256:...` the image was pulled as, from `digest_argv`'s output (what a run
    records, so a moved tag cannot change what it ran)."""
    try:
        digests = json.loads(output.strip() or "null") or []
    except ValueError:
        return None
    written = f"{image.registry}/{image.path}" if image.registry else image.path
    names = {written, image.repository, f"{image.domain}/{image.repository}"}
    for entry in digests:
        name, _, digest = str(entry).partition("@")
        if digest and name in names:
            return digest
    return None


def ps_argv(runtime: Runtime, run_id: str) -> list[str]:
    """The run's containers, running or not (`NAME STATE` lines): status, stop, leftovers."""
    return [
        _binary(runtime),
        "ps",
        "-a",
        "--filter",
        f"label={LABEL_RUN}={run_id}",
        "--format",
        "{{.Names}} {{.State}}",
    ]


def parse_ps(output: str) -> list[tuple[str, str]]:
    """`ps_argv`'s lines as (name, state): `running`, `exited`, `created`..."""
    found = []
    for line in output.splitlines():
        name, _, state = line.strip().partition(" ")
        if name:
            found.append((name, state.strip() or "unknown"))
    return found


def stop_argv(runtime: Runtime, name: str, grace: int) -> list[str]:
    return [_binary(runtime), "stop", "-t", str(grace), name]


def rm_argv(runtime: Runtime, name: str) -> list[str]:
    return [_binary(runtime), "rm", "-f", name]


# -- Slurm: the step's container ------------------------------------------------------------


@dataclass(frozen=True)
class SlurmContainer:
    """What the job script adds for a containerised step: `directives` (`#SBATCH` options),
    `srun` (options of the step's srun), `prefix` (words before the step's command, run on
    each node), and `runner`: the host-side script the prefix goes to, where there is one."""

    directives: tuple[str, ...] = ()
    srun: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()
    runner: str | None = None


def _binds(spec: ContainerSpec) -> str:
    return ",".join([f"{spec.workdir}:{spec.workdir}", *(str(m) for m in spec.mounts)])


def _pyxis(runtime: Runtime, spec: ContainerSpec) -> SlurmContainer:
    assert isinstance(spec.image, ImageRef)
    return SlurmContainer(
        srun=(
            f"--container-image={spec.image.enroot()}",
            f"--container-mounts={_binds(spec)}",
            f"--container-workdir={spec.workdir}",
            # one import per node, reused by a requeue (one name for every node of the step)
            f"--container-name={spec.name.rsplit('-', 1)[0]}",
        )
    )


def _apptainer(runtime: Runtime, spec: ContainerSpec) -> SlurmContainer:
    image = spec.image.docker_uri() if isinstance(spec.image, ImageRef) else str(spec.image)
    gpus = runtime.gpus if spec.gpus else ()
    return SlurmContainer(
        prefix=("apptainer", "exec", *gpus, "--bind", _binds(spec), "--pwd", spec.workdir, image)
    )


def _shifter(runtime: Runtime, spec: ContainerSpec) -> SlurmContainer:
    volumes = tuple(f"--volume={m}" for m in spec.mounts)
    gpus = runtime.gpus if spec.gpus else ()
    return SlurmContainer(
        directives=(f"--image=docker:{spec.image}",), prefix=("shifter", *gpus, *volumes)
    )


def _engine(runtime: Runtime, spec: ContainerSpec, grace: int) -> SlurmContainer:
    """container_run.sh's arguments, its NAME the run's (`vmrun-RUN`): one step has several
    tasks on a node (env: one per rank), and the job script adds `-$SLURM_PROCID` to it,
    and the `vmrun.node` label, where each task starts."""
    base = spec.name.rsplit("-", 1)[0]
    options = run_options(runtime, spec, node_label=False)
    return SlurmContainer(prefix=(_binary(runtime), base, str(grace), *options), runner=RUNNER)


_SLURM_BUILDERS: dict[str, Callable[[Runtime, ContainerSpec], SlurmContainer]] = {
    "pyxis": _pyxis,
    "apptainer": _apptainer,
    "shifter": _shifter,
}


def slurm_container(runtime: Runtime, spec: ContainerSpec, grace: int = 10) -> SlurmContainer:
    """The step's container on a cluster, once `check` has passed (`grace`: the seconds
    docker/podman's stop waits). Every prefix ends where the step's command follows."""
    check(runtime, spec, SLURM)
    bare = replace(spec, command=())
    if runtime.name in ("docker", "podman"):
        return _engine(runtime, bare, grace)
    return _SLURM_BUILDERS[runtime.name](runtime, bare)
