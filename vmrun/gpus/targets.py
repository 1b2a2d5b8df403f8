"""What the fleet watch streams: one target per row group, each a command on a connection.
A host is its own connection running the watch script; `vmrun.backends.slurm.gpus` makes Slurm nodes
targets that share the login node's connection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from vmrun.config import Settings
from vmrun.errors import ConfigError
from vmrun.gpus.nvidia_smi import watch_argv
from vmrun.remote_paths import AUTOSTOP_STATE
from vmrun.ssh import pool
from vmrun.ssh.connection import Connection
from vmrun.ssh.inventory import HostEntry


@dataclass(frozen=True)
class Target:
    """What one watcher streams: a row group's label, the connection to run on, and the
    watch command for an interval (None: one reading). `shared`: the connection serves other
    targets too (Slurm nodes reached through one login node), so only the watch closes it."""

    label: str
    conn: Connection
    command: Callable[[float | None], list[str]]
    shared: bool = False
    nvidia_smi: str | None = None  # where the host's GPU health is read (None: not read)


def host_targets(entries: Sequence[HostEntry], settings: Settings) -> list[Target]:
    """One connection per host, running the watch script there."""
    targets = []
    for entry in entries:
        nvidia_smi = nvidia_smi_for(entry)
        conn = pool.connection(entry.spec, settings, entry.label)
        command = partial(watch_argv, nvidia_smi, autostop_state=AUTOSTOP_STATE)
        targets.append(Target(entry.label, conn, command, nvidia_smi=nvidia_smi))
    return targets


def nvidia_smi_for(entry: HostEntry) -> str:
    """The host's `nvidia_smi` override from vmrun.toml, else `nvidia-smi` on the PATH."""
    value = entry.vars.get("nvidia_smi", "nvidia-smi")
    if not isinstance(value, str) or not value:
        raise ConfigError(f"host {entry.label}: nvidia_smi must be a path to nvidia-smi")
    return value
