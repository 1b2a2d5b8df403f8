"""`vmrun hosts`: which hosts a command would use, and (with --check) whether they answer."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    Hosts,
    Reach,
    reaching,
)
from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command("hosts", help="List the selected hosts; --check connects to each.")
    @reaching()
    def hosts_command(
        host: Hosts = None,
        check: Annotated[bool, typer.Option("--check", help="Connect and run `true`.")] = False,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.output import error_line, report
        from vmrun.ssh.inventory import select_hosts

        settings = reach.settings()
        entries = select_hosts(host, settings)
        if not check:
            for entry in entries:
                groups = f"  groups={','.join(entry.groups)}" if entry.groups else ""
                say(f"{entry.label}  {entry.spec.label}{groups}")
            return 0
        from vmrun.operations.hostlist import check as check_hosts

        def answered(label: str, seconds: float) -> None:
            say(f"{label}  ok  {seconds * 1000:.0f} ms")  # as each answers

        outcomes, code = check_hosts(settings, entries, answered)
        failed = [o for o in outcomes if o.error is not None]
        for outcome in failed:  # then the others, in host order
            report(outcome.error)
        if failed and len(outcomes) > 1:
            error_line(f"{len(failed)} of {len(outcomes)} hosts failed", code="hosts-failed")
        return code
