"""`vmrun train --resume RUN`: another attempt of a run, on its nodes, from its last snapshot.

Multi-node runs have no shared filesystem: a snapshot exists only on the host whose rank 0
wrote it. Before the new attempt starts, vmrun makes every node hold the newest copy of each
checkpoint file (`vmrun.runs.outputs.CHECKPOINTS` names, in the run's output folder): it lists the
folder on every node in one round trip each, and copies the newest version of each file
(by mtime; it passes through this machine, verified on both legs) to the nodes that lack it
or hold an older one. So a script that loads `snapshot.pt` on every rank resumes everywhere
from the same state, and vmrun's template (which loads on rank 0 and broadcasts) resumes
wherever c10d puts rank 0. A sharded checkpoint (torch.distributed.checkpoint folders, each
node holding its own ranks' shards) is made whole on every node from the newest one that
can be (vmrun.backends.hosts.resume_point: what a node lacks from the run's bucket, else a
peer). Leftover processes of the run (a node that was cut off and came back) are stopped
first; a run still alive on every node is not touched.
"""

from __future__ import annotations

import fnmatch
import posixpath
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.backends.hosts import records as runs
from vmrun.backends.hosts.resume_point import (
    Point,
    Store,
    bucket_folders,
    copy_between,
    exclude_glob,
    give,
)
from vmrun.errors import RemoteError, UsageError
from vmrun.reporting import Reporter
from vmrun.results.record import RunRecord
from vmrun.runs.outputs import CHECKPOINTS
from vmrun.runs.plan import Plan
from vmrun.runs.state import RunState
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.manifest import PART_SUFFIX, list_remote

if TYPE_CHECKING:
    from vmrun.store_url import StoreURL
    from vmrun.stores.access import Access
    from vmrun.transfer.types import Progress


@dataclass
class Resumed:
    """What the record of the run to resume says: its plan, its nodes (master first), and
    every run on each host searched (for the busy check: nothing is listed twice)."""

    plan: Plan
    nodes: list[str]
    record: RunRecord
    listed: dict[str, list[runs.RunRecord]]
    restore: StoreURL | None = None  # from its copy in this bucket place: its hosts are gone


def load(
    group: Group,
    rid: str,
    env: dict[str, str],
    store: StoreURL | None = None,
    store_credentials: str = "auto",
) -> Resumed:
    """The recorded plan of run `rid`, found on the group's hosts in one listing each, else
    (with `store`) in its copy in the bucket, to resume on the group's hosts."""
    runs.check_run_id(rid)
    outcomes = group.map(lambda entry, conn: runs.list_runs(conn))
    listed = {o.host: o.value or [] for o in outcomes if o.ok}
    found = [r for recs in listed.values() for r in recs if r.id == rid]
    restore = None
    if found:
        record = max(found, key=lambda r: r.started).record
    elif store is not None:
        from vmrun.runs.store_runs import run_record
        from vmrun.stores.access import resolve
        from vmrun.stores.bucket import client
        from vmrun.stores.sync import run_place

        restore = run_place(store, rid)
        record = run_record(client(resolve(store_credentials)), restore)
    else:
        raise_for_failures(outcomes)
        raise UsageError(
            f"no run {rid} on {', '.join(listed)}",
            hint="`vmrun status` lists the runs; a run copied to a bucket resumes from there"
            " with --store s3://BUCKET/PREFIX",
            code="run-not-found",
        )
    if not record.launch.launcher or record.launch.args is None:
        raise UsageError(
            f"run {rid} was started by an older vmrun and cannot be resumed",
            hint="start it again with `vmrun train`",
            code="run-not-resumable",
        )
    missing = sorted(set(record.launch.env_keys or ()) - set(env))
    if missing:
        raise UsageError(
            f"run {rid} was started with --env {', '.join(missing)}; values are never stored",
            hint="pass them again with --env KEY=VALUE",
            code="env-value-missing",
        )
    nodes = list(record.hosts)
    if restore is not None:  # its hosts are gone: the ones given now, in their order
        nodes = [e.label for e in group.entries]
    plan = _plan(rid, record, env, store_credentials)
    return Resumed(plan, nodes, record, listed, restore)


