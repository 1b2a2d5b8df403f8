"""Fetching results: from every host in parallel (or a cluster's login node), once or
(--watch) round after round, each file verified and renamed into place only when complete.
A run's outputs come from the nodes it ran on, where its backend says they are, every
node's into the run's one folder (vmrun.transfer.merge decides which node sends each
file); explicit paths, and --all-hosts, come from the chosen hosts into a folder each. A
run copied to a bucket (`train --store`) whose files are not on its hosts (removed, the
host gone or not answering) comes from its copy there instead. Each round's per-host
reports come back as a value."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmrun.backends.api import Backend, RunRef
from vmrun.backends.select import backend_on, selected_entries
from vmrun.config import Settings
from vmrun.errors import (
    CODES,
    ExitCode,
    HostsFailed,
    Interrupted,
    RemoteError,
    UsageError,
    exit_code_for,
)
from vmrun.reporting import QUIET, Reporter
from vmrun.results.record import RunRecord
from vmrun.runs.outputs import RunLocation
from vmrun.ssh.group import Group, Outcome
from vmrun.ssh.inventory import HostEntry
from vmrun.store_url import StoreURL
from vmrun.transfer.merge import Conflict
from vmrun.transfer.types import FetchSpec, Options, Report

WATCH_SETTLE = 2.0  # --watch leaves files alone until they are this old (still being written)


@dataclass
class FetchJob:
    items: list[str]  # results, checkpoints, logs, metrics, or paths on the host
    settings: Settings
    run: str | None = None  # None: the newest (when an item is a run's)
    to: str | None = None  # None: the project directory
    hosts: list[str] | None = None
    all_hosts: bool = False
    latest: int | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    verify: bool = False
    watch: bool = False
    interval: float = 10.0
    bwlimit: float | None = None
    cluster: str | None = None  # -C: from the cluster's shared filesystem
    store: str | None = None  # from this bucket place (s3://...; "" for vmrun.toml's store)


@dataclass(frozen=True)
class Fetched:
    """One round: each host's outcome (its transfer Report, or its error), in host order.
    `ref` is the run whose files these are (None: explicit paths only); its nodes that did
    not answer are in `ref.unreached`. `several`: files came from several hosts (a run's
    nodes' merged into one folder, else a folder per host); `conflicts`: the paths that
    several nodes hold with different bytes (the first node's fetched, the others' left)."""

    outcomes: list[Outcome[Report]]
    ref: RunRef | None = None
    several: bool = False
    conflicts: tuple[Conflict, ...] = ()

    @property
    def reports(self) -> list[Report]:
        return [o.value for o in self.outcomes if o.value is not None]

    @property
    def exit_code(self) -> int:
        """0 when everything asked for came back from every node; else the worst of: a
        host's failure, a file that failed (FAILED), a path not on the host (REMOTE), a node
        of the run that did not answer."""
        codes = [0]
        for outcome in self.outcomes:
            if outcome.error is not None:
                codes.append(exit_code_for(outcome.error))
            elif outcome.value is not None:
                codes += [ExitCode.FAILED] * bool(outcome.value.failed)
                codes += [ExitCode.REMOTE] * bool(outcome.value.missing)
        if self.ref is not None:
            codes += [exit_code_for(e) for e in self.ref.unreached.values()]
        codes += [CODES["node-files-differ"].exit_code] * bool(self.conflicts)
        return max(codes)


def fetch(job: FetchJob, out: Reporter = QUIET) -> Fetched:
    """One round (job.watch is not looked at)."""
    (fetched,) = rounds(replace(job, watch=False), out)
    return fetched


def rounds(job: FetchJob, out: Reporter = QUIET) -> Iterator[Fetched]:
    """Round after round with job.watch (each `interval` apart, until Ctrl-C), else one.
    `progress` makes the transfers' Progress; one that is a context manager (a live view)
    is entered around each round."""
    check(job)
    if job.store is not None:
        yield _from_store(job, out)
        return
    try:
        entries = _entries(job)
    except UsageError as exc:
        if exc.code != "no-hosts":
            raise
        yield _instead(job, exc, out)
        return
    with Group(entries, job.settings) as group:
        yield from _host_rounds(job, group, out)


def _host_rounds(job: FetchJob, group: Group, out: Reporter) -> Iterator[Fetched]:
    """The rounds from the group's hosts (a run's: from its nodes, or its bucket copy)."""
    from vmrun.runs.outputs import WHATS
    from vmrun.transfer.download import download
    from vmrun.transfer.streams import stop_all_streams

    dest, options, stop = _destination(job), _options(job), threading.Event()
    run, only, ref = job.run, None, None
    where: Mapping[str, RunLocation] = {}
    backend = backend_on(group, job.settings, cluster=job.cluster)
    workdir = backend.code_dir(job.settings.project_dir or Path.cwd())
    if run is not None or any(item in WHATS for item in job.items):
        try:
            run, where, ref = _the_run(group, run, backend)
        except (UsageError, HostsFailed) as exc:
            yield _instead(job, exc, out)
            return
        only = set(where)
    multi, merged, order, specs_of = _plan(job, group, only, run, where, ref, workdir)
    shown = out.progress(several=multi, live=not job.watch)

    def work(entry: HostEntry, conn: Any) -> Report:
        return download(conn, specs_of(entry, conn), dest, options, shown)

    if job.watch:
        out.info(f"watching {len(group.entries)} host(s) every {job.interval:g} s; Ctrl-C to stop")
    while True:
        live = shown if isinstance(shown, AbstractContextManager) else nullcontext()
        try:
            with live:
                if merged:
                    outcomes, conflicts = _merged(group, order, specs_of, dest, options, shown)
                else:
                    outcomes, conflicts = group.map(work, only=only), ()
        except Interrupted:
            stop_all_streams()  # partial copies stay, under temporary names: resumable
            if not job.watch:
                raise
            out.info("stopped watching (the interrupted files resume next time)")
            return
        if not job.watch:
            yield _or_bucket(job, Fetched(outcomes, ref, multi, conflicts), out)
            return
        yield Fetched(outcomes, ref, multi, conflicts)
        try:
            stop.wait(job.interval)
        except KeyboardInterrupt:
            out.info("stopped watching")
            return


def _plan(
    job: FetchJob,
    group: Group,
    only: set[str] | None,
    run: str | None,
    where: Mapping[str, RunLocation],
    ref: RunRef | None,
    workdir: str,
) -> tuple[bool, bool, list[str], Callable[[HostEntry, Any], list[FetchSpec]]]:
    """Where each host's files land, for a fetch and for its listing alike (`only`: the
    hosts asked, None all): `multi` (several hosts), `merged` (a run's nodes into one
    folder, the others' records in theirs), `order` (the run's nodes, the master first)
    and each host's specs."""
    from vmrun.runs.outputs import specs_for

    multi = job.all_hosts or len(only or group.entries) > 1
    merged = ref is not None and multi and not job.all_hosts  # a run's nodes: one folder
    order = [n for n in ref.nodes if n in where] if ref is not None else []

    def specs_of(entry: HostEntry, conn: Any) -> list[FetchSpec]:
        folder = entry.label.replace("/", "_")
        return specs_for(
            conn,
            job.items,
            run=run,
            location=where.get(entry.label),
            workdir=workdir,
            host_dir=folder if multi and not merged else None,
            include=job.include,
            exclude=job.exclude,
            latest=job.latest,
            node_dir=folder if merged and order and entry.label != order[0] else None,
        )

    return multi, merged, order, specs_of


