"""What a training run is, decided before anything starts (a Plan), shared by local and
remote runs. Bad input fails here with a one-line UsageError, and nothing is started.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.containers.request import Asked
from vmrun.errors import UsageError, VmrunError

if TYPE_CHECKING:
    from vmrun.store_url import StoreURL
    from vmrun.stores.access import Access

DEFAULT_EPOCHS = 10
DEFAULT_SAVE_EVERY = 5
CPU_PROCESSES = 2  # default world size without CUDA: small, but a real multi-process DDP run
STOP_GRACE_S = 10.0
# `docker stop`'s wait for a run in a container: less than the stop's own, so the container
# is stopped and removed by its script (hostside/container_run.sh) before the stop kills it
CONTAINER_STOP_GRACE = max(1, int(STOP_GRACE_S) - 3)
# torch's version and CUDA device count; a CPU build's version is read from its version.py
# and it sees no GPU (hostside/run_provenance.py: cpu_build), any other build is imported.
_TORCH_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from run_provenance import cpu_build
version, gpus = cpu_build(), 0
if version is None:
    import torch
    version, gpus = torch.__version__, torch.cuda.device_count()
print(version)
print(gpus)
"""
_PIN_HINT = (
    "install it: without an NVIDIA GPU, `pip install torch --index-url"
    " https://download.pytorch.org/whl/cpu` (PyPI's Linux torch, pinned or not, is the"
    " multi-GB CUDA build); with one, `pip install torch`"
)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Plan:
    """Everything decided before anything starts: bad input fails here, with nothing run."""

    script: Path
    is_template: bool
    name: str
    args: list[str]
    launcher: str
    nproc: str | None
    max_restarts: int
    env: dict[str, str]
    project: Path
    containers: Asked = field(default_factory=Asked)  # --image, --mount and their settings
    # --data PATH[:DIR] (or s3://BUCKET/PREFIX[:DIR]): on the nodes before the run
    data: tuple[tuple[Path | StoreURL, str | None], ...] = ()
    store_access: Access | None = None  # who reads or writes the buckets (never recorded)
    store: StoreURL | None = None  # --store: the run's outputs go to STORE/RUN_ID as written
    recover: bool = False  # --recover: its nodes watch for a cloud's notice (spot_watch.py)
    hang_timeout: int = 0  # seconds without progress that make it hung (0: not watched)
    on_hang: str = "wait"  # what then: wait, or stop (hostside/hang_watch.py)
    max_cost: float = 0.0  # --max-cost: at this cost it snapshots and stops (0: no cap)

    def hang_watch(self) -> str:
        """A Slurm job's hang setting (`SECONDS ACTION RANKED`), "" when not watched:
        RANKED, torchrun's ranks' lines carry their prefix (its banner is not progress)."""
        if not self.hang_timeout:
            return ""
        return f"{self.hang_timeout} {self.on_hang} {int(self.launcher == 'torchrun')}"


def make_plan(
    *,
    script: str | None,
    user_args: list[str] | None,
    epochs: int | None,
    save_every: int | None,
    nproc_per_node: str | None,
    max_restarts: int,
    env: list[str] | None,
    name: str | None,
    batch_size: int | None,
    lr: float | None,
    launcher: str,
    task: str | None = None,
    containers: Asked | None = None,
    data: list[str] | None = None,
    store_credentials: str = "auto",
    store: str = "",
    fsdp: bool = False,
) -> Plan:
    """Validate every flag; raise UsageError (exit 2) before anything is started."""
    from vmrun.config import find_project_dir
    from vmrun.runs import launch
    from vmrun.ssh.envvars import parse_env
    from vmrun.trainer import TEMPLATE_NAME, TEMPLATE_PATH

    launch.check_launcher(launcher)
    if script is None:
        path, is_template = TEMPLATE_PATH, True
    else:
        path, is_template = Path(script).expanduser().absolute(), False
        if not path.is_file():
            raise UsageError(f"script {script}: no such file", code="script-not-found")
    template_options = (
        ("--batch-size", batch_size),
        ("--lr", lr),
        ("--task", task),
        ("--fsdp", fsdp or None),
    )
    template_only = [flag for flag, value in template_options if value is not None]
    if not is_template and template_only:
        raise UsageError(
            f"{' and '.join(template_only)} are the template trainer's options, not your"
            f" script's; pass your script's own arguments after -- (`vmrun train {script} --"
            " --lr 0.1`)"
        )
    if user_args:
        given = [
            flag
            for flag, value in (
                ("--epochs", epochs),
                ("--save-every", save_every),
                ("--batch-size", batch_size),
                ("--lr", lr),
                ("--task", task),
                ("--fsdp", fsdp or None),
            )
            if value is not None
        ]
        if given:
            raise UsageError(
                f"{', '.join(given)} cannot be combined with script args after --;"
                " put them after -- in the form the script expects"
            )
    args = launch.script_args(
        DEFAULT_EPOCHS if epochs is None else epochs,
        DEFAULT_SAVE_EVERY if save_every is None else save_every,
        user_args,
    )
    args += _template_args(batch_size, lr, task) + (["--fsdp"] if fsdp else [])
    if launcher == "torchrun":
        nproc = None if nproc_per_node is None else launch.check_nproc_per_node(nproc_per_node)
        if max_restarts < 0:
            raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    else:
        if nproc_per_node is not None or max_restarts:
            raise UsageError(
                f"--nproc-per-node and --max-restarts are torchrun's; --launcher {launcher}"
                " starts one process"
            )
        nproc = None
    env_map = parse_env(env)
    data_specs = tuple(parse_data(text) for text in data or ())
    from vmrun.store_url import parse_store

    store_url = parse_store(store) if store else None
    containers = containers or Asked()
    containers.check()
    run_name = (
        launch.check_run_name(name)
        if name is not None
        else (TEMPLATE_NAME if is_template else launch.name_from_script(path.stem))
    )
    return Plan(
        script=path,
        is_template=is_template,
        name=run_name,
        args=args,
        launcher=launcher,
        nproc=nproc,
        max_restarts=max_restarts,
        env=env_map,
        project=find_project_dir() or Path.cwd(),
        data=data_specs,
        store_access=data_access(data_specs, store_credentials, store_url),
        store=store_url,
        containers=containers,
    )