def _plan(rid: str, record: RunRecord, env: dict[str, str], store_credentials: str) -> Plan:
    from vmrun.config import find_project_dir
    from vmrun.containers.request import Asked
    from vmrun.store_url import StoreURL, parse_store
    from vmrun.stores.access import resolve
    from vmrun.trainer import TEMPLATE_PATH

    store = None
    launch = record.launch
    if record.store:  # its copy goes on, to the same place
        place = parse_store(record.store)
        store = StoreURL(place.scheme, place.bucket, posixpath.dirname(place.prefix))

    project = find_project_dir() or Path.cwd()
    if launch.template:
        script = TEMPLATE_PATH
    else:
        script = project / launch.script
        if not script.is_file():
            raise UsageError(
                f"run {rid} ran {launch.script}, which is not in this project ({project})",
                hint="resume from the project directory the run was started in",
                code="run-not-resumable",
            )
    return Plan(
        script=script,
        is_template=bool(launch.template),
        name=launch.name or "run",
        args=list(launch.args or ()),
        launcher=launch.launcher,
        nproc=launch.nproc_requested,
        max_restarts=launch.max_restarts or 0,
        env=env,
        project=project,
        containers=Asked(recorded=launch.image.request() if launch.image else None, fixed=True),
        store=store,
        store_access=resolve(store_credentials) if store is not None else None,
        recover=record.policy.recover,
        hang_timeout=record.policy.hang_timeout or 0,
        on_hang=record.policy.on_hang or "wait",
        max_cost=record.policy.max_cost or 0.0,
    )


def prepare(
    group: Group,
    labels: Sequence[str],
    rid: str,
    out: Reporter,
    listed: dict[str, list[runs.RunRecord]] | None = None,
    *,
    store: Store | None = None,
    pythons: Mapping[str, str] | None = None,
) -> str:
    """Stop the run's leftovers; give every node the newest checkpoints, and the newest
    sharded one whole (from `store`, the run's bucket, what no node holds). Returns the
    line that opens the new attempt in the run's log."""
    if listed is None:
        outcomes = group.map(lambda entry, conn: runs.list_runs(conn, [rid]), only=set(labels))
        raise_for_failures(outcomes)
        listed = {o.host: o.value or [] for o in outcomes}
    records = {h: r for h in labels for r in listed.get(h, []) if r.id == rid}
    alive = [h for h, r in records.items() if r.state == RunState.RUNNING]
    if alive and len(alive) == len(labels):
        raise UsageError(
            f"run {rid} is still running on every node; nothing to resume",
            hint=f"watch it with `vmrun logs -f {rid}`, or `vmrun stop {rid}` first",
            code="run-still-running",
        )
    for host in alive:
        res = runs.stop(group.connections[host], rid, why="resume")
        out.info(f"{host}: stopped {len(res.signalled)} leftover process(es) of run {rid}")
    out_dirs = {h: r.record.launch.out_dir for h, r in records.items()}
    newest = _spread_checkpoints(group, labels, out_dirs, out)
    base = next((d for d in out_dirs.values() if d), "")
    point = None
    if base:
        every = {h: out_dirs.get(h) or base for h in labels}
        point = give(group, labels, every, rid, out, store=store, pythons=pythons)
    return _banner(list(records.values()), newest, point)


