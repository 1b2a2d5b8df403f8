"""What `vmrun status` shows, gathered: every run recorded on the hosts and the clusters, and
what the autostop watchdog says on each host, as values."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from vmrun.backends.api import RunRow
from vmrun.config import Settings
from vmrun.reporting import QUIET, Reporter


@dataclass(frozen=True)
class Failure:
    """A host or cluster that did not answer, and why (`status --json` names it)."""

    error: BaseException
    host: str | None = None
    cluster: str | None = None


@dataclass
class Status:
    """The runs found (one `RunRow` per run and node, oldest first: a hosts' `RunRecord` or
    a cluster's job), the hosts and clusters that did not answer, and the watchdog's short
    state on each host that has one installed."""

    records: list[RunRow] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)
    autostop: dict[str, str] = field(default_factory=dict)
    hidden: int = 0  # older runs left out (`last`)

    def runs(self) -> list[dict[str, Any]]:
        """One object per run, the same keys in each (vmrun.operations.status_runs)."""
        from vmrun.operations.status_runs import run_objects

        return run_objects(self.records)

    def places(self) -> list[dict[str, Any]]:
        """One object per host or cluster that did not answer (every run key, null)."""
        from vmrun.operations.status_runs import place_object

        return [place_object(f.error, host=f.host, cluster=f.cluster) for f in self.errors]


def gather(
    settings: Settings,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    watchdog: bool = True,
    last: int = 0,
    out: Reporter = QUIET,
) -> Status:
    """Runs from -H's hosts or -C's cluster; with neither, from the project's hosts and
    every cluster in vmrun.toml (one command on each login node), oldest first (`last`:
    only the newest N runs, 0: all); and what the autostop watchdog says on each host that
    has one (`watchdog`: the table shows it)."""
    from vmrun.errors import UsageError

    if last < 0:
        raise UsageError(f"--last must be >= 0, got {last}")
    from vmrun.backends.select import one_place, open_backend
    from vmrun.backends.slurm.cluster import project_clusters
    from vmrun.errors import VmrunError
    from vmrun.ssh.inventory import project_hosts

    one_place(hosts, cluster)
    chosen = bool(hosts) or bool(os.environ.get("VMRUN_HOSTS", "").strip())
    names = [cluster] if cluster else [] if chosen else [c.name for c in project_clusters(settings)]
    records: list[RunRow] = []
    errors: list[Failure] = []
    autostop: dict[str, str] = {}
    if not cluster and (chosen or project_hosts(settings) or not names):
        from vmrun.ssh.group import Group
        from vmrun.ssh.inventory import select_hosts

        with Group(select_hosts(hosts, settings), settings) as group:
            for outcome in group.map(lambda e, conn: _listing(conn, watchdog)):
                if outcome.error is not None:
                    errors.append(Failure(outcome.error, host=outcome.host))
                    continue
                found, state = outcome.value or ([], None)
                records += found
                if state is not None and state.installed:
                    autostop[outcome.host] = state.short()
    for name in names:
        try:
            with open_backend(settings, cluster=name) as backend:
                jobs, failed = backend.runs()
        except VmrunError as exc:
            if cluster:
                raise
            errors.append(Failure(exc, cluster=name))
            continue
        records += jobs
        errors += [Failure(exc, cluster=name) for exc in failed]
    records.sort(key=lambda r: float(r.started or 0))
    ids = list(dict.fromkeys(r.id for r in records))
    keep = set(ids[-last:]) if last else set(ids)
    return Status([r for r in records if r.id in keep], errors, autostop, len(ids) - len(keep))


def _listing(conn: Any, watchdog: bool) -> tuple[list[Any], Any]:
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
