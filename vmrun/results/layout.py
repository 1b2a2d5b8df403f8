"""A run's shape (where, launcher, nodes, processes, world size, epochs asked) from its
record (vmrun.results.record, which reads each place's form of run.json): reports compare
runs of all three places, so their shapes are one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vmrun.results.record import CLUSTER, HOSTS, LOCAL, Job, RunRecord

__all__ = ["CLUSTER", "HOSTS", "LOCAL", "RunLayout", "count", "layout_of"]


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


def layout_of(record: RunRecord, *, world_size: int | None = None) -> RunLayout:
    """The record's shape; `world_size`, when the run's metrics report it, is the truth
    (a `python` launcher's script spawns as many workers as it likes)."""
    where = record.where
    launcher = record.launch.launcher or None
    hosts: tuple[str, ...] = ()
    if where == CLUSTER:
        job = record.job or Job()
        nodes = count(job.nodes)
        procs = count(job.nproc_per_node)
        world_size = world_size or count(job.world_size)
    elif where == HOSTS:
        hosts = record.hosts
        nodes = len(hosts) or count(record.launch.nnodes)
        procs = count(record.launch.nproc)
    else:
        nodes = 1 if where == LOCAL else None
        procs = count(record.launch.nproc)
    if launcher == "python":  # mp.spawn: the script decides, its metrics alone tell
        procs = None
    if procs is None and world_size and nodes and world_size % nodes == 0:
        procs = world_size // nodes
    if world_size is None and nodes and procs:
        world_size = nodes * procs
    return RunLayout(
        where=where,
        hosts=hosts,
        cluster=(record.cluster or None) if where == CLUSTER else None,
        launcher=launcher,
        nodes=nodes,
        procs_per_node=procs,
        world_size=world_size,
        epochs_asked=record.epochs_asked,
    )
