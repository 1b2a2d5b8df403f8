"""Show a setup (vmrun.operations.setup): a live line per host while it works, then each
host's plan or summary; a cluster's env (`-C NAME`) as plain lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.cli.output import error_line, report, say, warn_line
from vmrun.errors import CommandFailed
from vmrun.operations.setup import SetUp
from vmrun.reporting import HostSteps
from vmrun.setup.report import HostReport, SetupOptions, StepStatus

if TYPE_CHECKING:
    from vmrun.ssh.group import Outcome
    from vmrun.ssh.inventory import Recorded


class _Status:
    """Per host: what it is doing now, since when, and since when it has been at it at all.

    Each host has its own clocks: "step" is the time on its current step, "total" the time
    since the host started (connecting included); both stop when the host is done or failed.
    Rendered live in a terminal, else printed as plain lines.
    """

    FINAL = ("done", "failed")

    def __init__(
        self,
        labels: list[str],
        live: bool,
        clock: Callable[[], float] = time.monotonic,
        *,
        to_stderr: bool = False,
    ):
        self.lock = threading.Lock()
        self.clock = clock
        now = clock()
        self.doing = dict.fromkeys(labels, "connecting")
        self.began = dict.fromkeys(labels, now)  # the host's start
        self.since = dict.fromkeys(labels, now)  # its current step's start
        self.ended: dict[str, float] = {}  # when it finished (done or failed)
        self.download: dict[str, str] = {}  # a download's progress, while its step lasts
        self.live = live
        self.to_stderr = to_stderr  # (--json: stdout holds the document alone)

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
            say(f"[{host}] {text}", err=self.to_stderr)

    def progress(self, host: str, text: str, notable: bool) -> None:
        """A download's progress, on the host's row until its step ends; without a terminal,
        only the notable lines (a download's end, one every few seconds) are printed."""
        with self.lock:
            if host in self.ended:
                return
            self.download[host] = text
        if not self.live and notable:
            say(f"[{host}] {text}", err=self.to_stderr)

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

    def render(self, room: int | None = None) -> Any:
        """The table; with more hosts than `room` lines, the ones worth a look (failed first,
        then the slowest steps; done hosts last) and a line counting the rest."""
        from rich.console import Group
        from rich.table import Table

        shown, summary = self.visible(room)
        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("host")
        table.add_column("now")
        table.add_column("step", justify="right")
        table.add_column("total", justify="right")
        for host, text, step, total in shown:
            table.add_row(host, text, "" if text in self.FINAL else _secs(step), _secs(total))
        return table if summary is None else Group(summary, table)

    def visible(self, room: int | None) -> tuple[list[tuple[str, str, float, float]], str | None]:
        """The rows that fit in `room` lines (a header and a summary line included), and
        the summary (None when every host fits)."""
        rows = self.rows()
        if room is None or len(rows) + 1 <= room:
            return rows, None

        def rank(row: tuple[str, str, float, float]) -> tuple[int, float]:
            text = row[1]
            return (0 if text == "failed" else 2 if text == "done" else 1, -row[2])

        shown = sorted(rows, key=rank)[: max(1, room - 2)]
        done = sum(1 for r in rows if r[1] == "done")
        failed = sum(1 for r in rows if r[1] == "failed")
        working = len(rows) - done - failed
        hidden = len(rows) - len(shown)
        summary = (
            f"{len(rows)} hosts: {failed} failed, {working} working, {done} done"
            f" ({hidden} not shown: the longest steps and failures come first)"
        )
        return shown, summary


def _secs(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}:{seconds:02d}"


class Watch(HostSteps):
    """What setup tells about each host, shown: on hosts a `_Status` (live in a terminal,
    else plain lines); on a cluster (never `watching`), plain `[host] text` lines."""

    def __init__(self, live: bool, *, to_stderr: bool = False):
        self.live = live
        self.to_stderr = to_stderr
        self.status: _Status | None = None

    def watching(self, hosts: list[str]) -> AbstractContextManager[object]:
        self.status = _Status(hosts, live=self.live, to_stderr=self.to_stderr)
        return _live_table(self.status) if self.live else nullcontext()

    def event(self, host: str, text: str) -> None:
        if self.status is not None:
            self.status.event(host, text)
        else:
            say(f"[{host}] {text}")

    def progress(self, host: str, text: str, notable: bool) -> None:
        if self.status is not None:
            self.status.progress(host, text, notable)
        elif notable:
            say(f"[{host}] {text}")


@contextmanager
def _live_table(status: _Status) -> Iterator[None]:
    """A live table of every host's steps, redrawn four times a second while it lasts."""
    from rich.live import Live

    def room() -> int:
        return max(4, live.console.size.height - 2)  # a 64-host table never scrolls away

    with Live(status.render(), refresh_per_second=4, transient=True) as live:
        live.update(status.render(room()))
        stop = threading.Event()

        def refresh() -> None:
            while not stop.wait(0.25):
                live.update(status.render(room()))

        ticker = threading.Thread(target=refresh, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()


def render_hosts(done: SetUp) -> int:
    """Each host's result, what was recorded in vmrun.toml, the count of failures; the exit
    code."""
    for outcome in done.outcomes:
        _print_outcome(outcome, done.options)
    if done.recorded is not None and done.recorded_in is not None:
        _print_recorded(done.recorded, done.recorded_in)
    if done.failed and len(done.outcomes) > 1:
        error_line(f"{done.failed} of {len(done.outcomes)} hosts failed", code="hosts-failed")
    return done.exit_code


def render_json(done: SetUp) -> int:
    """`setup --json`: one document, a host per entry in the order given; the exit code."""
    import json

    from vmrun.errors import error_json

    hosts = []
    for outcome in done.outcomes:
        item: dict[str, Any] = {
            "host": outcome.host,
            "ok": outcome.ok,
            "seconds": round(outcome.duration, 2),
        }
        if outcome.error is not None:
            item["error"] = error_json(outcome.error)
        if outcome.value is not None:
            item["steps"] = [
                {
                    "name": s.name,
                    "status": str(s.status),
                    "seconds": round(s.duration, 2),
                    **({"detail": s.detail} if s.detail else {}),
                }
                for s in outcome.value.steps
            ]
            item["python"] = outcome.value.python
            item["rebooted"] = outcome.value.rebooted
        hosts.append(item)
    document = {"hosts": hosts, "failed": done.failed, "dry_run": done.options.dry_run}
    say(json.dumps(document, indent=2))
    return done.exit_code


def render_cluster(done: SetUp) -> int:
    """`setup -C NAME`'s plan (--dry-run) or summary and the compute node's check."""
    assert done.on_cluster is not None and done.cluster is not None
    if done.options.dry_run:
        _print_plan(done.on_cluster.report)
        say("  then: the env's python checked on a compute node (srun)")
        return 0
    _print_summary(done.on_cluster.report, done.seconds, done.options.params)
    if not done.on_cluster.report.ran:
        say(f"  {done.cluster}: nothing changed (the env in {done.on_cluster.workdir} was ready)")
    assert done.on_cluster.check is not None
    say(f"  {done.on_cluster.check.line()}")
    return 0


def cluster_failed(exc: CommandFailed) -> int:
    """A cluster's step failed: its error, and the failed command's last lines say why."""
    report(exc)
    for line in exc.output_tail.splitlines()[-8:]:
        say(f"    {line}", err=True)
    return 1


def _print_outcome(outcome: Outcome[HostReport], options: SetupOptions) -> None:
    """One host's result: its error (and the failed command's last lines), its plan
    (`--dry-run`) or its summary."""
    if outcome.error is not None:
        report(outcome.error)
        if isinstance(outcome.error, CommandFailed) and outcome.error.output_tail:
            for line in outcome.error.output_tail.splitlines()[-8:]:
                say(f"    {line}", err=True)
        return
    host_report = outcome.value
    assert host_report is not None
    if options.dry_run:
        _print_plan(host_report)
    else:
        _print_summary(host_report, outcome.duration, options.params)


def _print_recorded(done: Recorded, where: Path) -> None:
    if done.added:
        say(f"recorded {len(done.added)} host(s) in {where}")
    if done.updated:
        labels = ", ".join(e.label for e in done.updated)
        say(f"updated the python of {labels} in {where}")
    for line in done.not_applied:
        warn_line(f"{line}; make that change by hand")


def _print_plan(host_report: HostReport) -> None:
    facts = host_report.facts
    gpu = f"{facts.gpus} NVIDIA GPU(s)" if facts.has_gpu else "no NVIDIA GPU"
    say(f"{host_report.host}: {facts.os_name or 'unknown OS'}, {gpu}; python {host_report.python}")
    for note in host_report.notes:
        say(f"  note: {note}")
    for step in host_report.steps:
        if step.status == StepStatus.WOULD_RUN:
            say(f"  would run {step.name} ({step.detail})")
            for line in step.script.rstrip().splitlines():
                say(f"      {line}")
        else:
            say(f"  skip {step.name}: {step.detail or step.status}")


TORCH_RECORDS = ("torch", "cuda", "cuda_available", "gpus", "nccl", "gpu_names")  # verify's
CONTAINER_RECORDS = ("container", "container_version", "container_gpus")  # --container's check


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
        for k in (
            "torch",
            "cuda",
            "cuda_available",
            "gpus",
            "nccl",
            "gpu_names",
            *CONTAINER_RECORDS,
        )
        if k in rec
    ]
    reboot = ", rebooted" if host_report.rebooted else ""
    say(
        f"{host_report.host}: ok in {seconds:.1f} s{reboot}: ran {len(ran)}"
        f" ({', '.join(ran) or 'nothing'}), {len(skipped)} already done{gpu_note}"
    )
    say(f"  {' '.join(parts)}")
    if params.get("env") == "conda":
        say(f"  {conda_channels_note(params.get('conda_channels', ''))}")


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
