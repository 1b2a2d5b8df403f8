"""`vmrun watch-gpus`: every host's GPUs on one screen, live, from one SSH channel per host.

Telemetry lives in `vmrun.gpus.fleet`; this module draws it. rich (and paramiko, through
vmrun.gpus.fleet) is imported inside the command, so `vmrun --help` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.options import (
    AcceptNewHostKey,
    ClusterName,
    ConnectTimeout,
    Hosts,
    refuse_with_cluster,
    settings_from,
)
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

    from vmrun.config import Settings
    from vmrun.gpus.fleet import FleetWatch, GpuStatus, HostStatus
    from vmrun.gpus.targets import Target

SPARK_WIDTH = 8
_UNBOUNDED = 10_000  # columns of a console that is no terminal: rows are never cut
_SPARK = "▁▂▃▄▅▆▇█"
_SPARK_ASCII = "_.-:=+*#"
_STATE_LABEL = {
    "connecting": ("connecting", "dim"),
    "no-gpu": ("no GPU", "yellow"),
    "unreachable": ("unreachable", "red"),
    "disconnected": ("disconnected", "bold red"),
    "error": ("error", "red"),
}
_TICK = 0.5  # seconds between redraws when nothing new arrives (idle timers keep moving)


def register(app: typer.Typer) -> None:
    @app.command(
        "watch-gpus",
        help="Show every host's GPUs live: utilisation, memory, temperature, power and"
        " processes. One SSH channel per host streams nvidia-smi; nothing is started per"
        " refresh.",
    )
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
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        if not interval >= 0.1:
            raise UsageError(f"--interval must be at least 0.1 seconds, got {interval:g}")
        if not 0 <= idle_threshold <= 100:
            raise UsageError(f"--idle-threshold must be 0-100, got {idle_threshold:g}")
        if not idle_window >= 0:
            raise UsageError(f"--idle-window must be 0 or more, got {idle_window:g}")
        refuse_with_cluster(cluster, host)
        if (run or job) and not cluster:
            raise UsageError("--run and --job pick jobs on a cluster: add -C NAME")
        if run and job:
            raise UsageError("--run and --job both pick the job: use one")
        settings = settings_from(connect_timeout, accept_new_host_key)
        view = _View(interval, once, json_out, idle_threshold, idle_window)
        if cluster:
            return _watch_cluster(settings, cluster, run, job, view)
        from vmrun.gpus.targets import host_targets
        from vmrun.ssh.inventory import select_hosts

        return _watch(host_targets(select_hosts(host, settings), settings), settings, view)


@dataclass(frozen=True)
class _View:
    interval: float
    once: bool
    json_out: bool
    idle_threshold: float
    idle_window: float


def _watch_cluster(
    settings: Settings, cluster: str, run: str | None, job: str | None, view: _View
) -> int:
    from vmrun.slurm.gpus import node_targets, running_nodes
    from vmrun.slurm.session import cluster_backend

    with cluster_backend(settings, cluster) as slurm:
        nodes = running_nodes(slurm, run, job)
        if not nodes:
            which = f"run {run}" if run else f"job {job}" if job else "job of yours"
            print(f"no running {which} on cluster {cluster}: no GPU to watch", file=sys.stderr)
            return 0
        return _watch(node_targets(slurm, nodes), settings, view)


def _watch(targets: list[Target], settings: Settings, view: _View) -> int:
    from vmrun.gpus.fleet import Fleet, FleetWatch

    fleet = Fleet(
        [t.label for t in targets],
        idle_threshold=view.idle_threshold,
        idle_window=view.idle_window,
    )
    watch = FleetWatch(targets, settings, fleet, interval=view.interval, once=view.once)
    try:
        watch.start()
        if view.once:
            return _snapshot(watch, view.json_out)
        if view.json_out:
            return _json_lines(watch)
        return _live(watch, view.interval)
    except KeyboardInterrupt:
        if view.once:
            raise
        return 0  # Ctrl-C is how a watch ends; every channel is closed below
    except BrokenPipeError:  # `vmrun watch-gpus --json | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        watch.stop()


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
    sys.stdout.write(json.dumps(status.to_json()) + "\n")
    sys.stdout.flush()


def _live(watch: FleetWatch, interval: float) -> int:
    from rich.live import Live

    console = _console()
    threshold = watch.fleet.idle_threshold

    def view() -> RenderableType:
        statuses = watch.fleet.statuses()
        return render(statuses, console, threshold, interval=interval, fit=console.is_terminal)

    with Live(view(), console=console, auto_refresh=False, redirect_stderr=False) as live:
        while not watch.finished:
            watch.drain(_TICK)
            live.update(view(), refresh=True)
    return watch.fleet.exit_code()


def _console() -> Console:
    """The terminal's width; a pipe or file gets whole rows (grep and scripts read them)."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=_UNBOUNDED)
    return console