def _merged(
    group: Group,
    order: list[str],
    specs_of: Callable[[HostEntry, Any], list[FetchSpec]],
    dest: Path,
    options: Options,
    shown: Any,
) -> tuple[list[Outcome[Report]], tuple[Conflict, ...]]:
    """One round from a run's nodes (`order`: the master first) into one folder: each node
    lists what it would send, the paths several hold at one size are compared by checksum
    there, then each node sends its share (vmrun.transfer.merge decides), all in parallel.
    A node that fails a step is that node's outcome; the others go on."""
    from vmrun.transfer.download import Listed, download, listed
    from vmrun.transfer.manifest import remote_hashes
    from vmrun.transfer.merge import in_doubt, merge

    specs: dict[str, list[FetchSpec]] = {}

    def look(entry: HostEntry, conn: Any) -> dict[str, Listed]:
        specs[entry.label] = specs_of(entry, conn)
        return listed(conn, specs[entry.label], dest, options)

    looked = group.map(look, only=order)
    held = {o.host: o.value for o in looked if o.value is not None}
    doubt = in_doubt(order, held)

    def digests(entry: HostEntry, conn: Any) -> dict[str, str]:
        mine = held[entry.label]
        paths = sorted(doubt[entry.label])
        by_remote = remote_hashes(conn, [mine[p].remote for p in paths])
        return {p: by_remote[mine[p].remote] for p in paths if mine[p].remote in by_remote}

    hashed = group.map(digests, only=list(doubt)) if doubt else []
    sums = {o.host: o.value for o in hashed if o.value is not None}
    lost = {o.host: o for o in hashed if o.error is not None}  # that node's outcome
    held = {node: files for node, files in held.items() if node not in lost}
    decided = merge([n for n in order if n in held], held, sums)

    def send(entry: HostEntry, conn: Any) -> Report:
        share = decided.share(entry.label)
        return download(conn, specs[entry.label], dest, options, shown, only=share)

    sent = {o.host: o for o in group.map(send, only=list(held))}
    outcomes: list[Outcome[Report]] = []
    for looking in looked:  # in the group's order; a node that failed before sending: why
        failed = lost.get(looking.host, looking)
        outcomes.append(
            sent.get(looking.host) or Outcome(looking.host, None, failed.error, failed.duration)
        )
    return outcomes, decided.conflicts


