"""Drive a setup and show it: HostSetup over many hosts (a live line per host, then a
summary), or a cluster's env (`-C NAME`, plain lines)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from vmrun.cli.output import TERMINAL, error_line, report
from vmrun.config import Settings
from vmrun.errors import CommandFailed
from vmrun.setup.report import HostReport, SetupOptions, StepStatus
from vmrun.ssh.inventory import HostEntry, record_hosts

if TYPE_CHECKING:
    from vmrun.ssh.group import Group, Outcome


class _Status:
    """Per host: what it is doing now, since when, and since when it has been at it at all.

    Each host has its own clocks: "step" is the time on its current step, "total" the time
    since the host started (connecting included); both stop when the host is done or failed.
    Rendered live in a terminal, else printed as plain lines.
    """

    FINAL = ("done", "failed")

    def __init__(self, labels: list[str], live: bool, clock: Callable[[], float] = time.monotonic):
        self.lock = threading.Lock()
        self.clock = clock
        now = clock()
        self.doing = dict.fromkeys(labels, "connecting")
        self.began = dict.fromkeys(labels, now)  # the host's start
        self.since = dict.fromkeys(labels, now)  # its current step's start
        self.ended: dict[str, float] = {}  # when it finished (done or failed)
        self.download: dict[str, str] = {}  # a download's progress, while its step lasts
        self.live = live

    def event(self, host: str, text: str) -> None:
        with self.lock:
            now = self.clock()
            if host in self.ended:  # a late event after done/failed changes nothing
                return
            if text != self.doing.get(host):
                self.since[host] = now
                self.download.pop(host, None)
            self.doing[host] = text
            self.began.setdefault(host, now)
            if text in self.FINAL:
                self.ended[host] = now
        if not self.live:
            typer.echo(f"[{host}] {text}")

    def progress(self, host: str, text: str, notable: bool) -> None:
        """A download's progress, on the host's row until its step ends; without a terminal,
        only the notable lines (a download's end, one every few seconds) are printed."""
        with self.lock:
            if host in self.ended:
                return
            self.download[host] = text
        if not self.live and notable:
            typer.echo(f"[{host}] {text}")

    def rows(self) -> list[tuple[str, str, float, float]]:
        """(host, now, seconds on the current step, seconds since the host started)."""
        now = self.clock()
        with self.lock:
            out = []
            for host, text in self.doing.items():
                end = self.ended.get(host, now)
                step = 0.0 if host in self.ended else end - self.since[host]
                if host in self.download and host not in self.ended:
                    text = f"{text} | {self.download[host]}"
                out.append((host, text, step, end - self.began[host]))
            return out

    def render(self) -> Any:
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("host")
        table.add_column("now")
        table.add_column("step", justify="right")
        table.add_column("total", justify="right")
        for host, text, step, total in self.rows():
            table.add_row(host, text, "" if text in self.FINAL else _secs(step), _secs(total))
        return table


def _secs(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}:{seconds:02d}"


def run_setup(
    entries: list[HostEntry],
    settings: Settings,
    options: SetupOptions,
    *,
    record: bool,
    project: Path,
    started: float,
    then: Callable[[list[HostEntry]], int] | None = None,
) -> int:
    """Set the hosts up in parallel, live; `then`: what follows on the hosts that succeeded
    (the autostop watchdog), its exit code counted in."""
    from vmrun.setup.host_setup import HostSetup
    from vmrun.ssh.group import Group, worst_exit_code

    labels = [e.label for e in entries]
    status = _Status(labels, live=sys.stdout.isatty())

    def work(entry: HostEntry, conn: Any) -> HostReport:
        try:
            return HostSetup(conn, options, status.event, status.progress).run()
        except BaseException:
            status.event(entry.label, "failed")
            raise

    with Group(entries, settings) as group:
        outcomes = _map_live(group, work, status) if status.live else group.map(work)
    for outcome in outcomes:
        _print_outcome(outcome, options)
    succeeded = [e for e, o in zip(entries, outcomes, strict=True) if o.ok]
    if record and succeeded:
        _record(project, entries, outcomes)
    failed = len(outcomes) - len(succeeded)
    if failed and len(outcomes) > 1:
        error_line(f"{failed} of {len(outcomes)} hosts failed", code="hosts-failed")
    after = then(succeeded) if then is not None and succeeded else 0
    return max(worst_exit_code(outcomes), after)


def run_cluster_setup(
    settings: Settings, name: str, options: SetupOptions, gpus_per_node: int
) -> int:
    """`vmrun setup -C NAME`: the env on a cluster's shared filesystem, built on its login
    node and checked on a compute node (vmrun.backends.slurm.setup), shown as plain lines."""
    from vmrun.backends.slurm.setup import setup_cluster

    if gpus_per_node < 0:
        from vmrun.errors import UsageError

        raise UsageError(f"--gpus-per-node must be >= 0, got {gpus_per_node}")
    started = time.monotonic()

    def event(host: str, text: str) -> None:
        typer.echo(f"[{host}] {text}")

    def progress(host: str, text: str, notable: bool) -> None:
        if notable:
            typer.echo(f"[{host}] {text}")

    try:
        done = setup_cluster(
            settings,
            name,
            options,
            gpus_per_node=gpus_per_node,
            on_event=event,
            on_progress=progress,
        )
    except CommandFailed as exc:  # a step failed: its last lines say why
        report(exc)
        for line in exc.output_tail.splitlines()[-8:]:
            sys.stderr.write(f"    {line}\n")
        return 1
    if options.dry_run:
        _print_plan(done.report)
        typer.echo("  then: the env's python checked on a compute node (srun)")
        return 0
    _print_summary(done.report, time.monotonic() - started, options.params)
    if not done.report.ran:
        typer.echo(f"  {name}: nothing changed (the env in {done.workdir} was ready)")
    assert done.check is not None
    typer.echo(f"  {done.check.line()}")
    return 0


def _map_live(
    group: Group, work: Callable[[HostEntry, Any], HostReport], status: _Status
) -> list[Outcome[HostReport]]:
    """`group.map(work)` under a live table of every host's steps, redrawn four times a
    second."""
    from rich.live import Live

    with Live(status.render(), refresh_per_second=4, transient=True) as live:
        stop = threading.Event()

        def refresh() -> None:
            while not stop.wait(0.25):
                live.update(status.render())

        ticker = threading.Thread(target=refresh, daemon=True)
        ticker.start()
        try:
            return group.map(work)
        finally:
            stop.set()


def _print_outcome(outcome: Outcome[HostReport], options: SetupOptions) -> None:
    """One host's result: its error (and the failed command's last lines), its plan
    (`--dry-run`) or its summary."""
    if outcome.error is not None:
        report(outcome.error)
        if isinstance(outcome.error, CommandFailed) and outcome.error.output_tail:
            for line in outcome.error.output_tail.splitlines()[-8:]:
                sys.stderr.write(f"    {line}\n")
        return
    host_report = outcome.value
    assert host_report is not None
    if options.dry_run:
        _print_plan(host_report)
    else:
        _print_summary(host_report, outcome.duration, options.params)


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
    for line in done.not_applied:
        TERMINAL.warn(f"{line}; make that change by hand")


def _print_plan(host_report: HostReport) -> None:
    facts = host_report.facts
    gpu = f"{facts.gpus} NVIDIA GPU(s)" if facts.has_gpu else "no NVIDIA GPU"
    typer.echo(
        f"{host_report.host}: {facts.os_name or 'unknown OS'}, {gpu}; python {host_report.python}"
    )
    for note in host_report.notes:
        typer.echo(f"  note: {note}")
    for step in host_report.steps:
        if step.status == StepStatus.WOULD_RUN:
            typer.echo(f"  would run {step.name} ({step.detail})")
            for line in step.script.rstrip().splitlines():
                typer.echo(f"      {line}")
        else:
            typer.echo(f"  skip {step.name}: {step.detail or step.status}")


def _print_summary(host_report: HostReport, seconds: float, params: dict[str, str]) -> None:
    ran = host_report.ran
    skipped = [
        s.name for s in host_report.steps if s.status in (StepStatus.SKIPPED, StepStatus.ADOPTED)
    ]
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
    if params.get("env") == "conda":
        typer.echo(f"  {conda_channels_note(params.get('conda_channels', ''))}")


def conda_channels_note(channels: str) -> str:
    """Which conda channels the environment comes from, and so whether Anaconda's terms of
    service were involved (the default playbook's python-env step: `defaults` or conda-forge)."""
    if channels == "defaults":
        return (
            "conda channels: Anaconda's defaults (their Terms of Service accepted with"
            " `conda tos accept`)"
        )
    return (
        "conda channels: conda-forge only (--override-channels; Anaconda's Terms of Service"
        " not needed)"
    )