def restore(
    group: Group,
    out_dirs: dict[str, str],
    rid: str,
    place: StoreURL,
    access: Access,
    out: Reporter,
    progress: Progress | None = None,
    pythons: Mapping[str, str] | None = None,
) -> tuple[str, dict[str, list[runs.RunRecord]]]:
    """A run whose hosts are gone, from its copy in the bucket: every node (`out_dirs`:
    its output folder) copies the run's outputs straight from the bucket (of its sharded
    checkpoints only the newest complete one, whole on every node), the first node its
    record too (log, attempts, provenance), so the new attempt goes on from the newest
    checkpoint with the run's history. The line that opens the new attempt, and the record
    as the first node now lists it."""
    from vmrun.stores.bucket import client, objects
    from vmrun.stores.mover import copy_from_store
    from vmrun.stores.sync import RECORD
    from vmrun.transfer.types import Progress

    shown = progress or Progress()
    labels = list(out_dirs)
    first = labels[0]

    def one(entry: HostEntry, conn: Connection) -> None:
        mine = access.on(entry.vars)
        got = copy_from_store(conn, place, out_dirs[entry.label], mine, shown, exclude=leave_out)
        if entry.label == first:
            copy_from_store(conn, place.join(RECORD), runs.record_dir(rid), mine, shown)
        if got.report.failed:
            raise RemoteError(
                f"{len(got.report.failed)} file(s) of run {rid} did not arrive intact from {place}",
                host=entry.label,
                code="store-copy-failed",
            )

    found = objects(client(access), place)
    sharded = [p for p in bucket_folders(found) if p != "."]  # below: only the one chosen
    leave_out = exclude_glob([RECORD, *sharded], "/**")
    raise_for_failures(group.map(one, only=set(labels)), one_as_itself=True)
    out.info(f"run {rid}: its files and record copied from {place} to {', '.join(labels)}")
    points = [o for o in found if "/" not in o.key and _is_checkpoint(o.key)]
    newest = max(points, key=lambda o: o.modified).key if points else None
    point = None
    if sharded:
        store = Store(place, access)
        point = give(
            group,
            labels,
            out_dirs,
            rid,
            out,
            store=store,
            pythons=pythons,
            progress=progress,
            must_read_bucket=True,
        )
    listed = {first: runs.list_runs(group.connections[first], [rid])}
    return _banner(listed[first], newest, point), listed


def _banner(
    records: Sequence[runs.RunRecord], checkpoint: str | None, point: Point | None = None
) -> str:
    """`--- attempt 2, resumed from epoch 21 (snapshot.pt) ---`: the epoch after the newest
    snapshot the log reports (the template resumes there; a script that re-runs the saved
    epoch is told as `after epoch N`); a sharded checkpoint chosen (`point`) is named with
    its own epoch."""
    attempt = max((r.attempt for r in records), default=1) + 1
    saved = max((r.saved_epoch for r in records if r.saved_epoch is not None), default=None)
    template = any(r.record.launch.template for r in records)
    if point is not None and point.path is not None:
        checkpoint, saved = point.path, point.epoch
    if not checkpoint:
        return f"--- attempt {attempt}, resumed: no checkpoint found, so from the start ---"
    if saved is None:
        return f"--- attempt {attempt}, resumed ({checkpoint}) ---"
    when = f"from epoch {saved + 1}" if template else f"after epoch {saved}"
    return f"--- attempt {attempt}, resumed {when} ({checkpoint}) ---"


def _is_checkpoint(rel: str) -> bool:
    name = posixpath.basename(rel)
    return not name.endswith(PART_SUFFIX) and any(fnmatch.fnmatch(name, p) for p in CHECKPOINTS)


def _spread_checkpoints(
    group: Group, labels: Sequence[str], out_dirs: dict[str, str], out: Reporter
) -> str | None:
    """Give every node the newest copy of each checkpoint; the newest checkpoint's name."""
    base = next((d for d in out_dirs.values() if d), "")
    if not base:
        return None

    def listing(entry: HostEntry, conn: Connection) -> dict[str, tuple[int, int]]:
        root = list_remote(conn, [out_dirs.get(entry.label) or base]).roots[0]
        return {
            e.rel: (e.size, e.mtime_ns)
            for e in root.entries
            if e.kind == "f" and _is_checkpoint(e.rel)
        }

    outcomes = group.map(listing, only=set(labels))
    have = {o.host: o.value or {} for o in outcomes if o.ok}
    for o in outcomes:
        if not o.ok:
            raise RemoteError(f"cannot list the run's checkpoints: {o.error}", host=o.host)
    newest: dict[str, tuple[str, tuple[int, int]]] = {}
    for host, files in have.items():
        for rel, stat in files.items():
            if rel not in newest or stat[1] > newest[rel][1][1]:
                newest[rel] = (host, stat)
    with tempfile.TemporaryDirectory(prefix="vmrun-resume-") as tmp:
        for rel, (src, stat) in sorted(newest.items()):
            dests = [h for h in labels if have.get(h, {}).get(rel) != stat]
            if dests:
                copy_between(group, src, dests, out_dirs, base, rel, Path(tmp))
                out.info(f"copied {rel} from {src} to {', '.join(dests)} (the newest copy)")
    if not newest:
        return None
    return max(newest, key=lambda rel: newest[rel][1][1])
