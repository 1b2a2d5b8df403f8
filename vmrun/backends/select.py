"""From what the user selected to an open backend: `-C NAME` is that cluster (its login node
opened once), else `-H` hosts and `@group`s (None: the project's hosts), each opened once.
Every operation that acts on a run goes through here, so a third backend is one more branch
here (and a pass of tests/test_backend_contract.py), not one in every command."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from vmrun.backends.api import Backend
from vmrun.config import Settings

if TYPE_CHECKING:
    from vmrun.backends.hosts.node_launch import Placement
    from vmrun.backends.slurm.job import JobSpec
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import HostEntry


def one_place(hosts: Sequence[object] | None, cluster: str | None) -> None:
    """-C and -H name different places to work; one command works in one."""
    if cluster and hosts:
        from vmrun.errors import UsageError

        raise UsageError(f"-C {cluster} and -H both say where to work: use one")


def selected_entries(
    settings: Settings, *, hosts: list[str] | None = None, cluster: str | None = None
) -> list[HostEntry]:
    """The hosts to open: the cluster's login node, or -H's hosts (None: the project's)."""
    one_place(hosts, cluster)
    if cluster:
        from vmrun.backends.slurm.cluster import find_cluster

        return find_cluster(settings, cluster).entries
    from vmrun.ssh.inventory import select_hosts

    return select_hosts(hosts, settings)


def backend_on(
    group: Group,
    settings: Settings,
    *,
    cluster: str | None = None,
    spec: JobSpec | None = None,
    place: Placement | None = None,
) -> Backend:
    """The backend over connections the caller opened (`selected_entries`' hosts)."""
    if cluster:
        from vmrun.backends.slurm.cluster import find_cluster
        from vmrun.backends.slurm.session import backend_in

        return backend_in(group, find_cluster(settings, cluster), spec)
    from vmrun.backends.hosts.backend import HostsBackend

    return HostsBackend(group, place=place)


@contextmanager
def open_backend(
    settings: Settings,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    spec: JobSpec | None = None,
    place: Placement | None = None,
) -> Iterator[Backend]:
    """The backend, open until the block ends. `spec`: a cluster's sbatch options (for
    `start`); `place`: the hosts' multi-node wiring and what the caller checked already."""
    from vmrun.ssh.group import Group

    entries = selected_entries(settings, hosts=hosts, cluster=cluster)
    with Group(entries, settings) as group:
        yield backend_on(group, settings, cluster=cluster, spec=spec, place=place)
