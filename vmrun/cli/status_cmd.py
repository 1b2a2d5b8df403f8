"""`vmrun status`: every run on the hosts, with state, progress, times and exit code."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from vmrun.cli.options import AcceptNewHostKey, ConnectTimeout, Hosts, settings_from


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def register(app: typer.Typer) -> None:
    @app.command(
        "status", help="List the runs on the hosts: state, progress, start, duration and exit code."
    )
    def status_command(
        host: Hosts = None,
        last: Annotated[
            int, typer.Option("--last", metavar="N", help="Only the newest N runs (0: all).")
        ] = 20,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.cli.output import report
        from vmrun.runs import records as runs
        from vmrun.ssh.group import Group, worst_exit_code
        from vmrun.ssh.inventory import select_hosts

        settings = settings_from(connect_timeout, accept_new_host_key)
        entries = select_hosts(host, settings)
        with Group(entries, settings) as group:
            outcomes = group.map(lambda entry, conn: runs.list_runs(conn))
        records = sorted(
            (r for o in outcomes if o.ok for r in o.value or []),
            key=lambda r: (r.started, r.id, r.host),
        )
        if last:
            keep = {r.id for r in records[-last:]}
            records = [r for r in records if r.id in keep]
        rows = [
            (
                r.id,
                r.host,
                r.state,
                r.progress or "-",
                time.strftime("%m-%d %H:%M", time.localtime(r.started)) if r.started else "-",
                _duration(r.duration),
                "-" if r.exit_code is None else str(r.exit_code),
            )
            for r in records
        ]
        headers = ("RUN", "HOST", "STATE", "PROGRESS", "STARTED", "DURATION", "EXIT")
        if sys.stdout.isatty():
            from rich.console import Console
            from rich.table import Table

            table = Table(*headers, box=None, header_style="bold")
            colours = {
                "running": "cyan",
                "done": "green",
                "failed": "red",
                "stopped": "yellow",
                "lost": "red",
            }
            for row in rows:
                table.add_row(*row[:2], f"[{colours.get(row[2], '')}]{row[2]}[/]", *row[3:])
            Console().print(table)
        else:
            widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
            for row in (headers, *rows):
                typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        for outcome in outcomes:
            if outcome.error is not None:
                report(outcome.error)
        return worst_exit_code([o for o in outcomes if not o.ok])