def _template_args(batch_size: int | None, lr: float | None, task: str | None) -> list[str]:
    """The template's own options, checked, as its command line takes them."""
    from vmrun.trainer import TEMPLATE_TASKS

    args: list[str] = []
    if batch_size is not None:
        if batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
        args += ["--batch-size", str(batch_size)]
    if lr is not None:
        if not lr > 0:
            raise UsageError(f"--lr must be > 0, got {lr}")
        args += ["--lr", repr(lr)]
    if task is not None:
        if task not in TEMPLATE_TASKS:
            raise UsageError(f"--task must be {' or '.join(TEMPLATE_TASKS)}, got {task!r}")
        args += ["--task", task]
    return args


def probe_torch(python: str, env: dict[str, str]) -> int:
    """Ask a child (torch is never imported here) for torch's CUDA device count."""
    from vmrun.hostside import HERE

    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE, str(HERE)],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VmrunError(f"cannot run {python} to check for torch: {exc}") from None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) < 2 or not lines[-1].isdigit():
        errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
        why = errors[-1].strip() if errors else f"exit status {done.returncode}"
        raise VmrunError(f"torch is not importable by {python} ({why})", hint=_PIN_HINT)
    return int(lines[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def data_access(
    data: Sequence[tuple[Path | StoreURL, str | None]], mode: str, store: StoreURL | None = None
) -> Access | None:
    """Who the nodes read a --data bucket (and write --store's) with, found before anything
    starts (None: no bucket at all)."""
    from vmrun.store_url import StoreURL

    if store is None and not any(isinstance(source, StoreURL) for source, _ in data):
        return None
    from vmrun.stores.access import resolve

    return resolve(mode)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Temp file in the same directory, fsync, rename: readers never see half a record."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def parse_data(text: str) -> tuple[Path | StoreURL, str | None]:
    """`--data PATH[:DIR]`: a local file or folder, or a bucket prefix (s3://BUCKET/PREFIX),
    and where on the hosts it goes (DIR/<its name>; None: the project's work directory,
    where a script's `data/` is looked for). The last `:` splits only when what is before it
    exists here (a path may hold a `:`), or, after a bucket address, names a folder."""
    from vmrun.store_url import is_store, parse_store

    if is_store(text):
        scheme, _, rest = text.partition("://")
        head, sep, folder = rest.rpartition(":")
        if sep and head and folder:
            return parse_store(f"{scheme}://{head}"), folder
        return parse_store(text), None
    local, sep, remote = text.rpartition(":")
    where: str | None = None
    if sep and local and remote and Path(local).expanduser().exists():
        path, where = Path(local).expanduser(), remote
    else:
        path = Path(text).expanduser()
    if not path.exists():
        raise UsageError(f"--data {text}: {path} does not exist", code="source-not-found")
    if not (path.is_file() or path.is_dir()):
        raise UsageError(f"--data {text}: not a file or folder", code="source-not-found")
    return path.absolute(), where
