"""A command's way onto a cluster: `-C NAME` found in vmrun.toml, its login node opened
once (one connection for every verb the command uses)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster, find_cluster
from vmrun.backends.slurm.job import JobSpec
from vmrun.config import Settings
from vmrun.ssh.group import Group


@contextmanager
def cluster_backend(
    settings: Settings, name: str, spec: JobSpec | None = None
) -> Iterator[SlurmBackend]:
    cluster = find_cluster(settings, name)
    with Group(cluster.entries, settings) as group:
        yield backend_in(group, cluster, spec)


def backend_in(group: Group, cluster: Cluster, spec: JobSpec | None = None) -> SlurmBackend:
    """The cluster's backend over the group's connections (its `entries`): the login node,
    and every node by label where the cluster has no shared folder."""
    return SlurmBackend(group.connections[cluster.entry.label], cluster, spec, group=group)
