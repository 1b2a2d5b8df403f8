"""Drive HostSetup over many hosts and show it: a live line per host, then a summary."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer

from vmrun.cli.output import error_line, report
from vmrun.config import Settings
from vmrun.errors import CommandFailed
from vmrun.inventory import HostEntry, record_hosts
from vmrun.provision import HostReport, SetupOptions


class _Status:
    """Current step and start time per host, rendered live (tty) or as plain lines."""

    def __init__(self, labels: list[str], live: bool):
        self.lock = threading.Lock()
        self.doing = dict.fromkeys(labels, "connecting")
        self.started = time.monotonic()
        self.live = live

    def event(self, host: str, text: str) -> None:
        with self.lock:
            self.doing[host] = text
        if not self.live:
            typer.echo(f"[{host}] {text}")

    def render(self) -> Any:
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("host")
        table.add_column("now")
        table.add_column("elapsed", justify="right")
        elapsed = time.monotonic() - self.started
        with self.lock:
            for host, text in self.doing.items():
                table.add_row(host, text, f"{elapsed:.0f} s")
        return table


def run_setup(
    entries: list[HostEntry],
    settings: Settings,
    options: SetupOptions,
    *,
    record: bool,
    project: Path,
    started: float,
) -> int:
    from vmrun.group import Group, worst_exit_code
    from vmrun.provision import HostSetup

    labels = [e.label for e in entries]
    status = _Status(labels, live=sys.stdout.isatty())

    def work(entry: HostEntry, conn: Any) -> HostReport:
        try:
            return HostSetup(conn, options, status.event).run()
        except BaseException:
            status.event(entry.label, "failed")
            raise

    with Group(entries, settings) as group:
        if status.live:
            from rich.live import Live

            with Live(status.render(), refresh_per_second=4, transient=True) as live:
                stop = threading.Event()

                def refresh() -> None:
                    while not stop.wait(0.25):
                        live.update(status.render())

                ticker = threading.Thread(target=refresh, daemon=True)
                ticker.start()
                try:
                    outcomes = group.map(work)
                finally:
                    stop.set()
        else:
            outcomes = group.map(work)

    for outcome in outcomes:
        if outcome.error is not None:
            report(outcome.error)
            if isinstance(outcome.error, CommandFailed) and outcome.error.output_tail:
                for line in outcome.error.output_tail.splitlines()[-8:]:
                    sys.stderr.write(f"    {line}\n")
            continue
        host_report = outcome.value
        assert host_report is not None
        if options.dry_run:
            _print_plan(host_report)
        else:
            _print_summary(host_report, outcome.duration)
    succeeded = [e for e, o in zip(entries, outcomes, strict=True) if o.ok]
    if record and succeeded:
        _record(project, entries, outcomes)
    failed = len(outcomes) - len(succeeded)
    if failed and len(outcomes) > 1:
        error_line(f"{failed} of {len(outcomes)} hosts failed")
    return worst_exit_code(outcomes)


def _record(project: Path, entries: list[HostEntry], outcomes: list[Any]) -> None:
    """Successful hosts into vmrun.toml with the interpreter setup made, so `vmrun train`
    needs no host argument; a listed host whose interpreter changed gets the new one."""
    seen = [
        HostEntry(e.spec, e.name, e.groups, {**e.vars, "python": o.value.python})
        for e, o in zip(entries, outcomes, strict=True)
        if o.ok
    ]
    done = record_hosts(project, seen)
    where = project / "vmrun.toml"
    if done.added:
        typer.echo(f"recorded {len(done.added)} host(s) in {where}")
    if done.updated:
        labels = ", ".join(e.label for e in done.updated)
        typer.echo(f"updated the python of {labels} in {where}")


def _print_plan(host_report: HostReport) -> None:
    facts = host_report.facts
    gpu = f"{facts.gpus} NVIDIA GPU(s)" if facts.has_gpu else "no NVIDIA GPU"
    typer.echo(
        f"{host_report.host}: {facts.os_name or 'unknown OS'}, {gpu}; python {host_report.python}"
    )
    for note in host_report.notes:
        typer.echo(f"  note: {note}")
    for step in host_report.steps:
        if step.status == "would-run":
            typer.echo(f"  would run {step.name} ({step.detail})")
            for line in step.script.rstrip().splitlines():
                typer.echo(f"      {line}")
        else:
            typer.echo(f"  skip {step.name}: {step.detail or step.status}")


def _print_summary(host_report: HostReport, seconds: float) -> None:
    ran = host_report.ran
    skipped = [s.name for s in host_report.steps if s.status in ("skipped", "adopted")]
    facts = host_report.facts
    rec = host_report.record
    gpu_note = "" if facts.has_gpu else "; no NVIDIA GPU (CPU environment)"
    parts = [f"python={host_report.python}"]
    parts += [
        f"{k}={rec[k]}"
        for k in ("torch", "cuda", "cuda_available", "gpus", "nccl", "gpu_names")
        if k in rec
    ]
    reboot = ", rebooted" if host_report.rebooted else ""
    typer.echo(
        f"{host_report.host}: ok in {seconds:.1f} s{reboot}: ran {len(ran)}"
        f" ({', '.join(ran) or 'nothing'}), {len(skipped)} already done{gpu_note}"
    )
    typer.echo(f"  {' '.join(parts)}")
