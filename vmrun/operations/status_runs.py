"""What `vmrun status` gathered, per run (`vmrun status --json`, a Python caller's
`Status.runs()`): one object per run (a run on several hosts is one object), the same keys
in every object, null where unknown, for scripts to read. A run that failed has
its `error` (vmrun.errors.error_object); so has an object for each host or cluster that
did not answer (`run` null), so a reader sees every failure, grouped by code, on stdout."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vmrun.backends.api import RunRow
from vmrun.errors import error_json, run_failed, run_over_budget, run_stopped
from vmrun.results.cost import charge
from vmrun.results.failure import WorkerFailure
from vmrun.results.history import iso_utc
from vmrun.results.layout import CLUSTER, layout_of
from vmrun.results.record import RunRecord

_PROGRESS = re.compile(r"epoch (\d+)(?:/(\d+))?")
KEYS = (
    "run",
    "hosts",
    "cluster",
    "bucket",
    "state",
    "reason",
    "attempts",
    "launcher",
    "image",
    "nodes",
    "procs_per_node",
    "world_size",
    "epochs_done",
    "epochs_asked",
    "start",
    "duration_s",
    "exit",
    "error",
    "failure",
    "tasks",
    "commit",
    "dirty",
    "versions",
    "store",
    "recoveries",
    "cost",
    "hung",
    "slow_ranks",
    "record",
)


def run_objects(
    records: Sequence[RunRow], copies: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The records `status` gathered (one per run and host), as one object per run;
    `copies`: the place in a bucket where a run listed on its hosts was found too."""
    by_run: dict[str, list[RunRow]] = {}
    for record in records:
        by_run.setdefault(record.id, []).append(record)
    return [_one(rid, recs, (copies or {}).get(rid)) for rid, recs in by_run.items()]


def _one(rid: str, recs: list[RunRow], copy: str | None = None) -> dict[str, Any]:
    from vmrun.backends.api import combined_state
    from vmrun.runs.store_runs import BucketRun

    first = recs[0]
    bucket_only = isinstance(first, BucketRun)  # only in its bucket: no host or cluster listed it
    if isinstance(first, BucketRun):
        copy = str(first.place)
    layout = layout_of(first.record)
    on_cluster = layout.where == CLUSTER
    hosts = None if on_cluster or bucket_only else list(layout.hosts or [r.host for r in recs])
    if len(recs) > 1:
        state, code = combined_state(recs)
    else:
        state, code = first.state, first.exit_code
    done = asked = None
    for rec in recs:
        match = _PROGRESS.search(rec.progress or "")
        if match and (done is None or int(match.group(1)) > done):
            done = int(match.group(1))
            asked = int(match.group(2)) if match.group(2) else None
    failure = _first_failure(recs) if str(state) == "failed" else None
    first_why = failure[1].describe(failure[0]) if failure else ""
    starts = [float(r.started) for r in recs if r.started]
    durations = [r.duration for r in recs if r.duration is not None]
    ran = [r.ran_s for r in recs if r.ran_s is not None]  # every attempt's: what it cost
    return {
        "run": rid,
        "hosts": hosts,
        "cluster": (layout.cluster or first.host) if on_cluster and not bucket_only else None,
        "bucket": copy,
        "state": str(state),
        "reason": first.reason or None,
        "attempts": max(r.attempts for r in recs),
        "launcher": layout.launcher,
        "image": first.record.image or None,  # the container image it ran in, if any
        "nodes": layout.nodes,
        "procs_per_node": layout.procs_per_node,
        "world_size": layout.world_size,
        "epochs_done": done,
        "epochs_asked": layout.epochs_asked or asked,
        "start": iso_utc(min(starts)) if starts else None,
        "duration_s": max(durations) if durations else None,
        "exit": code,
        "error": run_error(rid, str(state), code, first_why, _cap(recs)),
        "failure": failure[1].as_json(failure[0]) if failure else None,
        "tasks": _tasks(first),
        **_made_by(recs),
        "store": _store(recs),
        "recoveries": _recoveries(recs),
        "cost": cost_of(first.record, max(ran) if ran else None),
        "hung": _hung(recs),
        "slow_ranks": _slow_ranks(recs),
        "record": first.record.as_json() if first.record else None,
    }