# -- rendering ------------------------------------------------------------------------------


def sparkline(values: Sequence[float | None], width: int, *, ascii_only: bool = False) -> str:
    """The last `width` utilisation values as bars; a gap where a value was unavailable."""
    levels = _SPARK_ASCII if ascii_only else _SPARK
    bars = []
    for value in list(values)[-width:]:
        if value is None:
            bars.append(" ")
        else:
            bars.append(levels[min(len(levels) - 1, max(0, int(value / 100 * len(levels))))])
    return "".join(bars).rjust(width)


def short_gpu_name(name: str) -> str:
    """Drop the brand ("NVIDIA H100 80GB HBM3" -> "H100 80GB HBM3"): the model is what varies."""
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}"


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _gpu_cells(gpu: GpuStatus, spark: int, ascii_only: bool) -> list[Text]:
    from rich.text import Text

    r = gpu.reading
    util = Text(f"{_num(r.utilization, '%'):>4}")
    if gpu.alert:
        util.stylize("bold white on red")
    elif gpu.idle_for is not None:
        util.stylize("yellow")
    elif r.utilization is not None and r.utilization >= 80:
        util.stylize("green")
    if spark:
        util.append(" " + sparkline(gpu.history, spark, ascii_only=ascii_only), style="cyan")

    memory = Text(f"{_gib(r.memory_used)}/{_gib(r.memory_total)}G")
    mem_ratio = _ratio(r.memory_used, r.memory_total)
    if mem_ratio is not None and mem_ratio >= 0.95:
        memory.stylize("bold red")
    elif mem_ratio is not None and mem_ratio >= 0.85:
        memory.stylize("yellow")

    temp = Text(_num(r.temperature, "C"))
    if r.temperature is not None and r.temperature >= 85:
        temp.stylize("bold red")
    elif r.temperature is not None and r.temperature >= 75:
        temp.stylize("yellow")

    power = Text(f"{_num(r.power_draw)}/{_num(r.power_limit)}W")
    power_ratio = _ratio(r.power_draw, r.power_limit)
    if power_ratio is not None and power_ratio >= 0.95:
        power.stylize("yellow")

    lines = []
    for proc in gpu.processes[:3]:
        mem = "" if proc.memory_used is None else f" {_gib(proc.memory_used)}G"
        owner = f" [{proc.run}]" if proc.run else ""
        lines.append(f"{proc.pid} {os.path.basename(proc.name) or proc.name}{mem}{owner}")
    if len(gpu.processes) > 3:
        lines.append(f"+{len(gpu.processes) - 3} more")
    procs = Text("\n".join(lines) or "-", style="" if lines else "dim", no_wrap=True)
    name = Text(f"{r.index} {short_gpu_name(r.name)}")
    return [name, util, memory, temp, power, procs]


