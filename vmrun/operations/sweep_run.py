"""Running `vmrun sweep`: each size in turn where the sweep runs, then its report and plot.

Each size is an ordinary `vmrun train` run (same plan, its own name `<name>-<N>x<P>`, and
`-cpus2-lr0.01` after it where other options vary: the point's own plan), followed
to its end and fetched into `results/<run-id>/`, so everything `vmrun report`, `plot` and
`fetch` do works on a sweep's runs one by one too. A size that fails is recorded and the
sweep goes on with the next; Ctrl-C stops the size in progress (nothing is left running),
keeps the finished ones and prints the command that continues.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.backends.api import Backend
from vmrun.backends.select import Target
from vmrun.backends.slurm.options import SlurmOptions
from vmrun.config import Settings
from vmrun.errors import (
    Detached,
    Interrupted,
    OutcomeUnknown,
    UsageError,
    VmrunError,
    run_failed,
)
from vmrun.reporting import QUIET, Reporter
from vmrun.runs.plan import Plan
from vmrun.runs.state import RunState
from vmrun.runs.sweep import Size, Sweep, save, write_text_atomic

if TYPE_CHECKING:
    from vmrun.results.history import RunHistory
    from vmrun.results.report import ReportRow

FINAL_FETCH_ONLY = 365 * 86400.0  # a fetch "every" year: only the final fetch of results


@dataclass
class SweepJob:
    sweep: Sweep
    plan: Plan  # the shared plan; each size replaces its process count and name
    project: Path
    settings: Settings
    hosts: list[str] | None = None  # -H (else the project's hosts)
    cluster: str | None = None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)  # a size's own go over these
    verbose: bool = False
    plans: dict[str, Plan] | None = None  # by label: a point's own plan (its lr, -e values)
    out: Reporter = QUIET
    detach: bool = False  # on a cluster: queue every size and return
    left: float = 0.0  # of the sweep's --max-cost, what its next size may cost (hosts)
    capped: bool = False  # a size was stopped at its cap: the sweep's is spent

    @property
    def target(self) -> Target:
        """Where the sweep runs: this machine (its record says), a cluster, or hosts."""
        local = bool(self.sweep.where.get("local"))
        return Target.of(local=local, hosts=self.hosts, cluster=self.cluster)


@dataclass
class SweepOutcome:
    """A sweep that ran (`code` 0: every size is done): its record, the report's rows (the
    table `vmrun report` prints), and the files written into results/sweep-<id>/."""

    sweep: Sweep
    code: int
    rows: list[Any]
    written: list[Path]


def run_sweep(job: SweepJob) -> SweepOutcome:
    """Run every size not done yet; then write the report and plot. On a cluster every size
    goes into its queue at once (Slurm runs what fits), then each is followed to its end."""
    if job.target.capabilities.queued_sweeps:  # every size into the queue at once
        if not _queue_all(job):
            return SweepOutcome(job.sweep, 0, [], [])
        return _finish(job)
    sweep, out = job.sweep, job.out
    runner = _runner(job)
    todo = sweep.left()
    total = len(sweep.sizes)
    for size in todo:
        if job.settings.max_cost and not _budget_left(job):
            break
        number = sweep.sizes.index(size) + 1
        out.info(f"sweep {sweep.id}: size {number}/{total}: {_size_words(size)}")
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
            _failed(job, size, exc)
        else:
            size.state = RunState.DONE
        finally:
            save(job.project, sweep)
    return _finish(job)


def _budget_left(job: SweepJob) -> bool:
    """Whether the sweep's --max-cost leaves anything for its next size (whose own cap is
    then what is left: `job.left`); said once when it does not."""
    from vmrun.results.cost import charge
    from vmrun.results.history import RunDataError, load_run

    spent = 0.0
    for size in job.sweep.sizes:
        if not size.run or size.state == RunState.RUNNING:
            continue
        try:
            run = load_run(job.project / "results" / size.run)
        except RunDataError:
            continue
        spent += charge(run.ran_s, run.price_per_hour) or 0.0
    job.left = job.settings.max_cost - spent
    if job.left >= 0.01 and not job.capped:
        return True
    job.out.info(
        f"sweep {job.sweep.id}: its --max-cost {job.settings.max_cost:g} is spent;"
        f" `vmrun sweep --resume {job.sweep.id} --max-cost MORE` runs the sizes"
        " left"
    )
    return False


def _failed(job: SweepJob, size: Size, exc: VmrunError) -> None:
    """A size that failed is recorded, and the sweep goes on with the next."""
    size.state, size.detail = RunState.FAILED, exc.one_line()
    job.capped = job.capped or exc.code == "run-over-budget"
    job.out.info(f"sweep {job.sweep.id}: size {size.label} failed: {size.detail}")


def _finish(job: SweepJob) -> SweepOutcome:
    """The report and plot of what is done, told to the notify targets."""
    sweep, out = job.sweep, job.out
    rows, written = write_results(job.project, sweep, out)
    failed = [s.label for s in sweep.sizes if s.state != RunState.DONE]
    _tell(job, failed, written)
    if failed:
        out.info(
            f"sweep {sweep.id}: {len(failed)} size(s) did not finish ({', '.join(failed)});"
            f" run them again with `vmrun sweep --resume {sweep.id}`"
        )
    return SweepOutcome(sweep, 1 if failed else 0, rows, written)


def _tell(job: SweepJob, failed: list[str], written: list[Path]) -> None:
    """The sweep's end, with its table, to the notify targets (its sizes' runs are not
    told one by one)."""
    from vmrun.notify.send import Notify, report, send

    notify = Notify.from_settings(job.settings.notify, job.settings.notify_on)
    event = "fail" if failed else "end"
    if not notify or event not in notify.on:
        return
    sweep = job.sweep
    state = f"ended, {len(failed)} size(s) not done" if failed else "done"
    table = written[0].read_text() if written and written[0].suffix == ".md" else ""
    body = f"sweep {sweep.id} {state}\n{table}\nresults: {sweep.folder}/"
    report(send(notify.targets, f"vmrun: sweep {sweep.id} {state}", body, event), job.out, event)


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
    """Each size started and followed to its end through its target's training verbs."""
    from vmrun.ssh.inventory import select_hosts

    target = job.target
    entries = select_hosts(job.hosts, job.settings) if target.capabilities.several_hosts else []
    return lambda size: _one_size(job, size, target, entries)


