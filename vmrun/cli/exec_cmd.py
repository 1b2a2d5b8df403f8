"""`vmrun exec -- CMD ARGS...`: one command on every host in parallel, streamed live."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.options import AcceptNewHostKey, ConnectTimeout, Hosts, settings_from


def register(app: typer.Typer) -> None:
    @app.command(
        "exec",
        context_settings={"allow_interspersed_args": False},
        help="Run a command on one or all hosts in parallel; output is prefixed by host and"
        " the exit code is the worst host's.",
    )
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
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.cli.output import PrefixedWriter, error_line, report
        from vmrun.ssh.channel import command_line
        from vmrun.ssh.group import Group, worst_exit_code
        from vmrun.ssh.inventory import select_hosts

        settings = settings_from(connect_timeout, accept_new_host_key)
        entries = select_hosts(host, settings)
        from vmrun.ssh.envvars import parse_env

        env_map = parse_env(env)
        labels = [e.label for e in entries]
        writer = PrefixedWriter(labels, prefix=prefix if prefix is not None else len(labels) > 1)

        def work(entry, conn):
            return conn.run(
                command,
                env=env_map,
                cwd=cwd,
                timeout=timeout,
                on_output=lambda stream, data: writer.line(entry.label, stream, data),
                what=command_line(tuple(command)),
            )

        with Group(entries, settings) as group:
            outcomes = group.map(work)
        failed = 0
        for outcome in outcomes:
            if outcome.error is not None:
                failed += 1
                report(outcome.error)
            elif outcome.value is not None and not outcome.value.ok:
                failed += 1
                error_line(
                    f"{outcome.host}: exited with {outcome.value.exit_status}",
                    code="command-failed",
                )
        if failed and len(outcomes) > 1:
            error_line(f"{failed} of {len(outcomes)} hosts failed", code="hosts-failed")
        return worst_exit_code(outcomes)
