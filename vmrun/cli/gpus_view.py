"""How `vmrun watch-gpus` draws the fleet: one row per GPU (utilisation with its history,
memory, temperature, power, processes named by their vmrun run), the host's autostop state
beside its first GPU, then the idle alerts. rich is imported by the callers' commands only."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text

    from vmrun.gpus.fleet import GpuStatus, HostSample, HostStatus

SPARK_WIDTH = 8
_SPARK = "▁▂▃▄▅▆▇█"
_SPARK_ASCII = "_.-:=+*#"
_STATE_LABEL = {
    "connecting": ("connecting", "dim"),
    "no-gpu": ("no GPU", "yellow"),
    "unreachable": ("unreachable", "red"),
    "disconnected": ("disconnected", "bold red"),
    "error": ("error", "red"),
}


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
    return [_name(gpu), util, memory, temp, power, procs]


def _name(gpu: GpuStatus) -> Text:
    """Index and name; its health flags between them (vmrun.gpus.health), so a narrow
    terminal cuts the name, never the flags."""
    from rich.text import Text

    r = gpu.reading
    name = Text(f"{r.index} ")
    if gpu.flags:
        name.append(" ".join(gpu.flags) + " ", style="bold red")
    name.append(short_gpu_name(r.name))
    return name


def render(
    statuses: Sequence[HostStatus],
    console: Console,
    threshold: float,
    *,
    interval: float | None,
    fit: bool = True,
    room: int | None = None,
) -> RenderableType:
    """Title, one row per GPU (hosts in the order given, GPUs by index; the host's autostop
    beside its first, when a host has one), then idle alerts; `fit` ellipsizes names to the
    console's width (a terminal), else nothing is cut. With more GPUs than `room` lines (a
    terminal's height), one row per host instead, the news first (`_by_host`)."""
    from rich.console import Group
    from rich.text import Text

    ascii_only = not console.encoding.lower().startswith("utf")
    spark = SPARK_WIDTH if interval is not None else 0  # a snapshot has no history to draw
    now = time.time()
    stop = any(s.sample.autostop and s.sample.autostop.installed for s in statuses)
    headers = ["host", "gpu", "util", "memory", "temp", "power", "processes", *["autostop"] * stop]
    rows: list[list[Text]] = []
    alerts: list[Text] = []
    state_width = 6  # a host's state ("disconnected") is never ellipsized: it is the news
    gpu_rows = sum(max(1, len(s.gpus)) for s in statuses)
    by_host = room is not None and gpu_rows + 2 > room
    shown, hidden = _by_host(statuses, room) if by_host and room is not None else (statuses, [])
    for status in shown:
        sample = status.sample
        host = Text(sample.host, style="bold")
        if sample.state != "ok":
            label, style = _STATE_LABEL.get(sample.state, (sample.state, "red"))
            message = Text(sample.message or "", style=style)
            blank = [Text("") for _ in range(4)]
            state_width = max(state_width, len(label))
            rows.append([host, Text(label, style=style), *blank, message, *_autostop(sample, stop)])
            continue
        age = now - sample.time
        if interval is not None and age > max(3 * interval, 5):  # connected, yet silent
            host.stylize("dim")
            alerts.append(Text(f"? {sample.host}: no new sample for {age:.0f} s", style="yellow"))
        if by_host:
            rows.append(
                [host, *_host_cells(status.gpus, spark, ascii_only), *_autostop(sample, stop)]
            )
        for i, gpu in enumerate(sorted(status.gpus, key=lambda g: g.reading.index)):
            if by_host:
                _alert(alerts, sample.host, gpu, threshold)
                continue
            cells = _gpu_cells(gpu, spark, ascii_only)
            if i == 0:
                rows.append([host, *cells, *_autostop(sample, stop)])
            else:
                rows.append([Text(""), *cells, *[Text("")] * stop])
            _alert(alerts, sample.host, gpu, threshold)
    widths = _fit(headers, rows, console.width, state_width) if fit else _natural(headers, rows)
    n_gpus = sum(len(s.gpus) for s in statuses)
    when = time.strftime("%H:%M:%S", time.localtime(now))
    every = f"every {interval:g} s" if interval is not None else "snapshot"
    title = Text(
        f"vmrun watch-gpus  {len(statuses)} host(s)  {n_gpus} GPU(s)  {every}  {when}",
        style="bold",
    )
    if hidden:
        alerts.insert(0, _hidden_line(hidden))
    return Group(title, _table(headers, widths, rows), *alerts)


def _table(headers: list[str], widths: list[int], rows: list[list[Text]]) -> RenderableType:
    from rich.table import Table

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
    return table


