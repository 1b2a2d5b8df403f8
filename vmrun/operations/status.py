"""What `vmrun status` shows, gathered: every run recorded on the hosts and the clusters, and
what the autostop watchdog says on each host, as values."""

from __future__ import annotations

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
    from vmrun.backends.select import list_runs_on, listed_targets, one_place

    one_place(hosts, cluster)

    records: list[RunRow] = []
    errors: list[Failure] = []
    autostop: dict[str, str] = {}
    named = bool(hosts or cluster)  # a place the user named that does not answer: an error
    for target in listed_targets(settings, hosts=hosts, cluster=cluster):
        listed = list_runs_on(target, settings, watchdog=watchdog)
        if listed.down is not None and named:
            raise listed.down
        if listed.down is not None:
            errors.append(Failure(listed.down, cluster=target.cluster))
        records += listed.rows
        errors += [Failure(exc, host=host, cluster=name) for host, name, exc in listed.failed]
        autostop.update(listed.autostop)
    records.sort(key=lambda r: float(r.started or 0))
    ids = list(dict.fromkeys(r.id for r in records))
    keep = set(ids[-last:]) if last else set(ids)
    return Status([r for r in records if r.id in keep], errors, autostop, len(ids) - len(keep))
