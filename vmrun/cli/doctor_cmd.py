"""`vmrun doctor`: check the hosts before a (multi-node) run; one verdict per check."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    Hosts,
    Reach,
    reaching,
)
from vmrun.cli.output import say

_COLOURS = {"ok": "32", "warn": "33", "fail": "31", "skip": "2"}


def register(app: typer.Typer) -> None:
    @app.command(
        "doctor",
        help="Check the hosts for training: SSH, Python/torch/CUDA/NCCL (the same on every"
        " host), GPUs, free disk, clocks, every pair of hosts reaching each other on the"
        " rendezvous port, the rendezvous address, and a short all-reduce across all nodes"
        " (bus bandwidth). Exits 1 if a check fails.",
    )
    @reaching()
    def doctor_command(
        host: Hosts = None,
        master: Annotated[
            str | None,
            typer.Option("--master", metavar="HOST", help="The rendezvous host [default: first]."),
        ] = None,
        rdzv_port: Annotated[
            int | None,
            typer.Option("--rdzv-port", metavar="PORT", help="The port to check [default: 29400]."),
        ] = None,
        allreduce: Annotated[
            bool,
            typer.Option("--allreduce/--no-allreduce", help="Run the all-reduce [default: yes]."),
        ] = True,
        size_mib: Annotated[
            float | None,
            typer.Option("--size-mib", metavar="MIB", help="All-reduce size [256 GPU, 16 CPU]."),
        ] = None,
        data: Annotated[
            list[str] | None,
            typer.Option(
                "--data",
                metavar="DIR",
                help="A folder every host must hold the same (`vmrun push`, `train --data`):"
                " relative to the project's work directory, ~/DIR or absolute; repeatable.",
            ),
        ] = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.output import use_colour
        from vmrun.config import find_project_dir
        from vmrun.doctor import Check, diagnose
        from vmrun.ssh.inventory import select_hosts

        settings = reach.settings()
        entries = select_hosts(host, settings)
        colour = use_colour(sys.stdout)
        width = max(len(e.label) for e in entries) * 2 + 4

        def show(check: Check) -> None:
            verdict = check.verdict.upper()
            if colour:
                verdict = f"\033[{_COLOURS[check.verdict]}m{verdict:<4}\033[0m"
            say(f"{check.name:<10} {check.where:<{width}} {verdict:<4}  {check.detail}")

        from pathlib import Path

        checks = diagnose(
            entries,
            settings,
            project=find_project_dir() or Path.cwd(),
            master=master,
            rdzv_port=rdzv_port,
            allreduce=allreduce,
            size_mib=size_mib,
            data=data or (),
            on_check=show,
        )
        failed = [c for c in checks if c.verdict == "fail"]
        warned = [c for c in checks if c.verdict == "warn"]
        summary = f"{len(failed)} failed, {len(warned)} warning(s), {len(checks)} checks"
        say(summary, err=True)
        return 1 if failed else 0
