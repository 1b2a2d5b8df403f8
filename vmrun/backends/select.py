"""From what the user selected to an open backend: `-C NAME` is that cluster (its login node
opened once), else `-H` hosts and `@group`s (None: the project's hosts), each opened once.
Every operation that acts on a run goes through here, so a third backend is one more branch
here (and a pass of tests/test_backend_contract.py), not one in every command."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from vmrun.backends.api import Backend, Capabilities, Prepared, RunRef, StartOptions
from vmrun.config import Settings

if TYPE_CHECKING:
    from vmrun.backends.hosts.node_launch import Placement
    from vmrun.backends.slurm.job import JobSpec
    from vmrun.gpus.targets import Target as GpuTarget
    from vmrun.notify.send import Notify
    from vmrun.reporting import Reporter
    from vmrun.runs.plan import Plan
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import HostEntry
    from vmrun.transfer.types import Progress


Kind = Literal["local", "hosts", "cluster"]


class Training(Protocol):
    """`train` on any target, one flow: `prepare` (what --dry-run prints, nothing sent) or
    `start`, then `detached` (how to follow it later) or `follow_and_tell` (follow it to its
    end, telling the end to `notify`'s targets; a failure raises, told first). The peers:
    vmrun.backends.local.backend.LocalBackend, hosts.training.HostsTraining,
    slurm.session.SlurmTraining."""

    capabilities: Capabilities

    def prepare(self, plan: Plan, how: StartOptions | None = None) -> Prepared: ...

    def start(
        self, plan: Plan, how: StartOptions, out: Reporter, progress: Progress | None = None
    ) -> RunRef: ...

    def detached(self, ref: RunRef) -> str: ...

    def follow_and_tell(
        self, ref: RunRef, notify: Notify | None, out: Reporter, *, verbose: bool = False
    ) -> int: ...


@dataclass(frozen=True)
class Target:
    """Where a command works, read once from `--local`, `-H ...` and `-C NAME`: this
    machine, SSH hosts (`hosts` None: the project's), or a Slurm cluster by name."""

    kind: Kind = "hosts"
    hosts: tuple[str, ...] | None = None
    cluster: str | None = None

    @classmethod
    def of(
        cls, *, local: bool = False, hosts: Sequence[str] | None = None, cluster: str | None = None
    ) -> Target:
        """The target the flags name (-C over --local over -H; the refusals turned away
        the flags that name two places already)."""
        if cluster:
            return cls("cluster", cluster=cluster)
        if local:
            return cls("local")
        return cls("hosts", hosts=tuple(hosts) if hosts else None)

    @classmethod
    def recorded(cls, where: Mapping[str, Any]) -> Target:
        """The target a record keeps (a sweep's `where`: {"local": true}, {"cluster":
        NAME} or {"hosts": [...] or null})."""
        hosts = where.get("hosts")
        return cls.of(local=bool(where.get("local")), hosts=hosts, cluster=where.get("cluster"))

    def record(self) -> dict[str, Any]:
        """The target as a record keeps it (`recorded` reads it back)."""
        kept: dict[str, dict[str, Any]] = {
            "local": {"local": True},
            "cluster": {"cluster": self.cluster},
            "hosts": {"hosts": self.host_list},
        }
        return kept[self.kind]

    @property
    def capabilities(self) -> Capabilities:
        return capabilities_of(self.kind)

    @property
    def host_list(self) -> list[str] | None:
        """-H's hosts as the host selection takes them (None: the project's)."""
        return list(self.hosts) if self.hosts else None


def capabilities_of(kind: Kind) -> Capabilities:
    """What the backend of `kind` declares it can do (its package's CAPABILITIES; the
    backend itself is not imported)."""
    import importlib

    package = {"cluster": "slurm", "local": "local", "hosts": "hosts"}[kind]
    declared = importlib.import_module(f"vmrun.backends.{package}").CAPABILITIES
    assert isinstance(declared, Capabilities)
    return declared


def one_place(
    hosts: Sequence[object] | None, cluster: str | None, says: str = "", code: str = "usage"
) -> None:
    """-C and -H name different places to work; one command works in one (`says`: the
    command's own words for it)."""
    if cluster and hosts:
        from vmrun.errors import UsageError

        raise UsageError(says or f"-C {cluster} and -H both say where to work: use one", code=code)


def target_entries(
    target: Target, settings: Settings, hosts: Sequence[str | HostEntry] | None = None
) -> list[HostEntry]:
    """The machines a command on `target` reaches: a cluster's (its login node first), else
    the hosts (`hosts`: as given, entries kept as they are; None: the project's)."""
    if target.kind == "cluster":
        from vmrun.backends.slurm.cluster import find_cluster

        return find_cluster(settings, str(target.cluster)).entries
    from vmrun.ssh.inventory import HostEntry, select_hosts

    if hosts and all(isinstance(h, HostEntry) for h in hosts):
        return [h for h in hosts if isinstance(h, HostEntry)]
    return select_hosts([h for h in hosts or () if isinstance(h, str)], settings)


def landing(target: Target, settings: Settings, group: Group, to: str | None) -> tuple[str, str]:
    """Where data pushed to `target` lands (`to` under the project's folder there, by
    default that folder) and the Python a copy from a bucket runs with there ("": each
    host's recorded one): on hosts their work directory; on a cluster its shared
    filesystem, through the login node (on `group`'s connection)."""
    from pathlib import Path

    from vmrun.remote_paths import remote_workdir
    from vmrun.transfer.manifest import normalize_remote

    project = settings.project_dir or Path.cwd()
    if target.kind == "cluster":
        from vmrun.backends.slurm.backend import SlurmBackend
        from vmrun.backends.slurm.cluster import find_cluster

        cluster = find_cluster(settings, str(target.cluster))
        login = SlurmBackend(group.connections[cluster.entry.label], cluster)
        base, words, python = login.code_dir(project), "the cluster's project folder", ""
        python = login.python()
    else:
        base, words, python = remote_workdir(project), "the project's work directory", ""
    return (base if to is None else normalize_remote(to, base=base, where=words)), python


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


@contextmanager
def open_training(
    target: Target,
    settings: Settings,
    *,
    entries: Sequence[HostEntry] | None = None,
    group: Group | None = None,
    place: Placement | None = None,
    spec: JobSpec | None = None,
    fetch_every: float | None = None,
    on_start: Callable[[RunRef], None] | None = None,
    verbose: bool = False,
) -> Iterator[Training]:
    """The target open for a run (`train`, a sweep's size), until the block ends: this
    machine; the hosts (`entries`, else -H's; over `group` where the caller opened it,
    with `place`'s wiring, `fetch_every`, and `on_start` told the started run); or the
    cluster (`spec`: its sbatch options)."""
    if target.kind == "local":
        from vmrun.backends.local.backend import LocalBackend

        yield LocalBackend(settings, verbose=verbose, on_start=on_start)
    elif target.kind == "cluster":
        from vmrun.backends.slurm.session import SlurmTraining, cluster_backend

        with cluster_backend(settings, str(target.cluster), spec) as backend:
            yield SlurmTraining(backend)
    else:
        from vmrun.backends.hosts.node_launch import Placement
        from vmrun.backends.hosts.preflight import order
        from vmrun.backends.hosts.training import HostsTraining
        from vmrun.ssh.group import Group
        from vmrun.ssh.inventory import select_hosts

        chosen = list(entries) if entries is not None else select_hosts(target.host_list, settings)
        wiring = (place or Placement()).wiring
        with group or Group(order(chosen, wiring), settings) as conns:
            yield HostsTraining(conns, chosen, settings, place, fetch_every, on_start)


def listed_targets(
    settings: Settings,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    or_hosts: bool = True,
) -> list[Target]:
    """The places a command over recorded runs looks in (`status`, `history`): -C's cluster;
    -H's hosts (or $VMRUN_HOSTS's); with neither, the project's hosts (where it has some;
    `or_hosts`: also where it has no cluster either, to say it has no hosts) and every
    cluster in vmrun.toml."""
    import os

    if cluster:
        return [Target("cluster", cluster=cluster)]
    if hosts or os.environ.get("VMRUN_HOSTS", "").strip():
        return [Target.of(hosts=hosts)]
    from vmrun.backends.slurm.cluster import project_clusters
    from vmrun.ssh.inventory import project_hosts

    names = [c.name for c in project_clusters(settings)]
    here = [Target()] if project_hosts(settings) or (or_hosts and not names) else []
    return [*here, *(Target("cluster", cluster=name) for name in names)]


@dataclass
class Listed:
    """What one place's runs are, as `status` shows them: its runs (`RunRow`s), the nodes
    that did not answer (`failed`: (host, cluster, why)), what the autostop watchdog says
    on each host that has one, and `down`: why the place as a whole did not answer."""

    rows: list[Any]
    failed: list[tuple[str | None, str | None, BaseException]]
    autostop: dict[str, str]
    down: BaseException | None = None


def list_runs_on(target: Target, settings: Settings, *, watchdog: bool = True) -> Listed:
    """Every run recorded on `target` (`runs`); on hosts, with one round trip each, what
    their autostop watchdog says too (`watchdog`: asked)."""
    from vmrun.errors import VmrunError

    if target.kind == "cluster":
        name = str(target.cluster)
        try:
            with open_backend(settings, cluster=name) as backend:
                jobs, failed = backend.runs()
        except VmrunError as exc:
            return Listed([], [], {}, down=exc)
        return Listed(list(jobs), [(None, name, exc) for exc in failed], {})
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    listed = Listed([], [], {})
    with Group(select_hosts(target.host_list, settings), settings) as group:
        for outcome in group.map(lambda e, conn: _host_listing(conn, watchdog)):
            if outcome.error is not None:
                listed.failed.append((outcome.host, None, outcome.error))
                continue
            found, state = outcome.value or ([], None)
            listed.rows += found
            if state is not None and state.installed:
                listed.autostop[outcome.host] = state.short()
    return listed


def _host_listing(conn: Any, watchdog: bool) -> tuple[list[Any], Any]:
    """A host's runs and, on a second channel of the same connection at the same time, what
    its autostop watchdog says (None: not asked, or unreadable): one round trip, not two."""
    from concurrent.futures import ThreadPoolExecutor

    from vmrun.autostop.watchdog import read_status
    from vmrun.backends.hosts.records import list_runs
    from vmrun.errors import VmrunError

    conn.open()  # one dial for both
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read_status, conn) if watchdog else None
        runs = list_runs(conn)
        try:
            return runs, reading.result() if reading else None
        except VmrunError:
            return runs, None


def door_entries(target: Target, settings: Settings) -> list[HostEntry]:
    """The machines a connection into `target` goes through: a cluster's login node alone
    (its nodes are reached from there), else the hosts (None: the project's)."""
    if target.kind == "cluster":
        from vmrun.backends.slurm.cluster import find_cluster

        return [find_cluster(settings, str(target.cluster)).entry]
    from vmrun.ssh.inventory import select_hosts

    return select_hosts(target.host_list, settings)


@contextmanager
def watched_gpus(
    target: Target,
    settings: Settings,
    hosts: Sequence[str | HostEntry] | None = None,
    *,
    run: str | None = None,
    job: str | None = None,
) -> Iterator[list[GpuTarget] | None]:
    """What `watch` samples on `target`: each host's GPUs (`hosts`: as given, None: the
    project's), or those of the nodes a cluster's running job holds (`run`'s, `job`'s, else
    the user's), reached through its login connection, open for the block. None: no such
    job runs there."""
    if target.kind == "cluster":
        from vmrun.backends.slurm.gpus import node_targets, running_nodes
        from vmrun.backends.slurm.session import cluster_backend

        with cluster_backend(settings, str(target.cluster)) as slurm:
            nodes = running_nodes(slurm, run, job)
            yield node_targets(slurm, nodes) if nodes else None
        return
    from vmrun.gpus.targets import host_targets

    yield host_targets(target_entries(target, settings, hosts), settings)