def _one_size(job: SweepJob, size: Size, target: Target, entries: list[Any]) -> None:
    from vmrun.backends.api import StartOptions
    from vmrun.backends.select import open_training

    plan = _size_plan(job, size)
    started = _started(job, size)
    plan = replace(plan, max_cost=job.left) if job.settings.max_cost else plan
    with open_training(
        target,
        job.settings,
        entries=entries[: size.nodes],
        fetch_every=FINAL_FETCH_ONLY,
        on_start=lambda ref: started(ref.run_id),
        verbose=job.verbose,
    ) as training:
        progress = job.out.progress(several=size.nodes > 1) if entries else None
        ref = training.start(plan, StartOptions(), job.out, progress)
        code = training.follow_and_tell(ref, None, job.out, verbose=job.verbose)
    if code != 0:
        raise run_failed(ref.run_id, f"exited with code {code}", code)
    _require_metrics(job, size)


def _queue_all(job: SweepJob) -> bool:
    """Every size left into the cluster's queue (one sbatch each, its own options), then,
    unless detached, each followed in turn and fetched: Slurm starts what fits and the
    rest as nodes free up. A size submitted before (a detached sweep) is followed, not
    submitted again. Ctrl-C leaves the queue as it is. False: detached."""
    sweep, out = job.sweep, job.out
    todo = sweep.left()
    share = _cluster_share(job, todo)
    for size in todo:
        if size.run and size.state in (RunState.RUNNING, RunState.LOST):
            continue  # queued by an earlier call (detached, or its end unknown): followed
        size.run, size.state, size.detail = None, RunState.RUNNING, ""
        plan = _size_plan(job, size)
        try:
            with _cluster_backend(job, size) as backend:
                ref = backend.start(
                    replace(plan, max_cost=share) if share else plan,
                    _start_options(),
                    out,
                    out.progress(live=False),
                )
        except (KeyboardInterrupt, Detached, Interrupted):
            size.state, size.detail = RunState.PENDING, ""
            save(job.project, sweep)
            raise Interrupted(
                f"sweep {sweep.id} interrupted while queueing; the sizes queued stay in the"
                f" queue of {job.cluster}: `vmrun sweep --resume {sweep.id}` queues the rest"
                " and follows them all"
            ) from None
        except VmrunError as exc:  # refused by Slurm: the others are queued all the same
            _failed(job, size, exc)
            save(job.project, sweep)
            continue
        _started(job, size)(ref.run_id)
    todo = [s for s in todo if s.state != RunState.FAILED]
    out.info(f"sweep {sweep.id}: {len(todo)} size(s) in the queue of {job.cluster}")
    if job.detach:
        out.info(
            f"sweep {sweep.id}: `vmrun sweep --resume {sweep.id}` follows them and writes"
            " the report"
        )
        return False
    for size in todo:
        number = sweep.sizes.index(size) + 1
        out.info(
            f"sweep {sweep.id}: size {number}/{len(sweep.sizes)}: {_size_words(size)}"
            f" (run {size.run})"
        )
        try:
            _follow_queued(job, size)
        except (KeyboardInterrupt, Detached, Interrupted):
            raise Interrupted(
                f"sweep {sweep.id}: stopped following; its runs stay in the queue of"
                f" {job.cluster}: `vmrun sweep --resume {sweep.id}` follows them again,"
                " `vmrun stop RUN` stops one"
            ) from None
        except OutcomeUnknown as exc:  # it may still run: --resume follows it, never twice
            size.state, size.detail = RunState.LOST, exc.one_line()
            out.info(f"sweep {sweep.id}: size {size.label}: {size.detail}")
        except VmrunError as exc:
            _failed(job, size, exc)
        else:
            size.state = RunState.DONE
        finally:
            save(job.project, sweep)
    return True