def _options(job: FetchJob) -> Options:
    """How each host's files travel (--watch leaves those still being written)."""
    from vmrun.transfer.types import env_tuning

    engine, streams = env_tuning()
    return Options(
        verify=job.verify,
        settle=WATCH_SETTLE if job.watch else 0.0,
        engine=engine,
        bwlimit=job.bwlimit,
        streams=streams,
    )


def _from_store(job: FetchJob, out: Reporter) -> Fetched:
    """The run's files from its place in the bucket (`train --store`), straight here: its
    hosts may be gone. One outcome, named by the run's place."""
    from vmrun.store_url import parse_store
    from vmrun.stores.access import resolve
    from vmrun.stores.bucket import client, newest_run
    from vmrun.stores.sync import run_place

    store = parse_store(job.store or job.settings.store)
    s3 = client(resolve(job.settings.store_credentials))
    return _from_place(job, run_place(store, job.run or newest_run(s3, store)), out, s3)


def _from_place(job: FetchJob, place: StoreURL, out: Reporter, s3: Any = None) -> Fetched:
    """The run's files from its place in the bucket (`s3`: a client, else one is made)."""
    from vmrun.runs.store_fetch import fetch_run
    from vmrun.stores.access import resolve
    from vmrun.stores.bucket import client

    s3 = s3 if s3 is not None else client(resolve(job.settings.store_credentials))
    shown = out.progress(several=False, live=True)
    live = shown if isinstance(shown, AbstractContextManager) else nullcontext()
    began = time.monotonic()
    with live:
        report = fetch_run(
            s3,
            place,
            job.items,
            _destination(job),
            shown,
            latest=job.latest,
            include=job.include,
            exclude=job.exclude,
        )
    return Fetched([Outcome(str(place), report, None, time.monotonic() - began)])