def render(
    statuses: Sequence[HostStatus],
    console: Console,
    threshold: float,
    *,
    interval: float | None,
    fit: bool = True,
) -> RenderableType:
    """Title, one row per GPU (hosts in the order given, GPUs by index), then idle alerts;
    `fit` ellipsizes names to the console's width (a terminal), else nothing is cut."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    ascii_only = not console.encoding.lower().startswith("utf")
    spark = SPARK_WIDTH if interval is not None else 0  # a snapshot has no history to draw
    now = time.time()
    headers = ["host", "gpu", "util", "memory", "temp", "power", "processes"]
    rows: list[list[Text]] = []
    alerts: list[Text] = []
    state_width = 6  # a host's state ("disconnected") is never ellipsized: it is the news
    for status in statuses:
        sample = status.sample
        host = Text(sample.host, style="bold")
        if sample.state != "ok":
            label, style = _STATE_LABEL.get(sample.state, (sample.state, "red"))
            message = Text(sample.message or "", style=style)
            blank = [Text("") for _ in range(4)]
            state_width = max(state_width, len(label))
            rows.append([host, Text(label, style=style), *blank, message])
            continue
        age = now - sample.time
        if interval is not None and age > max(3 * interval, 5):  # connected, yet silent
            host.stylize("dim")
            alerts.append(Text(f"? {sample.host}: no new sample for {age:.0f} s", style="yellow"))
        for i, gpu in enumerate(sorted(status.gpus, key=lambda g: g.reading.index)):
            rows.append([host if i == 0 else Text(""), *_gpu_cells(gpu, spark, ascii_only)])
            if gpu.alert and gpu.idle_for is not None:
                owner = next(p.run for p in gpu.processes if p.run)  # the alert needs one
                alerts.append(
                    Text(
                        f"! {sample.host} GPU {gpu.reading.index}: under {threshold:g}% for"
                        f" {gpu.idle_for:.0f} s while run {owner} holds it (data-loader"
                        " bottleneck?)",
                        style="bold red",
                    )
                )
    widths = _fit(headers, rows, console.width, state_width) if fit else _natural(headers, rows)
    table = Table(
        box=None, collapse_padding=True, pad_edge=False, show_edge=False, header_style="bold"
    )
    for header, width in zip(headers, widths, strict=True):
        right = header in ("memory", "temp", "power")
        table.add_column(
            header,
            width=width,
            no_wrap=header != "processes",
            overflow="ellipsis",
            justify="right" if right else "left",
        )
    for row in rows:
        table.add_row(*row)
    n_gpus = sum(len(s.gpus) for s in statuses)
    when = time.strftime("%H:%M:%S", time.localtime(now))
    every = f"every {interval:g} s" if interval is not None else "snapshot"
    title = Text(
        f"vmrun watch-gpus  {len(statuses)} host(s)  {n_gpus} GPU(s)  {every}  {when}",
        style="bold",
    )
    return Group(title, table, *alerts)


def _natural(headers: list[str], rows: list[list[Text]]) -> list[int]:
    """Each column as wide as its widest line."""
    from rich.cells import cell_len

    return [
        max([len(h)] + [max(map(cell_len, r[i].plain.split("\n"))) for r in rows])
        for i, h in enumerate(headers)
    ]


def _fit(headers: list[str], rows: list[list[Text]], width: int, least: int) -> list[int]:
    """Column widths for `width` columns: fixed-size numbers keep theirs; the host column is
    capped; the GPU name (at least `least` wide) and the processes share what is left
    (names ellipsized first)."""
    natural = _natural(headers, rows)
    natural[0] = min(natural[0], 32 if width >= 120 else 16)  # a node's label names its job
    padding = len(headers) - 1  # one space between columns
    fixed = natural[0] + sum(natural[2:6]) + padding
    rest = max(width - fixed, 16)
    name = min(natural[1], max(least, rest // 3))
    procs = max(rest - name, 9)
    return [natural[0], name, *natural[2:6], min(procs, max(natural[6], 9))]