def _cluster_share(job: SweepJob, todo: list[Size]) -> float:
    """Each size's cap on a cluster, where every size is queued at once: the sweep's
    --max-cost less what its sizes done so far cost, split evenly between the sizes queued
    now; 0 without one (each job then keeps the cluster's own `max_cost`: its backend)."""
    cap = getattr(job.settings, "max_cost", 0)  # (a test's job may carry no settings)
    if not cap:
        return 0.0
    fresh = [s for s in todo if not (s.run and s.state in (RunState.RUNNING, RunState.LOST))]
    if not fresh or not _budget_left(job):
        if fresh:
            raise UsageError(
                f"sweep {job.sweep.id}: its --max-cost {cap:g} is spent; nothing queued",
                hint=f"`vmrun sweep --resume {job.sweep.id} --max-cost MORE` queues the rest",
                code="over-budget",
            )
        return 0.0
    share = job.left / len(fresh)
    job.out.info(
        f"sweep {job.sweep.id}: each of {len(fresh)} size(s) may cost {share:.2f}"
        f" of its --max-cost {cap:g}"
    )
    return share


def _start_options() -> Any:
    from vmrun.backends.api import StartOptions

    return StartOptions()


def _cluster_backend(job: SweepJob, size: Size) -> Any:
    from vmrun.backends.select import open_backend
    from vmrun.backends.slurm.cluster import find_cluster
    from vmrun.backends.slurm.job import check_spec

    name = str(job.cluster)
    spec = check_spec(
        size_options(job, size).job_spec(find_cluster(job.settings, name), str(size.nproc)),
        _size_plan(job, size).launcher,
    )
    return open_backend(job.settings, cluster=name, spec=spec)


def _follow_queued(job: SweepJob, size: Size) -> None:
    with _cluster_backend(job, size) as backend:
        ref = backend.find(str(size.run))
        code = backend.follow(ref, job.out, verbose=job.verbose)
        if code != 0:
            raise run_failed(ref.run_id, f"exited with code {code}", code)
        _fetch_results(backend, ref.run_id, job.project, job.out)
    _require_metrics(job, size)


def _fetch_results(backend: Backend, rid: str, project: Path, out: Reporter) -> None:
    """The run's results from the cluster's shared filesystem into results/<run-id>/, as
    `vmrun fetch RUN results -C NAME` would, on the connection the run was followed on."""
    from vmrun.runs.outputs import resolve_what
    from vmrun.transfer.download import download
    from vmrun.transfer.types import Options

    at = backend.files_at(backend.find(rid))
    specs = resolve_what("results", at.location)
    report = download(at.conn, specs, project, Options(verify=True))
    if report.failed or report.missing:
        why = next(iter(report.failed.values()), "not found there")
        raise VmrunError(
            f"fetching run {rid} from {at.node} failed: {why}",
            hint=f"fetch it with `vmrun fetch {rid} results {at.selector}`",
            code="file-not-fetched",
        )
        out.info(f"run {rid}: fetched {len(report.fetched)} file(s) into results/{rid}/")


