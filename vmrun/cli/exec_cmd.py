"""`vmrun exec -- CMD ARGS...`: one command on every host in parallel, streamed live."""

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
    @app.command(
        "exec",
        context_settings={"allow_interspersed_args": False},
        help="Run a command on one or all hosts in parallel; output is prefixed by host and"
        " the exit code is the worst host's.",
    )
    @reaching()
    def exec_command(
        command: Annotated[
            list[str], typer.Argument(metavar="-- CMD [ARGS]...", show_default=False)
        ],
        host: Hosts = None,
        env: Annotated[
            list[str] | None,
            typer.Option(
                "--env",
                "-e",
                metavar="KEY[=VAL]",
                help="Set a variable for the command (sent over stdin, never on a command line);"
                " a bare KEY sends this machine's value. Repeatable.",
            ),
        ] = None,
        cwd: Annotated[
            str | None,
            typer.Option("--cwd", metavar="DIR", help="Run in this directory on the host."),
        ] = None,
        timeout: Annotated[
            float | None,
            typer.Option("--timeout", metavar="SECONDS", help="Stop the command after this long."),
        ] = None,
        prefix: Annotated[
            bool | None,
            typer.Option(
                "--prefix/--no-prefix",
                show_default=False,
                help="Prefix lines with [host] (default: when there are several hosts).",
            ),
        ] = None,
        as_json: Annotated[
            bool,
            typer.Option(
                "--json",
                help="Each host's exit status, error and output tails as one JSON document;"
                " the live lines go to stderr.",
            ),
        ] = False,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.output import PrefixedWriter, error_line, report
        from vmrun.operations.exec import run
        from vmrun.ssh.envvars import parse_env
        from vmrun.ssh.inventory import select_hosts

        settings = reach.settings()
        entries = select_hosts(host, settings)
        env_map = parse_env(env)
        labels = [e.label for e in entries]
        shown = prefix if prefix is not None else len(labels) > 1
        writer = PrefixedWriter(labels, prefix=shown, to_stderr=as_json)
        ran = run(
            command, settings, entries, env=env_map, cwd=cwd, timeout=timeout, on_output=writer.line
        )
        if as_json:
            say(ran.to_json())
            return ran.exit_code
        for failed in ran.failures:
            if failed.error is not None:
                report(failed.error)
            else:
                said = f"{failed.host}: exited with {failed.exit_status}"
                error_line(said, code="command-failed")
        if ran.failures and len(ran.outcomes) > 1:
            said = f"{len(ran.failures)} of {len(ran.outcomes)} hosts failed"
            error_line(said, code="hosts-failed")
        return ran.exit_code