def _run_copy(job: FetchJob, record: RunRecord | None) -> StoreURL | None:
    """Where the run's copy is in a bucket, where that is known: its record's `store` (the
    run's `record`, else the record fetched here before: results/RUN/run.json); with no
    record at all, RUN under the project's `store`, where its runs are copied. None: the
    run was not copied (its record names no store), or nothing says where."""
    from vmrun.results.history import read_record, run_places
    from vmrun.store_url import parse_store
    from vmrun.stores.sync import run_place

    if not record and job.run:
        kept = run_places(_destination(job) / "results" / job.run)
        record = next((r for r in map(read_record, kept) if r), None)
    if record:
        return parse_store(record.store) if record.store else None
    if job.settings.store and job.run:
        return run_place(parse_store(job.settings.store), job.run)
    return None


def _instead(job: FetchJob, exc: UsageError | HostsFailed, out: Reporter) -> Fetched:
    """The named run from its bucket copy when no host has its record (`exc` says why);
    `exc` itself where no copy is known (or the fetch is a cluster's, or --watch)."""
    from vmrun.backends.select import Target

    copied = Target.of(hosts=job.hosts, cluster=job.cluster).capabilities.store  # to a bucket
    place = _run_copy(job, None) if copied and not job.watch else None
    if place is None:
        raise exc
    out.info(f"{exc.message}; fetching run {job.run}'s copy from the bucket instead")
    return _from_place(job, place, out)


def _or_bucket(job: FetchJob, fetched: Fetched, out: Reporter) -> Fetched:
    """The round, with the run's files from its bucket copy where the node that copies them
    there lacks them or did not answer; the bucket's outcome takes that node's place when
    it has the run, else is added beside it."""
    ref = fetched.ref
    if ref is None:
        return fetched
    holder = ref.record.store_node or ref.record.master or ref.nodes[0]
    why = _lacking(fetched, holder)
    place = _run_copy(job, ref.record) if why else None
    if place is None:
        return fetched
    out.info(f"{why}; fetching run {ref.run_id}'s copy from the bucket instead")
    try:
        (bucket,) = _from_place(job, place, out).outcomes
    except (UsageError, RemoteError) as exc:
        bucket = Outcome(str(place), None, exc, 0.0)
    if bucket.value is None or bucket.value.missing:
        return replace(fetched, outcomes=[*fetched.outcomes, bucket])
    kept = [o for o in fetched.outcomes if o.host != holder]
    unreached = {n: e for n, e in ref.unreached.items() if n != holder}
    return replace(fetched, outcomes=[*kept, bucket], ref=replace(ref, unreached=unreached))


def _lacking(fetched: Fetched, node: str) -> str:
    """What kept the node's files from this round, naming it ("" when they all came)."""
    assert fetched.ref is not None
    if node in fetched.ref.unreached:
        return f"{node} did not answer"
    for outcome in fetched.outcomes:
        if outcome.host != node:
            continue
        if outcome.error is not None:
            return f"{node}: {getattr(outcome.error, 'message', None) or outcome.error}"
        if outcome.value is not None and outcome.value.missing:
            return f"{', '.join(dict.fromkeys(outcome.value.missing))} not found on {node}"
    return ""


def check(job: FetchJob) -> None:
    """What is refused before any connection: places that do not go together, a bad path
    or run id."""
    from vmrun.runs.outputs import check_paths, check_run_id

    if job.store is not None:
        places = (job.hosts, job.all_hosts, job.cluster, job.watch)  # -H, --all-hosts, -C
        if any(places):
            raise UsageError(
                "--store fetches from the bucket alone: drop -H, --all-hosts, -C and --watch",
                code="flags-conflict",
            )
        if not (job.store or job.settings.store):
            raise UsageError(
                "--from-store: vmrun.toml names no store",
                hint="give the place: --store s3://BUCKET/PREFIX",
                code="bad-store",
            )

    from vmrun.backends.select import Target

    target = Target.of(hosts=job.hosts, cluster=job.cluster)
    if job.all_hosts and target.capabilities.lacks("several_hosts"):
        raise UsageError(f"--all-hosts is for hosts; -C {job.cluster} fetches from its login node")
    if job.all_hosts and job.hosts:
        raise UsageError("give either --host or --all-hosts, not both")
    check_paths(job.items, job.run)
    if job.run is not None:
        check_run_id(job.run)


