"""A run as it is here, in `results/<run-id>/`: its shape, its per-epoch metrics, its times.

`vmrun fetch` leaves a run's files in `results/<run-id>/`, or in `results/<run-id>/<host>/`
when several hosts had it (rank 0's host has the metrics); `train --local` writes its run
there directly. The times differ by form: a host run's record has `started` and its
`exit_code` file's mtime (kept by fetch) is its end; a Slurm run's `starts` and `exit`
lines; a local run's `start_time` and `end_time`.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vmrun.errors import UsageError, VmrunError
from vmrun.results.failure import FILE as FAILURE
from vmrun.results.failure import WorkerFailure
from vmrun.results.layout import CLUSTER, HOSTS, LOCAL, RunLayout, layout_of
from vmrun.results.record import LocalEnd, RunRecord

RECORD = "run.json"
METRICS = "metrics.jsonl"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

Epoch = Mapping[str, float]


class RunDataError(
    UsageError, code="run-data-missing", meaning="a run to report has no results folder or metrics"
):
    """A run that cannot be reported: not here, or without metrics. Names the run."""

    def __init__(self, run: str, message: str, *, hint: str | None = None):
        super().__init__(f"run {run}: {message}", hint=hint)
        self.run = run


@dataclass(frozen=True)
class RunHistory:
    """One run, normalised from any of the three run.json forms plus its metrics.jsonl.
    Numbers are None where the files do not say."""

    run_id: str
    path: Path  # its results folder
    where: str  # "hosts", "cluster", "local" ("" without a run.json)
    hosts: tuple[str, ...]
    cluster: str | None
    launcher: str | None
    nodes: int | None
    procs_per_node: int | None
    world_size: int | None
    epochs_asked: int | None
    epochs: tuple[Epoch, ...]  # one mapping per epoch, by epoch number; numeric values only
    started: float | None  # Unix seconds
    ended: float | None
    exit_code: int | None
    failure: WorkerFailure | None = None  # torchrun's first failed worker (failure.json)
    failure_node: str | None = None  # the host folder it was found in, for a hosts run
    price_per_hour: float | None = None  # for all its nodes (run.json's; results.cost)
    currency: str = "USD"  # the prices' (run.json's)
    ran_before_s: float = 0.0  # a resumed run's earlier attempts, in all (run.json's)
    # each rank's step time, the median over its epochs, and its node (the template's
    # rank_step_s and rank_node in metrics.jsonl), where it says them
    rank_step_s: tuple[float, ...] | None = None
    rank_node: tuple[int, ...] | None = None
    record: RunRecord | None = None  # its run.json (None: it has none)

    @property
    def epochs_done(self) -> int:
        return int(self.epochs[-1]["epoch"]) if self.epochs else 0

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return max(0.0, self.ended - self.started)

    @property
    def ran_s(self) -> float | None:
        """Every attempt's time: what the run cost, at its prices (recoveries apart)."""
        return None if self.duration is None else self.ran_before_s + self.duration

    @property
    def metric_names(self) -> list[str]:
        """Every metric some epoch reports (not `epoch` itself), sorted."""
        return sorted({k for e in self.epochs for k in e} - {"epoch"})

    def values(self, metric: str) -> list[tuple[int, float]]:
        """(epoch, value) for every epoch that reports `metric`."""
        return [(int(e["epoch"]), e[metric]) for e in self.epochs if metric in e]

    def last(self, metric: str) -> float | None:
        found = self.values(metric)
        return found[-1][1] if found else None


def iso_utc(seconds: float | None) -> str | None:
    """ISO 8601 in UTC, to the second (`2026-01-02T03:04:05+00:00`)."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def is_run_dir(path: Path) -> bool:
    """A run's folder: its record or metrics here, or in a folder per host below it."""
    return any((d / RECORD).is_file() or (d / METRICS).is_file() for d in (path, *subdirs(path)))


def run_dirs(project: Path) -> list[Path]:
    """Every run under the project's results/, oldest first (by its start, else mtime)."""
    base = project / "results"
    found = [d for d in subdirs(base) if is_run_dir(d)]
    return sorted(found, key=lambda d: (_start_of(d), d.name))


