"""The runs `vmrun report` and `vmrun plot` are about, read from `results/` here.

A run named by id that is not here, or has no metrics here, is fetched first (its `metrics`
and `logs`, as `vmrun fetch metrics logs --run RUN` would) from -H's hosts, -C's cluster, or
else the project's hosts and then each of its clusters, and then the bucket runs are copied
to (`store`, or --store); once its files are here, nothing connects again, so reports and
plots outlive the VMs. A run that still cannot be read gets
a warning naming it and is left out; with none left, the call fails.

`vmrun diff` (and `report --diff`) gathers runs the same way, needing a run's record or
provenance files rather than its metrics (`gather_provenance`, `run_diffs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.errors import UsageError, VmrunError
from vmrun.reporting import QUIET, Reporter
from vmrun.results.history import METRICS, RunHistory, load_runs, run_dirs, run_path
from vmrun.results.provenance import has_record

if TYPE_CHECKING:
    from vmrun.results.provenance import RunProvenance
    from vmrun.results.rundiff import RunDiff


def project_dir() -> Path:
    from vmrun.config import find_project_dir

    return find_project_dir() or Path.cwd()


@dataclass(frozen=True)
class Need:
    """What a run named by id must have here to be read; without it, it is fetched first."""

    lacking: str  # said when it is missing: "no metrics.jsonl"
    present: Callable[[Path], bool]


def _has_metrics(path: Path) -> bool:
    return (path / METRICS).is_file() or any(path.glob(f"*/{METRICS}"))


METRICS_NEEDED = Need(f"no {METRICS}", _has_metrics)
RECORD_NEEDED = Need("no run.json or provenance", has_record)


def gather(
    names: list[str] | None,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    settings: Callable[[], Settings],  # read only when something is to be fetched
    verb: str = "report",  # what the runs are for, in the messages
    out: Reporter = QUIET,
    left_out: list[VmrunError] | None = None,
) -> list[RunHistory]:
    """The named runs (ids under results/, or paths), else every run under results/, oldest
    first; what could not be read is said on `out`, left out and, with `left_out`, appended
    there (`report --json` carries it)."""
    problems: list[VmrunError] = [] if left_out is None else left_out
    paths = find_runs(
        names,
        need=METRICS_NEEDED,
        hosts=hosts,
        cluster=cluster,
        settings=settings,
        verb=verb,
        out=out,
        problems=problems,
    )
    runs = load_runs(paths, problems)
    _warn(problems, out)
    if not runs:
        raise UsageError(f"no run to {verb}", hint="see the lines above")
    return runs


def find_runs(
    names: list[str] | None,
    *,
    need: Need,
    hosts: list[str] | None,
    cluster: str | None,
    settings: Callable[[], Settings],
    verb: str,
    out: Reporter,
    problems: list[VmrunError],
) -> list[Path]:
    """The named runs' folders, each fetched first when named by id and lacking what `need`
    says (one that could not be fetched goes to `problems` instead); no names: every run
    under results/, and none there is an error."""
    from vmrun.results.history import RunDataError

    project = project_dir()
    if not names:
        paths = run_dirs(project)
        if not paths:
            raise UsageError(
                f"no runs in {project / 'results'}",
                hint="`vmrun fetch` brings runs here from the hosts (`vmrun status` lists"
                f" them), as `vmrun {verb} RUN...` does; or train here: vmrun train --local",
                code="run-not-found",
            )
        return paths
    paths = []
    for name in names:
        path = run_path(name, project)
        named_by_id = path == project / "results" / name
        if named_by_id and not need.present(path):
            why = _fetch(path.name, hosts, cluster, settings, out)
            if why:
                here = f"{need.lacking} in {path}" if path.is_dir() else f"not in {path.parent}/"
                problems.append(RunDataError(name, f"{here} here, and {why}"))
                continue
        paths.append(path)
    return paths


def gather_provenance(
    names: list[str],
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    settings: Callable[[], Settings],
    verb: str = "diff",
    out: Reporter = QUIET,
) -> list[RunProvenance]:
    """The named runs' records and provenance, in the order named, each fetched first when
    named by id and none of its files is here; what could not be read is said on `out` and
    left out."""
    from vmrun.results.history import RunDataError
    from vmrun.results.provenance import load_provenance

    problems: list[VmrunError] = []
    paths = find_runs(
        names,
        need=RECORD_NEEDED,
        hosts=hosts,
        cluster=cluster,
        settings=settings,
        verb=verb,
        out=out,
        problems=problems,
    )
    runs = []
    for path in paths:
        try:
            runs.append(load_provenance(path))
        except RunDataError as exc:
            problems.append(exc)
    _warn(problems, out)
    return runs


def run_diffs(
    names: list[str] | None,
    *,
    flag: str = "diff",  # the command as the messages name it: "diff", "--diff"
    hosts: list[str] | None = None,
    cluster: str | None = None,
    settings: Callable[[], Settings],
    out: Reporter = QUIET,
) -> tuple[list[RunProvenance], list[RunDiff]]:
    """The runs, and what differs from the first to each of the others. Fewer than two
    named is refused before anything is fetched; fewer than two read, after."""
    from vmrun.results.rundiff import diff_runs

    given = list(names or [])
    if len(given) < 2:
        raise UsageError(f"{flag} needs two runs or more (got {len(given)})")
    runs = gather_provenance(given, hosts=hosts, cluster=cluster, settings=settings, out=out)
    if len(runs) < 2:
        raise UsageError(
            f"{flag}: {len(runs)} of the {len(given)} runs could be read, nothing to compare",
            hint="see the lines above",
        )
    return runs, [diff_runs(runs[0], other) for other in runs[1:]]


def _warn(problems: list[VmrunError], out: Reporter) -> None:
    for problem in problems:
        out.warn(f"{problem.one_line()}; left out")


Place = tuple[list[str] | None, str | None, str | None]  # -H's hosts, a cluster, a bucket


def _places(hosts: list[str] | None, cluster: str | None, settings: Settings) -> list[Place]:
    """Where to look for a run, in order: -C's cluster, else -H's hosts (or the project's
    hosts and clusters); then the bucket runs are copied to (`store`), where a run outlives
    its hosts."""
    from vmrun.backends.select import listed_targets

    store: list[Place] = [(None, None, settings.store)] if settings.store else []
    found = listed_targets(settings, hosts=hosts, cluster=cluster, or_hosts=False)
    return [(t.host_list, t.cluster, None) for t in found] + store


def _fetch(
    run: str,
    hosts: list[str] | None,
    cluster: str | None,
    settings: Callable[[], Settings],
    out: Reporter,
) -> str:
    """Fetch the run's metrics and logs; "" when done (said on `out`), else why not."""
    from vmrun.operations.fetch import FetchJob, fetch

    resolved = settings()
    places = _places(hosts, cluster, resolved)
    if not places:
        return (
            "there are no hosts, clusters or store to fetch it from (-H, -C, --store, or"
            " vmrun.toml)"
        )
    reasons = []
    for where_hosts, where_cluster, where_store in places:
        job = FetchJob(
            items=["metrics", "logs"],
            settings=resolved,
            run=run,
            hosts=where_hosts,
            cluster=where_cluster,
            store=where_store,
        )
        try:
            fetched = fetch(job, out)
        except VmrunError as exc:
            reasons.append(exc.one_line())
            continue
        if fetched.ref is not None:
            for error in fetched.ref.unreached.values():
                out.failure(error)
        for outcome in fetched.outcomes:
            if outcome.error is not None:
                out.failure(outcome.error)
        code = fetched.exit_code
        if code != 0:
            return f"fetching it failed (exit {code})"
        files = sum(len(report.fetched) for report in fetched.reports)
        nodes = ", ".join(report.host for report in fetched.reports)
        out.info(f"run {run}: fetched {files} file(s) of its metrics and logs from {nodes}")
        return ""
    return "could not be fetched: " + "; ".join(reasons)
