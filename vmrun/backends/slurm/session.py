"""A command's way onto a cluster: `-C NAME` found in vmrun.toml, its login node opened
once (one connection for every verb the command uses)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import find_cluster
from vmrun.backends.slurm.job import JobSpec
from vmrun.config import Settings
from vmrun.ssh.group import Group


@contextmanager
def cluster_backend(
    settings: Settings, name: str, spec: JobSpec | None = None
) -> Iterator[SlurmBackend]:
    cluster = find_cluster(settings, name)
    entry = cluster.entry
    with Group([entry], settings) as group:
        yield SlurmBackend(group.connections[entry.label], cluster, spec)