def cost_of(record: RunRecord, seconds: float | None) -> dict[str, Any] | None:
    """What the run has cost so far (`seconds`: its time over every attempt, at the prices
    run.json recorded as it started): `amount`, `currency`, `per_hour`; None where a node's
    price is unknown."""
    prices = record.prices
    if prices is None or seconds is None:
        return None
    per_hour = prices.per_hour
    return {"amount": charge(seconds, per_hour), "currency": prices.currency, "per_hour": per_hour}


def _recoveries(recs: list[RunRow]) -> dict[str, Any] | None:
    """What --recover did (a supervisor on hosts, the job on Slurm): how many times, the
    last, whether it gave up."""
    told = max(recs, key=lambda r: r.recoveries)
    under_way = next((r.recovering for r in recs if r.recovering), None)
    if not told.recoveries and not under_way:
        return None
    return {
        "count": told.recoveries,
        "last": told.recovery or None,
        "gave_up": told.gave_up,
        "under_way": under_way,
    }


def _store(recs: list[RunRow]) -> dict[str, Any] | None:
    """Where the run's copy to its bucket stands (--store), by the copying node's clock."""
    for rec in recs:
        if rec.store is not None:
            return rec.store.as_json(getattr(rec, "host_now", None))
    return None


def _hung(recs: list[RunRow]) -> dict[str, Any] | None:
    """What its hang watcher saw on the first node that found it stuck (REC/hang: since,
    seen, timeout, host, ranks, action), or None."""
    return next((dict(h) for r in recs if isinstance(h := getattr(r, "hung", None), dict)), None)


def _slow_ranks(recs: list[RunRow]) -> list[dict[str, Any]] | None:
    """The slow ranks of its last epoch (vmrun.results.stragglers), as `status` names them:
    rank, node, its step time, the others' median, the ratio; None where none is slow."""
    for rec in recs:
        slow = getattr(rec, "slow_ranks", ())
        if slow:
            return [s.as_json() for s in slow]
    return None


def _first_failure(recs: list[RunRow]) -> tuple[str, WorkerFailure] | None:
    """The node and worker that failed first (torchrun's summary there), if one is known."""
    failed = [(r.ended or float("inf"), r.host, r.failure) for r in recs if r.failure]
    if not failed:
        return None
    _, host, failure = min(failed, key=lambda f: f[0])
    return host, failure


def _made_by(recs: list[RunRow]) -> dict[str, Any]:
    """The code's commit and whether it had uncommitted changes (run.json), and the main
    versions the run's first node reported (versions.json): what a script groups runs by."""
    code = recs[0].record.code or {}
    versions = next((v for r in recs if (v := r.versions)), None)
    return {"commit": code.get("commit"), "dirty": code.get("dirty"), "versions": versions}


def _tasks(run: RunRow) -> list[dict[str, Any]] | None:
    """An array job's tasks (`vmrun submit` of a script with --array), else null."""
    if not (run.record.job and run.record.job.array):
        return None
    return [
        {
            "task": t.key,
            "state": str(t.state),
            "reason": t.reason or None,
            "exit": t.exit_code,
            "duration_s": t.elapsed,
            "nodes": t.nodes or None,
        }
        for t in run.tasks
    ]


def _cap(recs: list[RunRow]) -> str:
    """The --max-cost a node's budget watcher stopped the run at ("" if none did)."""
    found = next((b for r in recs if isinstance(b := getattr(r, "budget", None), dict)), None)
    return str(found.get("cap") or "?") if found else ""


def run_error(
    rid: str, state: str, code: int | None, why_first: str = "", cap: str = ""
) -> dict[str, Any] | None:
    """A failed, lost or stopped run's error, with the code following it would raise
    (`why_first`: which worker failed first, where torchrun said; `cap`: the --max-cost it
    was stopped at)."""
    if state == "stopped":
        return error_json(run_over_budget(rid, cap) if cap else run_stopped(rid))
    if state not in ("failed", "lost"):
        return None
    why = f"exited with {code}" if code is not None else "ended with no exit code (lost)"
    if why_first and code is not None:
        why += f": {why_first}"
    return error_json(run_failed(rid, why, code))


def place_object(
    err: BaseException,
    *,
    host: str | None = None,
    cluster: str | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """A host, cluster or bucket that did not answer, as an object with every run key
    (null)."""
    return {
        **dict.fromkeys(KEYS),
        "hosts": [host] if host else None,
        "cluster": cluster,
        "bucket": store,
        "error": error_json(err),
    }
