"""A Slurm cluster as vmrun.toml declares it (`[[clusters]]`), and its login node as an SSH
host: everything vmrun honours for hosts (ssh_config, ProxyJump, strict host keys) applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vmrun.backends.slurm.job import word_problem
from vmrun.config import PROJECT_FILE, Settings
from vmrun.containers.request import table_of
from vmrun.errors import ConfigError, UsageError
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry, project_hosts
from vmrun.ssh.quoting import check_env_name

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
DEFAULT_WORKDIR = "~"


@dataclass(frozen=True)
class Cluster:
    """One `[[clusters]]` table: where to log in, and what every job there asks for."""

    name: str
    login: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    workdir: str = DEFAULT_WORKDIR  # on the shared filesystem; "{user}": the login user
    modules: tuple[str, ...] = ()
    python: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    sbatch_args: tuple[str, ...] = ()
    # its own image, mounts, container_runtime, container_ulimits (over the project's)
    containers: Mapping[str, Any] = field(default_factory=dict)
    price: float | None = None  # per node an hour (`price`), for what a run cost
    currency: str | None = None  # the price's; None: USD
    max_cost: float | None = None  # each run's --max-cost there, unless given
    nodes: tuple[str, ...] = ()  # the hosts vmrun made it of (`setup --slurm`); else ()
    # whether `workdir` is one folder every node sees; false (a cluster vmrun made of
    # `nodes` without one): each run's project is synced to every node, and its files stay
    # on the node its job ran on, read there over SSH
    shared: bool = True
    accounting: bool = False  # slurmdbd on its controller (`setup --slurm --slurmdbd`)

    @property
    def synced(self) -> bool:
        return not self.shared

    @property
    def entries(self) -> list[HostEntry]:
        """What a command opens: the login node; without a shared folder, every other node
        too (each reached directly, as `setup --slurm` reached it; opened on first use)."""
        login = parse_host(self.login).label
        others = [HostEntry(spec=parse_host(n)) for n in self.nodes if self.synced]
        return [self.entry, *(e for e in others if e.label != login)]

    @property
    def entry(self) -> HostEntry:
        """The login node as a host entry (named after the cluster, for messages)."""
        return HostEntry(spec=parse_host(self.login), name=self.name)


def project_clusters(settings: Settings) -> list[Cluster]:
    where = f"{settings.project_dir / PROJECT_FILE}" if settings.project_dir else PROJECT_FILE
    raw = settings.project_data.get("clusters", [])
    clusters: list[Cluster] = []
    made = any(isinstance(c, dict) and c.get("nodes") for c in raw)
    hosts = project_hosts(settings) if made else []
    for index, item in enumerate(raw, start=1):
        cluster = _addressed(_cluster(index, item, where), hosts)
        if any(c.name == cluster.name for c in clusters):
            raise ConfigError(f"cluster {cluster.name!r} appears twice in {where}")
        clusters.append(cluster)
    return clusters


def _cluster(index: int, item: Any, where: str) -> Cluster:
    if not isinstance(item, dict):
        raise ConfigError(f"cluster #{index} in {where} must be a [[clusters]] table")
    name, login = item.get("name"), item.get("login")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f'cluster #{index} in {where} needs name = "..." (letters, digits, . _ -)'
        )
    if not isinstance(login, str) or not login:
        raise ConfigError(f'cluster {name!r} in {where} needs login = "user@login-node"')
    try:
        parse_host(login)
    except UsageError as exc:
        raise ConfigError(f"cluster {name!r} in {where}: login: {exc.message}") from None
    here = f"cluster {name!r} in {where}"
    workdir = item.get("workdir", DEFAULT_WORKDIR)
    if word_problem(workdir):  # it goes into #SBATCH --chdir and --output
        raise ConfigError(f"{here}: workdir must be a path without spaces, got {workdir!r}")
    words = {key: item.get(key) for key in ("partition", "account", "qos")}
    words.update(_words(item, "modules"))
    words.update(_words(item, "sbatch_args"))
    for key, value in words.items():
        if value is not None and (problem := word_problem(value)):
            raise ConfigError(f"{here}: {key} {value!r} {problem}")
        if key.startswith("sbatch_args") and not str(value).startswith("-"):
            raise ConfigError(f"{here}: {key} {value!r} is not an sbatch option (e.g. --exclusive)")
    if item.get("shared") is False and not item.get("nodes"):
        raise ConfigError(f"{here}: shared = false needs nodes (the hosts its jobs run on)")
    python = item.get("python")
    if python is not None and _CONTROL.search(python):
        raise ConfigError(f"{here}: python must be a path, got {python!r}")
    return Cluster(
        name=name,
        login=login,
        partition=words["partition"],
        account=words["account"],
        qos=words["qos"],
        workdir=workdir,
        modules=tuple(item.get("modules", ())),
        python=python,
        env=_env(item.get("env", {}), here),
        sbatch_args=tuple(item.get("sbatch_args", ())),
        containers=table_of(item),
        price=item.get("price"),
        currency=item.get("currency"),
        max_cost=item.get("max_cost"),
        nodes=tuple(item.get("nodes", ())),
        shared=item.get("shared", True),
        accounting=item.get("accounting", False),
    )


def _addressed(cluster: Cluster, hosts: list[HostEntry]) -> Cluster:
    """A cluster vmrun made names its hosts as vmrun.toml does (`up`'s `NAME-0`...): each
    is reached at its recorded address, which changes when a VM starts again."""
    if not cluster.nodes:
        return cluster

    def address(word: str) -> str:
        found = [e for e in hosts if word == e.name]
        return found[0].spec.label if len(found) == 1 else word

    return replace(
        cluster, login=address(cluster.login), nodes=tuple(address(n) for n in cluster.nodes)
    )


def _words(item: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A list of words (`modules`, `sbatch_args`) as `key[i]` -> value, for the checks
    (vmrun.config has checked the types)."""
    return {f"{key}[{i}]": value for i, value in enumerate(item.get(key, []))}


def _env(table: Mapping[str, Any], here: str) -> dict[str, str]:
    """The jobs' variables: names a shell takes (each becomes `export NAME=...`)."""
    for key in table:
        try:
            check_env_name(key)
        except ValueError as exc:
            raise ConfigError(f"{here}: env: {exc}") from None
    return {k: str(v) for k, v in table.items()}


def find_cluster(settings: Settings, name: str) -> Cluster:
    """The cluster `-C NAME` means, or a one-line error listing the ones there are."""
    clusters = project_clusters(settings)
    for cluster in clusters:
        if cluster.name == name:
            return cluster
    known = ", ".join(c.name for c in clusters)
    where = settings.project_dir / PROJECT_FILE if settings.project_dir else PROJECT_FILE
    raise UsageError(
        f"-C {name}: no such cluster in {where}"
        + (f" (clusters: {known})" if known else "; add a [[clusters]] table with name and login"),
        code="cluster-not-found",
    )
