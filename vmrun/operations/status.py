"""What `vmrun status` shows, gathered: every run recorded on the hosts and the clusters (and
kept in a bucket, `--store`), and what the autostop watchdog says on each host, as values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vmrun.backends.api import RunRow
from vmrun.config import Settings
from vmrun.reporting import QUIET, Reporter

if TYPE_CHECKING:
    from vmrun.runs.store_runs import StoreRuns


@dataclass(frozen=True)
class Failure:
    """A host, cluster or bucket that did not answer, and why (`status --json` names it)."""

    error: BaseException
    host: str | None = None
    cluster: str | None = None
    store: str | None = None


@dataclass
class Status:
    """The runs found (one `RunRow` per run and node, oldest first: a hosts' `RunRecord` or
    a cluster's job), the hosts and clusters that did not answer, and the watchdog's short
    state on each host that has one installed."""

    records: list[RunRow] = field(default_factory=list)
    errors: list[Failure] = field(default_factory=list)
    autostop: dict[str, str] = field(default_factory=dict)
    hidden: int = 0  # older runs left out (`last`)
    copies: dict[str, str] = field(default_factory=dict)  # a listed run's place in the bucket

    def runs(self) -> list[dict[str, Any]]:
        """One object per run, the same keys in each (vmrun.operations.status_runs)."""
        from vmrun.operations.status_runs import run_objects

        return run_objects(self.records, self.copies)

    def places(self) -> list[dict[str, Any]]:
        """One object per host or cluster that did not answer (every run key, null)."""
        from vmrun.operations.status_runs import place_object

        return [
            place_object(f.error, host=f.host, cluster=f.cluster, store=f.store)
            for f in self.errors
        ]


def gather(
    settings: Settings,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    watchdog: bool = True,
    last: int = 0,
    out: Reporter = QUIET,
    store: str | None = None,
    places: bool = True,
    bucket: StoreRuns | None = None,
) -> Status:
    """Runs from -H's hosts or -C's cluster; with neither, from the project's hosts and
    every cluster in vmrun.toml (one command on each login node), oldest first (`last`:
    only the newest N runs, 0: all); and what the autostop watchdog says on each host that
    has one (`watchdog`: the table shows it). `store`: the runs kept under this bucket
    place too ("": vmrun.toml's `store`), a run the hosts or clusters listed shown once, as
    they see it (`places`: False, the bucket's alone; `bucket`: its lister, kept by a
    caller that lists again and again)."""
    from vmrun.errors import UsageError

    if last < 0:
        raise UsageError(f"--last must be >= 0, got {last}")
    from vmrun.backends.select import list_runs_on, listed_targets, one_place

    one_place(hosts, cluster)

    records: list[RunRow] = []
    errors: list[Failure] = []
    autostop: dict[str, str] = {}
    named = bool(hosts or cluster)  # a place the user named that does not answer: an error
    targets = listed_targets(settings, hosts=hosts, cluster=cluster) if places else []
    for target in targets:
        listed = list_runs_on(target, settings, watchdog=watchdog)
        if listed.down is not None and named:
            raise listed.down
        if listed.down is not None:
            errors.append(Failure(listed.down, cluster=target.cluster))
        records += listed.rows
        errors += [Failure(exc, host=host, cluster=name) for host, name, exc in listed.failed]
        autostop.update(listed.autostop)
    copies: dict[str, str] = {}
    older: list[str] = []  # the bucket's runs left out unread (`last`)
    if store is not None:
        records += _in_bucket(settings, store, records, copies, errors, bucket, last, older)
    records.sort(key=lambda r: float(r.started or 0))
    ids = list(dict.fromkeys(r.id for r in records))
    keep = set(ids[-last:]) if last else set(ids)
    kept = [r for r in records if r.id in keep]
    hidden = len(ids) - len(keep) + len(set(older) - set(ids))
    return Status(kept, errors, autostop, hidden, copies)


def _in_bucket(
    settings: Settings,
    store: str,
    listed: list[RunRow],
    copies: dict[str, str],
    errors: list[Failure],
    bucket: StoreRuns | None = None,
    last: int = 0,
    older: list[str] | None = None,
) -> list[RunRow]:
    """The runs under the bucket place that no host or cluster listed (the places' view is
    live); for those they did, their place in the bucket, in `copies`. A bucket that does
    not answer is a failure in `errors`, as a host's is. `last`: only the bucket's newest
    N read, the others' ids in `older`."""
    from vmrun.errors import UsageError, VmrunError
    from vmrun.runs.store_runs import StoreRuns
    from vmrun.store_url import parse_store

    if not (store or settings.store):
        raise UsageError(
            "--from-store: vmrun.toml names no store",
            hint="give the place: --store s3://BUCKET/PREFIX",
            code="bad-store",
        )
    place = parse_store(store or settings.store)
    if bucket is None or bucket.store != place:
        bucket = StoreRuns(place, settings.store_credentials)
    try:
        found = bucket.runs(last, older)
    except VmrunError as exc:
        errors.append(Failure(exc, store=str(place)))
        return []
    seen = {r.id for r in listed}
    copies.update({r.id: str(r.place) for r in found if r.id in seen})
    return [r for r in found if r.id not in seen]
