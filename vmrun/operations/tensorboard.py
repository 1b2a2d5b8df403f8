"""Where a run's TensorBoard goes: the node that has the run's files (a multi-node run's
master; on a cluster, the login node, over the shared filesystem), open while the caller
serves it there (vmrun.runs.tensorboard) or fetches its event files (--local)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vmrun.config import Settings
from vmrun.runs.outputs import RunLocation
from vmrun.ssh.connection import Connection


@dataclass(frozen=True)
class Place:
    """The node that has a run's files, and what TensorBoard needs to know there."""

    conn: Connection
    run_id: str
    python: str
    meta: Any
    location: RunLocation
    fix: str  # how to get tensorboard into that python


@contextmanager
def place(
    settings: Settings,
    run: str | None = None,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
) -> Iterator[Place]:
    """The run (the newest unless named) and the node with its files: a multi-node run's
    master; on a cluster, the login node (the files are on the shared filesystem)."""
    if cluster:
        from vmrun.backends.slurm.session import cluster_backend

        with cluster_backend(settings, cluster) as slurm:
            ref = slurm.find(run)
            fix = f"`vmrun setup -C {cluster} --pip tensorboard`"
            yield Place(slurm.conn, ref.run_id, slurm.python(), ref.meta,
                        slurm.outputs(ref)[cluster], _fix(fix, ref.run_id))  # fmt: skip
        return
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(hosts, settings)
    with Group(entries, settings) as group:
        backend = HostsBackend(group)
        ref = backend.find(run)
        node = str(ref.meta.get("master") or ref.nodes[0])
        if node not in ref.records:
            node = ref.nodes[0]
        meta = ref.records[node].meta
        fix = f"`vmrun setup --pip tensorboard -H {node}`"
        yield Place(backend.conn(node), ref.run_id, str(meta.get("python") or "python3"),
                    meta, backend.outputs(ref)[node], _fix(fix, ref.run_id))  # fmt: skip


def _fix(setup: str, run_id: str) -> str:
    return (
        f"install it with {setup}, or view the run from here: `vmrun tensorboard {run_id} --local`"
    )
