"""`vmrun plot [RUN]...`: a metric of each run by epoch or time, in the terminal or a file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    Runs,
    StoreFrom,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import make_console
from vmrun.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        "plot",
        help="Plot a metric of each run (one line per run, labelled by its nodes, processes"
        " and launcher): in the terminal, or with -o to a PNG or SVG file (needs matplotlib:"
        " pip install 'vmrun[plot]').",
    )
    @reaching(parallel=False)
    def plot_command(
        runs: Runs = None,
        output: Annotated[
            Path | None,
            typer.Option(
                "--output", "-o", metavar="FILE", help="Write FILE.png or FILE.svg instead."
            ),
        ] = None,
        metric: Annotated[
            str,
            typer.Option(
                "--metric",
                metavar="NAME",
                help="What to plot: loss, samples_per_s, eval_loss,"
                " accuracy, eval_accuracy, epoch_time_s, ... (any field of metrics.jsonl).",
            ),
        ] = "loss",
        x: Annotated[
            str,
            typer.Option(
                "--x",
                metavar="epoch|time",
                help="The x axis: epochs, or the"
                " training time (the sum of the epochs' times so far).",
            ),
        ] = "epoch",
        host: Hosts = None,
        cluster: ClusterName = None,
        store: StoreFrom = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.histories import gather
        from vmrun.results import plotting

        if x not in plotting.X_AXES:
            raise UsageError(f"--x {x}: expected one of {', '.join(plotting.X_AXES)}")
        if output is not None:
            _check_output(output)
        elif not sys.stdout.isatty():
            raise UsageError(
                "stdout is not a terminal, so there is nowhere to draw the plot",
                hint="write it to a file with -o plot.png (or plot.svg)",
            )
        refuse_with_cluster(cluster, host)
        histories = gather(
            runs,
            hosts=host,
            cluster=cluster,
            settings=lambda: reach.settings(**({"store": store} if store else {})),
            verb="plot",
            out=TERMINAL,
        )
        known = plotting.metric_names(histories)
        if metric not in known:
            raise UsageError(
                f"no run has a metric {metric!r}; these have: {', '.join(known)}",
                code="metric-not-found",
            )
        kept, lacking = plotting.with_metric(histories, metric, x)
        for run in lacking:
            by = "" if x == "epoch" else " with epoch times"
            TERMINAL.warn(f"run {run.run_id} has no {metric}{by}; left out of the plot")
        if not kept:
            raise UsageError(
                f"no run has {metric} with epoch times to plot by time", code="metric-not-found"
            )
        if output is not None:
            plotting.save_plot(kept, metric, output, x=x)
            TERMINAL.info(f"wrote {output} ({len(kept)} run{'s' if len(kept) > 1 else ''})")
        else:
            _draw(kept, metric, x)
        return 0


def _check_output(output: Path) -> None:
    """Before any work: a suffix we can write, matplotlib, and a folder to write into."""
    import importlib.util

    from vmrun.results.plotting import INSTALL_HINT, image_format

    image_format(output)
    try:
        missing = importlib.util.find_spec("matplotlib") is None
    except (ImportError, ValueError):  # a broken install, or one masked out
        missing = True
    if missing:
        raise UsageError(
            "plotting to a file needs matplotlib", hint=INSTALL_HINT, code="missing-dependency"
        )
    if not output.parent.is_dir():
        raise UsageError(f"-o {output}: there is no folder {output.parent}")
    if output.is_dir():
        raise UsageError(f"-o {output} is a folder: name the file to write")


def _draw(runs: list, metric: str, x: str) -> None:

    from vmrun.cli.plot_term import render
    from vmrun.results import plotting

    console = make_console()
    looks = plotting.COLOURS * (len(runs) // len(plotting.COLOURS) + 1)
    text = render(
        [plotting.series(r, metric, x) for r in runs],
        plotting.labels(runs),
        looks[: len(runs)],
        title=plotting.title(metric, x),
        x_label=plotting.X_AXES[x],
        y_label=metric,
        width=min(console.width, 120),
    )
    console.print(text, highlight=False, soft_wrap=True)
