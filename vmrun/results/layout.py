"""A run's shape (where, launcher, nodes, processes, world size, epochs asked) from its
run.json, whichever of the three forms it has.

Each place that runs a run writes its own record: SSH hosts (vmrun.backends.hosts.backend:
`nodes` is the list of host labels, `nproc` a string that may be `gpu`), a Slurm cluster
(vmrun.backends.slurm.backend: `cluster`, `nodes` a count, `nproc_per_node`, `world_size`, `epochs`)
and `train --local` (vmrun.runs.local: `nproc`, `start_time`, `argv`). Reports compare
runs of all three, so they are read into one value here, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HOSTS, CLUSTER, LOCAL = "hosts", "cluster", "local"


@dataclass(frozen=True)
class RunLayout:
    """None wherever the record does not say (and the metrics did not tell either)."""

    where: str  # HOSTS, CLUSTER, LOCAL, or "" when there is no record
    hosts: tuple[str, ...] = ()
    cluster: str | None = None
    launcher: str | None = None
    nodes: int | None = None
    procs_per_node: int | None = None
    world_size: int | None = None
    epochs_asked: int | None = None


def count(value: Any) -> int | None:
    """A positive whole number from a record's field (`"2"`, 2), else None (`"gpu"`, null)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value) or None
    return None


def where_of(meta: Mapping[str, Any]) -> str:
    if not meta:
        return ""
    if meta.get("cluster") or isinstance(meta.get("nodes"), int):
        return CLUSTER
    if isinstance(meta.get("nodes"), list) or "host" in meta:
        return HOSTS
    return LOCAL


def layout_of(meta: Mapping[str, Any], *, world_size: int | None = None) -> RunLayout:
    """The record's shape; `world_size`, when the run's metrics report it, is the truth
    (a `python` launcher's script spawns as many workers as it likes)."""
    where = where_of(meta)
    launcher = meta.get("launcher") if isinstance(meta.get("launcher"), str) else None
    hosts: tuple[str, ...] = ()
    if where == CLUSTER:
        nodes = count(meta.get("nodes"))
        procs = count(meta.get("nproc_per_node"))
        world_size = world_size or count(meta.get("world_size"))
    elif where == HOSTS:
        listed = meta.get("nodes")
        hosts = tuple(str(n) for n in listed) if isinstance(listed, list) else ()
        if not hosts and meta.get("host"):
            hosts = (str(meta["host"]),)
        nodes = len(hosts) or count(meta.get("nnodes"))
        procs = count(meta.get("nproc"))
    else:
        nodes = 1 if where == LOCAL else None
        procs = count(meta.get("nproc"))
    if launcher == "python":  # mp.spawn: the script decides, its metrics alone tell
        procs = None
    if procs is None and world_size and nodes and world_size % nodes == 0:
        procs = world_size // nodes
    if world_size is None and nodes and procs:
        world_size = nodes * procs
    return RunLayout(
        where=where,
        hosts=hosts,
        cluster=str(meta["cluster"]) if where == CLUSTER and meta.get("cluster") else None,
        launcher=launcher,
        nodes=nodes,
        procs_per_node=procs,
        world_size=world_size,
        epochs_asked=epochs_asked(meta),
    )


def epochs_asked(meta: Mapping[str, Any]) -> int | None:
    """The template's epoch count (its first argument); a SCRIPT's own count is unknown."""
    if count(meta.get("epochs")):
        return count(meta.get("epochs"))
    if not meta.get("template"):
        return None
    args = meta.get("args")
    if not isinstance(args, list):  # an older --local record: the script's argument in argv
        argv = meta.get("argv")
        script = meta.get("script")
        if not isinstance(argv, list) or script not in argv:
            return None
        args = argv[argv.index(script) + 1 :]
    return count(args[0]) if args else None