def _hidden_line(hidden: Sequence[HostStatus]) -> Text:
    """What the hosts left out have in common (or how many of them do not answer)."""
    from rich.text import Text

    silent = sum(1 for s in hidden if s.sample.state != "ok")
    if silent:
        return Text(
            f"+ {len(hidden)} more host(s) not shown, {silent} of them not answering",
            style="bold red",
        )
    lowest = min((u for u in map(_least_util, hidden) if u is not None), default=None)
    busy = "" if lowest is None else f"; every GPU on them {lowest:.0f}% busy or more"
    return Text(f"+ {len(hidden)} more host(s) not shown (all answering{busy})")


def _alert(alerts: list[Text], host: str, gpu: GpuStatus, threshold: float) -> None:
    from rich.text import Text

    if gpu.flags:
        alerts.append(
            Text(
                f"! {host} GPU {gpu.reading.index}: {', '.join(gpu.flags)}"
                f" (`vmrun doctor -H {host}` says what and what to do)",
                style="bold red",
            )
        )
    if gpu.alert and gpu.idle_for is not None:
        owner = next(p.run for p in gpu.processes if p.run)  # the alert needs one
        alerts.append(
            Text(
                f"! {host} GPU {gpu.reading.index}: under {threshold:g}% for"
                f" {gpu.idle_for:.0f} s while run {owner} holds it (data-loader"
                " bottleneck?)",
                style="bold red",
            )
        )


def _least_util(status: HostStatus) -> float | None:
    values = [g.reading.utilization for g in status.gpus if g.reading.utilization is not None]
    return min(values) if values else None


def _by_host(
    statuses: Sequence[HostStatus], room: int
) -> tuple[list[HostStatus], list[HostStatus]]:
    """Hosts as one row each, as many as `room` holds: those not answering first, then
    those with an idle alert, then the least busy GPUs; the rest (answering, busiest) are
    only counted."""

    def news(status: HostStatus) -> tuple[int, float]:
        if status.sample.state != "ok":
            return (0, 0.0)
        if any(g.alert for g in status.gpus):
            return (1, 0.0)
        lowest = _least_util(status)
        return (2, lowest if lowest is not None else -1.0)

    ranked = sorted(statuses, key=news)
    fits = max(1, room - 4)  # the title, the header, the "more" line, an alert
    if len(ranked) <= fits:
        return ranked, []
    return ranked[:fits], ranked[fits:]


def _host_cells(gpus: Sequence[GpuStatus], spark: int, ascii_only: bool) -> list[Text]:
    """A host's GPUs in one row: how many of which model, the least busy one's use (and its
    history), memory and power summed, the hottest, the runs holding them."""
    from rich.text import Text

    if not gpus:
        return [Text("-", style="dim"), *[Text("") for _ in range(5)]]
    readings = [g.reading for g in gpus]
    names = sorted({short_gpu_name(r.name) for r in readings})
    model = Text(f"{len(readings)}x {names[0]}" + (" (mixed)" if len(names) > 1 else ""))
    lowest = min(gpus, key=lambda g: g.reading.utilization or 0.0)
    util = _gpu_cells(lowest, spark, ascii_only)[1]
    util.append(" min")

    def total(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    used, whole = (
        total([r.memory_used for r in readings]),
        total([r.memory_total for r in readings]),
    )
    memory = Text(f"{_gib(used)}/{_gib(whole)}G")
    temps = [r.temperature for r in readings if r.temperature is not None]
    temp = Text(_num(max(temps) if temps else None, "C"))
    if temps and max(temps) >= 85:
        temp.stylize("bold red")
    draw, limit = total([r.power_draw for r in readings]), total([r.power_limit for r in readings])
    power = Text(f"{_num(draw)}/{_num(limit)}W")
    runs = sorted({p.run for g in gpus for p in g.processes if p.run})
    procs = Text(", ".join(runs) or "-", style="" if runs else "dim", no_wrap=True)
    return [model, util, memory, temp, power, procs]


def _autostop(sample: HostSample, shown: bool) -> list[Text]:
    """The host's autostop cell (vmrun.autostop.status), where the column is shown."""
    from rich.text import Text

    if not shown:
        return []
    said = sample.autostop.short() if sample.autostop else "-"
    style = {"blocked": "bold red", "not": "red", "idle": "yellow", "-": "dim"}
    return [Text(said, style=style.get(said.split()[0].rstrip(":"), ""))]


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
    autostop = [min(w, 40) for w in natural[7:]]  # the autostop column, when shown
    padding = len(headers) - 1  # one space between columns
    fixed = natural[0] + sum(natural[2:6]) + padding + sum(autostop)
    rest = max(width - fixed, 16)
    name = min(natural[1], max(least, rest // 3))
    procs = max(rest - name, 9)
    return [natural[0], name, *natural[2:6], min(procs, max(natural[6], 9)), *autostop]