def run_path(name: str, project: Path) -> Path:
    """A run named by id (`results/<id>/` of the project) or by a path to its folder."""
    if "/" in name or name in (".", "..") or not _RUN_ID.fullmatch(name):
        return Path(name).expanduser()
    return project / "results" / name


def load_runs(
    paths: Iterable[Path | str], problems: list[VmrunError] | None = None
) -> list[RunHistory]:
    """Each folder as a RunHistory (the same folder once). With `problems`, a run that
    cannot be read is appended there and left out; without, its error is raised."""
    runs: list[RunHistory] = []
    seen: set[Path] = set()
    for path in paths:
        key = Path(path).resolve()
        if key in seen:
            continue
        seen.add(key)
        try:
            runs.append(load_run(Path(path)))
        except RunDataError as exc:
            if problems is None:
                raise
            problems.append(exc)
    return runs


def load_run(path: Path) -> RunHistory:
    """The run in this folder; RunDataError if it is not there or has no metrics."""
    name = path.name or str(path)
    if not path.is_dir():
        raise RunDataError(name, f"no results folder {path}")
    places = run_places(path)
    records = [read_record(d) for d in places]
    record = next((r for r in records if r), RunRecord.from_json({}))
    metrics_file = _metrics_file(places)
    if metrics_file is None:
        raise RunDataError(name, f"no {METRICS} in {path}", hint="it has nothing to report")
    epochs = read_metrics(metrics_file)
    if not epochs:
        raise RunDataError(name, f"{metrics_file} holds no epochs")
    world = [e["world_size"] for e in epochs if "world_size" in e]
    layout = layout_of(record, world_size=int(world[-1]) if world else None)
    started, ended, code = _times(layout, record, places)
    fields = asdict(layout)
    return RunHistory(
        run_id=record.run_id or name,
        path=path,
        **fields,
        epochs=epochs,
        started=started,
        ended=ended,
        exit_code=code,
        **_failure(places, multi=len(places) > 1 or path not in places),
        price_per_hour=record.price_per_hour,
        currency=record.currency,
        ran_before_s=record.ran_before_s,
        **read_rank_times(metrics_file),
        record=record or None,
    )


def read_rank_times(path: Path) -> dict[str, Any]:
    """Each rank's median step time over the epochs that report them all, and its node."""
    per_epoch: list[list[float]] = []
    nodes = None
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            times = item.get("rank_step_s") if isinstance(item, dict) else None
            if (
                isinstance(times, list)
                and times
                and all(isinstance(t, (int, float)) for t in times)
            ):
                if per_epoch and len(times) != len(per_epoch[0]):
                    per_epoch = []  # another world size (a resume on fewer nodes): anew
                per_epoch.append([float(t) for t in times])
                found = item.get("rank_node")
                nodes = tuple(int(n) for n in found) if isinstance(found, list) else None
    if not per_epoch:
        return {}
    medians = tuple(statistics.median(column) for column in zip(*per_epoch, strict=True))
    return {
        "rank_step_s": medians,
        "rank_node": nodes if nodes and len(nodes) == len(medians) else None,
    }


