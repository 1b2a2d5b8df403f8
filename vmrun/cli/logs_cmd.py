"""`vmrun logs [RUN] [-f] [-n N]`: a run's output, once or followed until the run ends."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from vmrun.cli.options import AcceptNewHostKey, ConnectTimeout, Hosts, settings_from
from vmrun.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        "logs",
        help="Show a run's log (default: the newest run); -f follows it until"
        " the run ends and exits with the run's exit code.",
    )
    def logs_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Follow until the run ends.")
        ] = False,
        lines: Annotated[
            int, typer.Option("--lines", "-n", metavar="N", help="Only the last N lines (0: all).")
        ] = 0,
        host: Hosts = None,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun import runs
        from vmrun.group import Group
        from vmrun.inventory import select_hosts

        if lines < 0:
            raise UsageError(f"--lines must be >= 0, got {lines}")
        settings = settings_from(connect_timeout, accept_new_host_key)
        entries = select_hosts(host, settings)

        def show(data: bytes) -> None:
            sys.stdout.write(data.decode("utf-8", "replace"))
            sys.stdout.flush()

        with Group(entries, settings) as group:
            run_id, found = runs.find_run(group, run)
            entry, _ = found[0]
            conn = group.connections[entry.label]
            if not follow:
                runs.read_log(conn, run_id, show, last=lines)
                return 0
            try:
                runs.follow(conn, run_id, show, last=lines)
            except KeyboardInterrupt:
                from vmrun.errors import Interrupted

                raise Interrupted(f"stopped following {run_id}; the run goes on") from None
            (record,) = runs.list_runs(conn, [run_id])
        if record.state == "stopped":
            sys.stderr.write(f"vmrun: run {run_id} was stopped\n")
        code = record.exit_code
        return code if code is not None and 0 <= code < 256 else 1
