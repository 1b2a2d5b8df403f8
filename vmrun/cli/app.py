"""The Typer application: one module per command, registered here."""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from vmrun import __version__

# One module per command, in the order `vmrun --help` lists them.
COMMAND_MODULES = (
    "setup_cmd",
    "train_cmd",
    "logs_cmd",
    "status_cmd",
    "stop_cmd",
    "fetch_cmd",
    "watch_gpus_cmd",
    "doctor_cmd",
    "exec_cmd",
    "hosts_cmd",
    "config_cmd",
)


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

    for name in COMMAND_MODULES:
        importlib.import_module(f"vmrun.cli.{name}").register(app)
    return typer.main.get_command(app)