def size_options(job: SweepJob, size: Size) -> SlurmOptions:
    """The sbatch options of a size: the sweep's, with the point's own node count and, where
    the grid varies them, its --cpus-per-task and --gpus-per-node."""
    own = {k: v for k, v in size.values.items() if k in ("cpus_per_task", "gpus_per_node")}
    return replace(job.slurm, **own, nodes=size.nodes)


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
    if size.run is None or not job.target.capabilities.detach:  # it stopped itself
        return
    from vmrun.backends.api import stopped_everywhere
    from vmrun.backends.select import open_backend
    from vmrun.ssh.inventory import select_hosts

    job.out.info(f"sweep {job.sweep.id}: stopping run {size.run}")
    nodes = [e.label for e in select_hosts(job.hosts, job.settings)[: size.nodes]]
    try:
        with open_backend(job.settings, hosts=nodes) as backend:
            ref = backend.find(size.run)
            stopped_everywhere(ref, backend.stop(ref, grace=10.0))
    except VmrunError as exc:
        job.out.info(f"could not stop run {size.run}: {exc.one_line()}; `vmrun stop {size.run}`")


PLOTS = (("loss", "loss.png"), ("eval_accuracy", "accuracy.png"), ("accuracy", "accuracy.png"))


def write_results(
    project: Path, sweep: Sweep, out: Reporter = QUIET
) -> tuple[list[Any], list[Path]]:
    """What a sweep leaves in results/sweep-<id>/, from its finished runs' fetched files
    alone: the scaling report (report.md, report.json: the rows `vmrun report` prints) and
    plots (loss.png, and accuracy.png when the runs measured accuracy); what else the sweep
    varied (`cpus=2 lr=0.01`) comes from its record, into columns and legends. Returns the
    rows and the files written (none when no size finished)."""
    from vmrun.results.report import render_markdown, rows_json

    problems: list[VmrunError] = []
    runs, rows, notes = sweep_report(project, sweep, problems)
    for problem in problems:
        out.info(f"sweep {sweep.id}: left out of the report: {problem.one_line()}")
    if not runs:
        return [], []
    folder = project / sweep.folder
    written = [folder / "report.md", folder / "report.json"]
    write_text_atomic(written[0], render_markdown(rows))
    write_text_atomic(written[1], rows_json(rows) + "\n")
    written += _plots(runs, folder, sweep.id, notes, out)
    names = ", ".join(str(p.relative_to(project)) for p in written)
    out.info(f"sweep {sweep.id}: {len(runs)} run(s); wrote {names}")
    return rows, written


def sweep_report(
    project: Path, sweep: Sweep, problems: list[VmrunError]
) -> tuple[list[RunHistory], list[ReportRow], dict[str, str]]:
    """A sweep's report from its finished runs' files here (what `write_results` writes and
    the dashboard shows): the runs, the rows `vmrun report` makes of them with the axes the
    sweep varied as columns, and each run's legend note (`cpus=2 lr=0.01`). Runs that could
    not be read go to `problems`."""
    from vmrun.results.history import load_runs
    from vmrun.results.report import report_rows

    runs = load_runs([project / "results" / rid for rid in sweep.run_ids()], problems)
    varied = {s.run: s.varied() for s in sweep.sizes if s.run and s.values}
    notes = {s.run: s.words() for s in sweep.sizes if s.run and s.values}
    return runs, report_rows(runs, varied) if runs else [], notes


def plotted(runs: Sequence[RunHistory]) -> list[str]:
    """The metrics a sweep plots (as `_plots` picks them): loss, and eval_accuracy (else
    accuracy), each where every run has it."""
    picked: dict[str, str] = {}
    for metric, name in PLOTS:
        if name not in picked and all(metric in run.metric_names for run in runs):
            picked[name] = metric
    return list(picked.values())


def _plots(
    runs: list, folder: Path, sweep_id: str, notes: dict[str, str], out: Reporter
) -> list[Path]:
    """loss.png, and accuracy.png from eval_accuracy (else accuracy) where every run has it."""
    from vmrun.results.plotting import save_plot

    written: list[Path] = []
    for metric, name in PLOTS:
        path = folder / name
        if path in written or not all(metric in run.metric_names for run in runs):
            continue
        try:
            written.append(save_plot(runs, metric, path, notes=notes))
        except VmrunError as exc:  # matplotlib missing: the report stands without plots
            out.info(f"sweep {sweep_id}: no {name}: {exc.one_line()}")
            break
    return written
