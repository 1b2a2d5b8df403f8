"""`vmrun setup -C NAME`: the env on a cluster's shared filesystem, built on its login node and
checked on a compute node (vmrun.backends.slurm.setup), shown as plain lines."""

from __future__ import annotations

import sys
import time

import typer

from vmrun.cli.output import report
from vmrun.config import Settings
from vmrun.errors import CommandFailed
from vmrun.setup.report import SetupOptions


def run_cluster_setup(
    settings: Settings, name: str, options: SetupOptions, gpus_per_node: int
) -> int:
    from vmrun.backends.slurm.setup import setup_cluster
    from vmrun.cli.setup_view import _print_plan, _print_summary

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