def _entries(job: FetchJob) -> list[HostEntry]:
    if job.all_hosts:
        from vmrun.ssh.inventory import project_hosts

        entries = project_hosts(job.settings)
        if not entries:
            raise UsageError("--all-hosts: vmrun.toml lists no hosts", code="no-hosts")
        return entries
    return selected_entries(job.settings, hosts=job.hosts, cluster=job.cluster)


def _destination(job: FetchJob) -> Path:
    if job.to is not None:
        return Path(job.to).expanduser()
    return job.settings.project_dir or Path.cwd()


def _the_run(
    group: Group, run: str | None, backend: Backend
) -> tuple[str, Mapping[str, RunLocation], RunRef]:
    """The run (the newest across the hosts unless named) and where its files are on each
    node it ran on, as the run's backend says: a run's files come from its nodes alone,
    every node agrees on which run that is, and this one listing replaces a lookup per host."""
    try:
        ref = backend.find(run)
    except UsageError as exc:
        raise UsageError(
            f"no record of {f'run {run}' if run else 'any run'}"
            f" on {', '.join(e.label for e in group.entries)}",
            hint="`vmrun status` lists the runs; a run copied to a bucket (train --store) comes"
            " from there with --store s3://BUCKET/PREFIX; or fetch an explicit path",
            code="run-not-found",
        ) from exc
    return ref.run_id, backend.outputs(ref), ref


@dataclass(frozen=True)
class Planned:
    """One file a round of `fetch` would bring: where it lands (relative to the
    destination), its size, when it was last written (the host's clock), the nodes holding
    it (the first sends it, as a merged fetch starts from the master), and whether the same
    size and time are here already (a fetch leaves it)."""

    path: str
    size: int
    mtime: float
    nodes: tuple[str, ...]
    here: bool


@dataclass(frozen=True)
class Listing:
    """What `fetch(job)` would bring, nothing moved: its files (by path), the run they are
    of (None: explicit paths only), and the hosts whose listing failed, with why."""

    files: tuple[Planned, ...]
    ref: RunRef | None
    failed: Mapping[str, BaseException]


def listing(job: FetchJob) -> Listing:
    """One listing round trip per host of what one round of `fetch(job)` would bring from
    -H's hosts or -C's cluster (the same run, specs and destination as a fetch, so the same
    files); a run's bucket copy is not looked at."""
    import os

    from vmrun.runs.outputs import WHATS
    from vmrun.transfer.download import Listed, listed

    check(job)
    if job.store is not None:
        raise UsageError("a bucket copy's files are not listed here; fetch them: --store")
    dest, options = _destination(job), _options(job)
    with Group(_entries(job), job.settings) as group:
        backend = backend_on(group, job.settings, cluster=job.cluster)
        workdir = backend.code_dir(job.settings.project_dir or Path.cwd())
        run, ref = job.run, None
        where: Mapping[str, RunLocation] = {}
        if run is not None or any(item in WHATS for item in job.items):
            run, where, ref = _the_run(group, run, backend)
        only = set(where) if ref is not None else None
        _, _, order, specs_of = _plan(job, group, only, run, where, ref, workdir)

        def look(entry: HostEntry, conn: Any) -> dict[str, Listed]:
            return listed(conn, specs_of(entry, conn), dest, options)

        outcomes = group.map(look, only=only)
    held = {o.host: o.value for o in outcomes if o.value is not None}
    ranked = [n for n in order if n in held] + [n for n in held if n not in order]
    files: dict[str, Planned] = {}
    for node in ranked:
        for path, item in held[node].items():
            if path in files:
                files[path] = replace(files[path], nodes=(*files[path].nodes, node))
                continue
            try:
                st = os.stat(dest / path)
                here = st.st_size == item.size and st.st_mtime_ns == item.mtime_ns
            except OSError:
                here = False
            files[path] = Planned(path, item.size, item.mtime_ns / 1e9, (node,), here)
    failed = {o.host: o.error for o in outcomes if o.error is not None}
    return Listing(tuple(files[p] for p in sorted(files)), ref, failed)
