"""Running `vmrun sweep`: each size in turn where the sweep runs, then its report and plot.

Each size is an ordinary `vmrun train` run (same plan, its own name `<name>-<N>x<P>`, and
`-cpus2-lr0.01` after it where other options vary: the point's own plan), followed
to its end and fetched into `results/<run-id>/`, so everything `vmrun report`, `plot` and
`fetch` do works on a sweep's runs one by one too. A size that fails is recorded and the
sweep goes on with the next; Ctrl-C stops the size in progress (nothing is left running),
keeps the finished ones and prints the command that continues.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmrun.cli import output
from vmrun.config import Settings
from vmrun.errors import CommandFailed, Detached, Interrupted, OutcomeUnknown, VmrunError
from vmrun.runs.plan import Plan
from vmrun.runs.state import RunState
from vmrun.runs.sweep import Size, Sweep, save

FINAL_FETCH_ONLY = 365 * 86400.0  # a fetch "every" year: only the final fetch of results


@dataclass
class SweepJob:
    sweep: Sweep
    plan: Plan  # the shared plan; each size replaces its process count and name
    project: Path
    settings: Settings
    hosts: list[str] | None = None  # -H (else the project's hosts)
    cluster: str | None = None
    cluster_opts: dict[str, Any] | None = None
    verbose: bool = False
    plans: dict[str, Plan] | None = None  # by label: a point's own plan (its lr, -e values)


def run_sweep(job: SweepJob) -> int:
    """Run every size not done yet; then write the report and plot. 0 when all are done."""
    sweep = job.sweep
    runner = _runner(job)
    todo = sweep.left()
    total = len(sweep.sizes)
    for size in todo:
        number = sweep.sizes.index(size) + 1
        output.info_line(f"sweep {sweep.id}: size {number}/{total}: {_size_words(size)}")
        size.run, size.state, size.detail = None, RunState.RUNNING, ""
        save(job.project, sweep)
        try:
            runner(size)
        except (KeyboardInterrupt, Detached, Interrupted):
            _stop_size(job, size)
            raise Interrupted(_continue_line(job, size)) from None
        except OutcomeUnknown as exc:  # it may still run: no next size beside it
            size.state, size.detail = RunState.LOST, exc.one_line()
            raise
        except VmrunError as exc:
            size.state, size.detail = RunState.FAILED, exc.one_line()
            output.info_line(f"sweep {sweep.id}: size {size.label} failed: {size.detail}")
        else:
            size.state = RunState.DONE
        finally:
            save(job.project, sweep)
    from vmrun.cli.sweep_results import write_results

    write_results(job.project, sweep)
    failed = [s.label for s in sweep.sizes if s.state != RunState.DONE]
    if failed:
        output.info_line(
            f"sweep {sweep.id}: {len(failed)} size(s) did not finish ({', '.join(failed)});"
            f" run them again with `vmrun sweep --resume {sweep.id}`"
        )
        return 1
    return 0


def _size_words(size: Size) -> str:
    nodes = f"{size.nodes} node{'s' if size.nodes > 1 else ''}"
    text = f"{nodes} x {size.nproc} process{'es' if size.nproc > 1 else ''}"
    return f"{text}, {size.words()}" if size.values else text


def _continue_line(job: SweepJob, size: Size) -> str:
    done = len(job.sweep.run_ids())
    return (
        f"sweep {job.sweep.id} interrupted at size {size.label} (stopped; {done} of"
        f" {len(job.sweep.sizes)} sizes done, kept in results/); continue with"
        f" `vmrun sweep --resume {job.sweep.id}`"
    )


def _size_plan(job: SweepJob, size: Size) -> Plan:
    plan = (job.plans or {}).get(size.label, job.plan)
    return replace(plan, nproc=str(size.nproc), name=f"{job.plan.name}-{size.label}")


def _started(job: SweepJob, size: Size) -> Callable[[str], None]:
    def note(run_id: str) -> None:
        size.run = run_id
        save(job.project, job.sweep)

    return note


def _runner(job: SweepJob) -> Callable[[Size], None]:
    if job.cluster:
        return lambda size: _on_cluster(job, size)
    if job.sweep.where.get("local"):
        return lambda size: _on_this_machine(job, size)
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(job.hosts, job.settings)
    return lambda size: _on_hosts(job, size, entries)


def _on_hosts(job: SweepJob, size: Size, entries: list[Any]) -> None:
    from vmrun.backends.hosts.training import run_remote
    from vmrun.cli.fetch_view import make_progress

    started = _started(job, size)
    run_remote(
        _size_plan(job, size),
        entries[: size.nodes],
        job.settings,
        detach=False,
        out=output.TERMINAL,
        fetch_every=FINAL_FETCH_ONLY,
        progress=make_progress(prefix=size.nodes > 1, live=sys.stderr.isatty()),
        verbose=job.verbose,
        on_start=lambda ref: started(ref.run_id),
    )
    _require_metrics(job, size)


def _on_this_machine(job: SweepJob, size: Size) -> None:
    from vmrun.runs.local import run_local

    plan = _size_plan(job, size)
    code = run_local(plan, verbose=job.verbose, on_start=_started(job, size), out=output.TERMINAL)
    if code == 130:
        raise Interrupted("interrupted")
    if code != 0:
        raise CommandFailed(f"run {size.run} exited with code {code}", code="run-failed")
    _require_metrics(job, size)


def _on_cluster(job: SweepJob, size: Size) -> None:
    from vmrun.backends.slurm.cluster import find_cluster
    from vmrun.backends.slurm.job import check_spec
    from vmrun.backends.slurm.session import cluster_backend
    from vmrun.cli.fetch_cmd import run_fetch
    from vmrun.cli.fetch_view import make_progress
    from vmrun.cli.train_cluster import job_spec
    from vmrun.operations.fetch import FetchJob

    name = str(job.cluster)
    opts = cluster_opts(job, size)
    cluster = find_cluster(job.settings, name)
    plan = _size_plan(job, size)
    spec = check_spec(job_spec(opts, str(size.nproc), cluster), plan.launcher)
    with cluster_backend(job.settings, name, spec) as slurm:
        ref = slurm.start(plan, None, output.TERMINAL, make_progress(prefix=False, live=False))
        _started(job, size)(ref.run_id)
        try:
            code = slurm.follow(ref, output.TERMINAL, verbose=job.verbose)
        except (KeyboardInterrupt, Detached, Interrupted):
            slurm.stop(ref, grace=10.0)
            size.detail = "stopped"
            raise
    if code != 0:
        raise CommandFailed(f"run {ref.run_id} exited with code {code}", code="run-failed")
    fetch = FetchJob(
        items=["results"], run=ref.run_id, to=None, hosts=None, all_hosts=False, latest=None,
        include=(), exclude=(), verify=True, watch=False, interval=0.0, bwlimit=None,
        settings=job.settings, cluster=name,
    )  # fmt: skip
    if run_fetch(fetch) != 0:
        raise VmrunError(f"fetching run {ref.run_id} from {name} failed", code="file-not-fetched")
    _require_metrics(job, size)


def cluster_opts(job: SweepJob, size: Size) -> dict[str, Any]:
    """The sbatch options of a size: the sweep's, with the point's own node count and, where
    the grid varies them, its --cpus-per-task and --gpus-per-node."""
    own = {k: v for k, v in size.values.items() if k in ("cpus_per_task", "gpus_per_node")}
    return {**(job.cluster_opts or {}), **own, "nodes": size.nodes}


def _require_metrics(job: SweepJob, size: Size) -> None:
    """A size counts as done once its metrics are here: the report is made of them."""
    folder = job.project / "results" / str(size.run)
    if not any(folder.rglob("metrics.jsonl")):
        raise VmrunError(
            f"run {size.run} finished but no metrics.jsonl came back to {folder}",
            hint=f"fetch it with `vmrun fetch {size.run} results`",
            code="metrics-missing",
        )


def _stop_size(job: SweepJob, size: Size) -> None:
    """Ctrl-C during a size: stop its run where it runs (a local run stopped itself)."""
    size.state, size.detail = RunState.STOPPED, "interrupted"
    if size.run is None or job.cluster or job.sweep.where.get("local"):
        return
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    output.info_line(f"sweep {job.sweep.id}: stopping run {size.run}")
    entries = select_hosts(job.hosts, job.settings)[: size.nodes]
    try:
        with Group(entries, job.settings) as group:
            backend = HostsBackend(group, entries)
            backend.stop(backend.find(size.run))
    except VmrunError as exc:
        output.info_line(
            f"could not stop run {size.run}: {exc.one_line()}; `vmrun stop {size.run}`"
        )
