"""`vmrun hosts`: which hosts a command would use, and (with --check) whether they answer."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.options import AcceptNewHostKey, ConnectTimeout, Hosts, Parallel, settings_from


def register(app: typer.Typer) -> None:
    @app.command("hosts", help="List the selected hosts; --check connects to each.")
    def hosts_command(
        host: Hosts = None,
        check: Annotated[bool, typer.Option("--check", help="Connect and run `true`.")] = False,
        connect_timeout: ConnectTimeout = None,
        parallel: Parallel = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.cli.output import report
        from vmrun.ssh.inventory import select_hosts

        settings = settings_from(connect_timeout, accept_new_host_key, parallel=parallel)
        entries = select_hosts(host, settings)
        if not check:
            for entry in entries:
                groups = f"  groups={','.join(entry.groups)}" if entry.groups else ""
                typer.echo(f"{entry.label}  {entry.spec.label}{groups}")
            return 0
        from vmrun.operations.hostlist import check as check_hosts

        outcomes, code = check_hosts(settings, entries)
        for outcome in outcomes:
            if outcome.ok:
                typer.echo(f"{outcome.host}  ok  {outcome.duration * 1000:.0f} ms")
            elif outcome.error is not None:
                report(outcome.error)
        return code
