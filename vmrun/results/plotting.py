"""A metric per run, as lines: the series, their labels, and the image file.

matplotlib (the `plot` extra) is imported by `save_plot` alone, with its Agg canvas and no
pyplot, so nothing else pays for it. Colours come from a fixed cycle, `COLOURS` (matplotlib's
tab10 with its grey swapped for indigo: antialiased black text is grey), in the order the
runs are given, so a reader (or a test) knows which line is which run; in an SVG every line
also carries the id `run-<run id>`. Runs can draw the very same curve (two sizes of one
world size train alike, by the template's design): each line also has its own dash pattern
and marker, the markers of line i starting at a point of its own, so a line drawn over
another leaves the one below visible.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from vmrun.errors import UsageError, VmrunError
from vmrun.results.history import RunHistory

COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#393b79",
    "#bcbd22",
    "#17becf",
)
STYLES = ("-", "--", "-.", (0, (6, 2, 1, 2, 1, 2)))  # by line, round and round
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", "*", ">", "h")  # 11: with 10 colours and
# 4 dashes, no two of the first 44 lines look alike
MARKS_PER_LINE = 8
X_AXES = {"epoch": "epoch", "time": "training time (s)"}
FORMATS = {".png": "png", ".svg": "svg"}
INSTALL_HINT = "pip install 'vmrun[plot]' (or: pip install matplotlib)"


def image_format(path: Path) -> str:
    """png or svg, by the file's suffix; anything else is refused before any work."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(
            f"-o {path}: can write .png or .svg, not {path.suffix or 'a file without a suffix'}"
        )
    return fmt


def metric_names(runs: Sequence[RunHistory]) -> list[str]:
    """Every metric any of the runs reports, sorted."""
    return sorted({name for run in runs for name in run.metric_names})


def with_metric(
    runs: Sequence[RunHistory], metric: str, x: str = "epoch"
) -> tuple[list[RunHistory], list[RunHistory]]:
    """The runs that have points of `metric` on axis `x`, and those that have none."""
    has = [bool(series(r, metric, x)) for r in runs]
    kept = [r for r, ok in zip(runs, has, strict=True) if ok]
    return kept, [r for r, ok in zip(runs, has, strict=True) if not ok]


def series(run: RunHistory, metric: str, x: str = "epoch") -> list[tuple[float, float]]:
    """(x, value) per epoch that reports the metric. x `time`: the training time by the end
    of that epoch (its epoch_time_s and every earlier one's); epochs without it are left out."""
    if x == "epoch":
        return [(float(epoch), value) for epoch, value in run.values(metric)]
    clock, points = 0.0, []
    for epoch in run.epochs:
        if "epoch_time_s" not in epoch:
            continue
        clock += epoch["epoch_time_s"]
        if metric in epoch:
            points.append((clock, epoch[metric]))
    return points


def shape_label(run: RunHistory) -> str:
    """`2 nodes x 2 procs (torchrun)`, as far as the run's record tells."""
    if run.nodes is None and run.procs_per_node is None:
        return run.run_id
    nodes = "?" if run.nodes is None else str(run.nodes)
    procs = "?" if run.procs_per_node is None else str(run.procs_per_node)
    text = f"{nodes} node{'' if run.nodes == 1 else 's'} x {procs} proc"
    text += "" if run.procs_per_node == 1 else "s"
    return f"{text} ({run.launcher})" if run.launcher else text


def labels(runs: Sequence[RunHistory], notes: Mapping[str, str] | None = None) -> list[str]:
    """One legend label per run: its shape and its note (a sweep's `cpus=2 lr=0.01`, by run
    id), plus its id where two runs would still read the same."""
    shapes = [shape_label(r) for r in runs]
    shapes = [
        f"{s} {notes[r.run_id]}" if notes and notes.get(r.run_id) else s
        for s, r in zip(shapes, runs, strict=True)
    ]
    return [
        s if shapes.count(s) == 1 or s == r.run_id else f"{s} {r.run_id}"
        for s, r in zip(shapes, runs, strict=True)
    ]


def look(i: int, points: int) -> dict[str, Any]:
    """Line i's colour, dash pattern and markers (about MARKS_PER_LINE of them, the first at
    point i of every `step`: lines that coincide show their markers in turn)."""
    step = max(1, -(-points // MARKS_PER_LINE))
    return {
        "color": COLOURS[i % len(COLOURS)],
        "linestyle": STYLES[i % len(STYLES)],
        "marker": MARKERS[i % len(MARKERS)],
        "markevery": (i % step, step),
        "markersize": 7,
    }


def title(metric: str, x: str) -> str:
    return f"{metric} by {'epoch' if x == 'epoch' else 'training time'}"


def save_plot(
    runs: Sequence[RunHistory],
    metric: str,
    path: Path,
    *,
    x: str = "epoch",
    notes: Mapping[str, str] | None = None,
) -> Path:
    """Draw one line per run into `path` (PNG or SVG by its suffix), atomically: the image
    is written beside it under a temporary name and renamed into place when complete.
    `notes`: by run id, what the legend adds to the run's shape."""
    fmt = image_format(path)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError(
            "plotting to a file needs matplotlib", hint=INSTALL_HINT, code="missing-dependency"
        ) from None
    fig = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (run, label) in enumerate(zip(runs, labels(runs, notes), strict=True)):
        points = series(run, metric, x)
        (line,) = ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            linewidth=2,
            label=label,
            **look(i, len(points)),
        )
        line.set_gid(f"run-{run.run_id}")
    ax.set_title(title(metric, x))
    ax.set_xlabel(X_AXES[x])
    if x == "epoch":  # whole epochs on the axis, not 1.25
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    ax.grid(True, color="#dddddd", linewidth=0.8)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    try:
        _write_atomically(path, lambda fh: fig.savefig(fh, format=fmt))
    except OSError as exc:
        raise VmrunError(
            f"cannot write {path}: {exc.strerror or exc}", code="write-failed"
        ) from None
    return path


def _write_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)  # as an ordinary new file, not mkstemp's 0600
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
