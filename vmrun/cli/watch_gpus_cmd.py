"""`vmrun watch-gpus`: every host's GPUs on one screen, live, from one SSH channel per host.

`vmrun.operations.gpus` picks the targets and starts the watch (telemetry lives in
`vmrun.gpus.fleet`); this module shows it live or as JSON lines, `vmrun.cli.gpus_view` draws
the table. rich (and paramiko, through vmrun.gpus.fleet) is imported inside the command, so
`vmrun --help` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.gpus_view import render
from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import make_console, say

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from vmrun.config import Settings
    from vmrun.gpus.fleet import FleetWatch, HostStatus
    from vmrun.reporting import Reporter

_UNBOUNDED = 10_000  # columns of a console that is no terminal: rows are never cut
_TICK = 0.5  # seconds between redraws when nothing new arrives (idle timers keep moving)


def register(app: typer.Typer) -> None:
    @app.command(
        "watch-gpus",
        help="Show every host's GPUs live: utilisation, memory, temperature, power and"
        " processes. One SSH channel per host streams nvidia-smi; nothing is started per"
        " refresh.",
    )
    @reaching()
    def watch_gpus_command(
        host: Hosts = None,
        interval: Annotated[
            float,
            typer.Option("--interval", metavar="SECONDS", help="Seconds between samples."),
        ] = 2.0,
        once: Annotated[bool, typer.Option("--once", help="One snapshot, then exit.")] = False,
        json_out: Annotated[
            bool,
            typer.Option(
                "--json",
                help="Print one JSON object per line per host sample (host, time, state,"
                " message, gpus, processes) instead of the table.",
            ),
        ] = False,
        idle_threshold: Annotated[
            float,
            typer.Option(
                "--idle-threshold",
                metavar="PERCENT",
                help="A GPU held by a vmrun run but busy less than this is idle.",
            ),
        ] = 10.0,
        idle_window: Annotated[
            float,
            typer.Option(
                "--idle-window",
                metavar="SECONDS",
                help="Alert when a GPU a vmrun run holds stays idle this long (a data-loader"
                " bottleneck?).",
            ),
        ] = 60.0,
        cluster: ClusterName = None,
        run: Annotated[
            str | None,
            typer.Option("--run", metavar="RUN", help="With -C: only the nodes of this run."),
        ] = None,
        job: Annotated[
            str | None,
            typer.Option("--job", metavar="ID", help="With -C: only the nodes of this job."),
        ] = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        refuse_with_cluster(cluster, host)
        settings = reach.settings()
        view = _View(interval, once, json_out, idle_threshold, idle_window)
        from vmrun.cli.terminal import TERMINAL

        return _watch(settings, host, cluster, run, job, view, TERMINAL)


@dataclass(frozen=True)
class _View:
    interval: float
    once: bool
    json_out: bool
    idle_threshold: float
    idle_window: float


def _watch(
    settings: Settings,
    hosts: list[str] | None,
    cluster: str | None,
    run: str | None,
    job: str | None,
    view: _View,
    out: Reporter,
) -> int:
    from vmrun.operations.gpus import watch as watch_gpus

    watching = watch_gpus(
        settings,
        hosts,
        cluster=cluster,
        run=run,
        job=job,
        interval=view.interval,
        once=view.once,
        idle_threshold=view.idle_threshold,
        idle_window=view.idle_window,
        out=out,
    )
    try:
        with watching as watch:
            if watch is None:
                return 0
            if view.once:
                return _snapshot(watch, view.json_out)
            if view.json_out:
                return _json_lines(watch)
            return _live(watch, view.interval)
    except KeyboardInterrupt:
        if view.once:
            raise
        return 0  # Ctrl-C is how a watch ends; every channel was closed on leaving the block
    except BrokenPipeError:  # `vmrun watch-gpus --json | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _snapshot(watch: FleetWatch, json_out: bool) -> int:
    while not watch.finished:
        watch.drain(_TICK)
    statuses = watch.fleet.statuses()
    if json_out:
        for status in statuses:
            _print_json(status)
    else:
        console = _console()
        threshold = watch.fleet.idle_threshold
        fit = console.is_terminal
        console.print(render(statuses, console, threshold, interval=None, fit=fit))
    return watch.fleet.exit_code()


def _json_lines(watch: FleetWatch) -> int:
    while not watch.finished:
        for status in watch.drain(_TICK):
            _print_json(status)
    return watch.fleet.exit_code()


def _print_json(status: HostStatus) -> None:
    say(json.dumps(status.to_json()))
    sys.stdout.flush()


def _live(watch: FleetWatch, interval: float) -> int:
    from rich.live import Live

    console = _console()
    threshold = watch.fleet.idle_threshold

    def view() -> RenderableType:
        statuses = watch.fleet.statuses()
        room = console.size.height if console.is_terminal else None  # 64 hosts never scroll
        return render(
            statuses, console, threshold, interval=interval, fit=console.is_terminal, room=room
        )

    with Live(view(), console=console, auto_refresh=False, redirect_stderr=False) as live:
        while not watch.finished:
            watch.drain(_TICK)
            live.update(view(), refresh=True)
    return watch.fleet.exit_code()


def _console() -> Console:
    """The terminal's width; a pipe or file gets whole rows (grep and scripts read them)."""

    console = make_console(highlight=False)
    if not console.is_terminal:
        console = make_console(highlight=False, width=_UNBOUNDED)
    return console
