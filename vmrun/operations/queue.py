"""`vmrun setup -H a -H b --slurm NAME`: hosts set up as always, then made one Slurm cluster
(vmrun.queue) and recorded in vmrun.toml as `[[clusters]] NAME` with the controller as its
login node, so `train -C NAME`, `submit`, `sweep -C` and the rest work as on any cluster.
`--slurm-remove` takes it down again and forgets it.

    from vmrun.operations.queue import make_cluster
    done = make_cluster(settings, SetupRequest(), ["a", "b", "c"], "lab", shared="/srv/lab")
    print(done.made.states)   # {"a": "idle", ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.config import PROJECT_FILE, Settings
from vmrun.errors import UsageError
from vmrun.reporting import QUIET, Reporter

if TYPE_CHECKING:
    from vmrun.backends.slurm.cluster import Cluster
    from vmrun.operations.cloud import Up, UpAsk
    from vmrun.operations.setup import SetUp, SetupRequest
    from vmrun.queue.making import Made, Removed
    from vmrun.ssh.inventory import HostEntry


@dataclass(frozen=True)
class ClusterMade:
    """The hosts' setup, then the cluster (None when a host's setup failed: nothing made)."""

    setup: SetUp
    made: Made | None
    recorded_in: Path | None = None


def make_cluster(
    settings: Settings,
    request: SetupRequest,
    hosts: list[str] | None,
    name: str,
    *,
    controller: str | None = None,
    shared: str | None = None,
    accounting: bool = False,
    out: Reporter = QUIET,
) -> ClusterMade:
    """Set up `hosts` (None: the cluster's recorded nodes), then make them cluster `name`
    with `controller` (default: the first host, or the recorded one) running slurmctld.
    `shared`: a folder every host sees, the jobs' workdir (checked); None: each run's
    project is synced to every node and its files stay on the node it ran on.
    `accounting`: slurmdbd and MariaDB on the controller (sacct); once asked, it stays."""
    from vmrun.operations.setup import setup
    from vmrun.queue.conf import check_name
    from vmrun.queue.making import check, make

    check_name(name)
    known = _recorded(settings, name)
    if not hosts and known is None:
        raise UsageError(
            f"--slurm {name}: give its hosts with -H (it is not in vmrun.toml yet)", code="no-hosts"
        )
    words = hosts or list(known.nodes if known else ())
    if shared is not None and not shared.startswith("/"):
        raise UsageError(f"--shared {shared}: give an absolute path")
    if shared is None and known is not None and known.shared and known.nodes:
        shared = known.workdir  # as it was made (a cluster changes its folder by remaking)
    if shared is not None and known is not None and known.nodes and not known.shared:
        raise UsageError(
            f"--shared {shared}: cluster {name} was made without a shared folder; to give it"
            " one, --slurm-remove it and make it again",
            code="flags-conflict",
        )
    entries = _entries(settings, words)
    ctl = _controller(settings, entries, controller, known)
    if known is not None and known.nodes and ctl.spec.label != known.login:
        raise UsageError(
            f"--controller {ctl.label}: cluster {name}'s controller is {known.login}, whose"
            " state holds the queue; to move it, --slurm-remove the cluster and make it again",
            code="flags-conflict",
        )
    accounting = accounting or bool(known and known.accounting)
    # a host that cannot be a node, a folder not shared: refused before the hosts' setup
    facts = check(settings, name, entries, ctl, shared, accounting)
    done = setup(settings, request, words, record=True, out=out)
    if done.failed or request.dry_run:
        return ClusterMade(done, None)
    dropped = []
    if known is not None:
        given = {e.spec.label for e in entries}
        dropped = [e for e in _entries(settings, list(known.nodes)) if e.spec.label not in given]
    python = next(
        (
            o.value.python
            for e, o in zip(done.entries, done.outcomes, strict=True)
            if e.label == ctl.label and o.value is not None
        ),
        "",
    )
    project = settings.project_dir or Path.cwd()
    # recorded first: a cluster half made (a node that never comes up) is one that
    # --slurm-remove knows and takes down; the nodes left out are kept until they are out
    _record(settings, project, name, ctl, [*entries, *dropped], shared, python, accounting)
    made = make(
        settings,
        name,
        entries,
        ctl,
        shared=shared,
        dropped=dropped,
        facts=facts,
        accounting=accounting,
        out=out,
    )  # facts from before the setup: Slurm's
    if dropped:  # files are untouched by it
        _record(settings, project, name, ctl, entries, shared, python, accounting)
    return ClusterMade(done, made, project / PROJECT_FILE)


def up_cluster(
    settings: Settings, ask: UpAsk, request: SetupRequest, out: Reporter = QUIET
) -> tuple[Up, ClusterMade]:
    """`vmrun up NAME --slurm`: the VMs as `up` makes them (hosts @NAME), then their setup
    (`[setup]` in vmrun.toml says how) and one Slurm cluster NAME of them, without a shared
    folder: the project goes to every node. Their private addresses are the nodes'. A
    cluster already made is made again, which changes nothing."""
    from dataclasses import replace

    from vmrun.config import read_toml
    from vmrun.operations.cloud import up

    done = up(settings, ask, out)
    path = done.project_file or (settings.project_dir or Path.cwd()) / PROJECT_FILE
    fresh = replace(settings, project_dir=path.parent, project_data=read_toml(path, project=True))
    return done, make_cluster(fresh, request, [f"@{ask.name}"], ask.name, out=out)


def remove_cluster(settings: Settings, name: str, hosts: list[str] | None) -> Removed:
    """Take down the cluster vmrun made of hosts, and forget it in vmrun.toml."""
    from vmrun.queue.making import remove
    from vmrun.ssh.inventory import forget_table

    known = _recorded(settings, name)
    if known is None or not known.nodes:
        raise UsageError(
            f"--slurm-remove: vmrun.toml has no cluster {name} that vmrun made of hosts",
            code="cluster-not-found",
        )
    entries = _entries(settings, list(known.nodes))
    if hosts and {e.spec.label for e in _entries(settings, hosts)} != {
        e.spec.label for e in entries
    }:
        raise UsageError(
            f"--slurm-remove takes all of cluster {name} down ({', '.join(known.nodes)}); to"
            f" take some hosts out, give the others: vmrun setup -H ... --slurm {name}",
            code="flags-conflict",
        )
    ctl = _controller(settings, entries, None, known)
    removed = remove(settings, name, entries, ctl)
    forget_table(settings.project_dir or Path.cwd(), "clusters", name)
    return removed


def _recorded(settings: Settings, name: str) -> Cluster | None:
    from vmrun.backends.slurm.cluster import project_clusters

    return next((c for c in project_clusters(settings) if c.name == name), None)


def _entries(settings: Settings, words: list[str]) -> list[HostEntry]:
    from vmrun.ssh.inventory import select_hosts

    return select_hosts(words, settings, environ={})


def _controller(
    settings: Settings, entries: list[HostEntry], given: str | None, known: Cluster | None
) -> HostEntry:
    """--controller, else the recorded login node, else the first host."""
    word = given or (known.login if known else None)
    if word is None:
        return entries[0]
    for entry in entries:
        if word in (entry.label, entry.spec.label, entry.name):
            return entry
    raise UsageError(
        f"--controller {word} is not one of the hosts ({', '.join(e.label for e in entries)})",
        code="flags-conflict",
    )


def _record(
    settings: Settings,
    project: Path,
    name: str,
    ctl: HostEntry,
    entries: list[HostEntry],
    shared: str | None,
    python: str,
    accounting: bool = False,
) -> None:
    """`[[clusters]] NAME`: the controller as login node, the shared folder as workdir (or
    the home folders, `shared = false`), the interpreter setup made, and the nodes (so a
    second run and --slurm-remove know them);
    what the user added to an existing table (partition, env, price...) stays."""
    from vmrun.ssh.inventory import record_table

    tables = settings.project_data.get("clusters", [])
    table = dict(next((t for t in tables if t.get("name") == name), {}))
    table.update(  # hosts by their names in vmrun.toml where they have one (`up`'s VMs,
        name=name,  # whose addresses change when they start again), else as given
        login=ctl.name or ctl.spec.label,
        workdir=shared or "~",
        nodes=[e.name or e.spec.label for e in entries],
        shared=shared is not None,
    )
    if python:
        table["python"] = python
    if accounting:
        table["accounting"] = True
    record_table(project, "clusters", table)