def rank_series(path: Path) -> tuple[dict[int, list[tuple[int, float]]], tuple[int, ...] | None]:
    """Each rank's step time epoch by epoch (metrics.jsonl's `rank_step_s`), from the run's
    folder (as load_run finds its metrics), and each rank's node as the last line says; a
    repeated epoch (a resume) keeps its last line. ({}, None) where none are recorded."""
    found = _metrics_file(run_places(path))
    by_epoch: dict[int, list[float]] = {}
    nodes = None
    with contextlib.suppress(OSError), (found or path / METRICS).open(errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            times = item.get("rank_step_s") if isinstance(item, dict) else None
            if not (isinstance(times, list) and all(_is_number(t) for t in times)):
                continue
            epoch = item.get("epoch")
            by_epoch[epoch if _is_number(epoch) else number] = [float(t) for t in times]
            told = item.get("rank_node")
            nodes = tuple(int(n) for n in told) if isinstance(told, list) else None
    series: dict[int, list[tuple[int, float]]] = {}
    for epoch in sorted(by_epoch):
        for rank, seconds in enumerate(by_epoch[epoch]):
            series.setdefault(rank, []).append((int(epoch), seconds))
    return series, nodes if nodes and len(nodes) == len(series) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _failure(places: list[Path], *, multi: bool) -> dict[str, Any]:
    """The first failure.json among the run's folders (its host's, for a hosts run)."""
    for place in places:
        try:
            found = WorkerFailure.parse((place / FAILURE).read_text())
        except OSError:
            continue
        if found is not None:
            return {"failure": found, "failure_node": place.name if multi else None}
    return {}


def read_metrics(path: Path) -> tuple[Epoch, ...]:
    """One mapping per epoch: numeric fields only; a line that is not JSON (a run still
    writing) is skipped; a repeated epoch (a resumed run) keeps its last line."""
    by_epoch: dict[int, dict[str, float]] = {}
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if not isinstance(item, dict):
                continue
            values = {
                k: float(v)
                for k, v in item.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            }
            epoch = int(values.get("epoch", number))
            by_epoch[epoch] = {**values, "epoch": float(epoch)}
    return tuple(by_epoch[e] for e in sorted(by_epoch))


def subdirs(path: Path) -> list[Path]:
    """The folders in `path`, hidden ones left out, sorted; none when it cannot be read."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def run_places(path: Path) -> list[Path]:
    """Where the run's files are: the folder itself, or its folders per host."""
    if (path / RECORD).is_file() or (path / METRICS).is_file():
        return [path]
    return [d for d in subdirs(path) if (d / RECORD).is_file() or (d / METRICS).is_file()]


def _metrics_file(places: list[Path]) -> Path | None:
    """The metrics.jsonl with the most lines (rank 0's host's, when several have one)."""
    files = [d / METRICS for d in places if (d / METRICS).is_file()]
    return max(files, key=lambda f: f.stat().st_size, default=None)


def read_record(place: Path) -> RunRecord:
    """The run.json in this folder, any form (empty, `where` "", without a readable one)."""
    return RunRecord.from_json(json_object(place / RECORD))


def json_object(path: Path) -> dict[str, Any]:
    """A file's JSON object; {} when it is missing, not JSON, or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _start_of(path: Path) -> float:
    for place in run_places(path):
        record = read_record(place)
        started = _times(layout_of(record), record, [place])[0]
        if started is not None:
            return started
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _times(
    layout: RunLayout, record: RunRecord, places: list[Path]
) -> tuple[float | None, float | None, int | None]:
    """Start, end and exit code, each as the run's own form records it."""
    if layout.where == LOCAL:
        end = record.local or LocalEnd()
        return _iso(end.start_time), _iso(end.end_time), end.exit_code
    if layout.where == CLUSTER:
        starts = _lines(places, "starts")
        exits = _lines(places, "exit")
        started = _float(starts[0][1]) if starts and len(starts[0]) > 1 else None
        ended = _float(exits[-1][2]) if exits and len(exits[-1]) > 2 else None
        code = _int(exits[-1][1]) if exits and len(exits[-1]) > 1 else None
        submitted = record.job.submitted if record.job else None
        return started if started is not None else submitted, ended, code
    codes, ends = [], []
    for place in places if layout.where == HOSTS else []:
        try:
            codes.append(int((place / "exit_code").read_text().strip()))
            ends.append((place / "exit_code").stat().st_mtime)
        except (OSError, ValueError):
            continue
    failed = sorted((end, c) for c, end in zip(codes, ends, strict=True) if c)
    code = (failed[0][1] if failed else 0) if codes else None  # the first node to fail
    return record.started, max(ends, default=None), code


def _lines(places: list[Path], name: str) -> list[list[str]]:
    for place in places:
        try:
            return [ln.split() for ln in (place / name).read_text().splitlines() if ln.strip()]
        except OSError:
            continue
    return []


def _iso(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp.replace(tzinfo=stamp.tzinfo or timezone.utc).timestamp()


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
