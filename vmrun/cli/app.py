"""The Typer application: one module per command, registered here."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmrun import __version__


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vmrun {__version__}")
        raise typer.Exit()


def build() -> Any:
    app = typer.Typer(
        name="vmrun",
        help="Take SSH-reachable GPU machines from bare to trained-and-fetched.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
        version: Annotated[
            bool,
            typer.Option(
                "--version", "-V", callback=_version, is_eager=True, help="Print the version."
            ),
        ] = False,
    ) -> None:
        """vmrun: setup, train, fetch and watch GPU hosts over plain SSH."""

    from vmrun.cli import config_cmd, exec_cmd, hosts_cmd, setup_cmd

    for module in (setup_cmd, exec_cmd, hosts_cmd, config_cmd):
        module.register(app)
    return typer.main.get_command(app)
