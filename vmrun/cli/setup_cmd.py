"""`vmrun setup HOST...`: provision hosts in parallel from a playbook, with a live view."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import say
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.config import Settings
    from vmrun.operations.setup import SetupRequest


def register(app: typer.Typer) -> None:
    @app.command(
        "setup",
        help="Provision hosts idempotently: NVIDIA driver (with reboot), a"
        " Python environment and PyTorch, then verify torch sees the"
        " GPUs. A second run skips what is done.",
    )
    @reaching()
    def setup_command(
        hosts: Annotated[
            list[str] | None,
            typer.Argument(
                metavar="[HOST]...",
                help="user@host[:port] or an alias; also -H.",
                show_default=False,
            ),
        ] = None,
        host: Hosts = None,
        cluster: ClusterName = None,
        gpus_per_node: Annotated[
            int,
            typer.Option(
                "--gpus-per-node",
                metavar="N",
                help="With -C: ask the compute-node check for N GPUs (0: none asked).",
            ),
        ] = 0,
        playbook: Annotated[
            Path | None,
            typer.Option(
                "--playbook", metavar="FILE", help="Run this playbook instead of the default."
            ),
        ] = None,
        extra: Annotated[
            list[Path] | None,
            typer.Option(
                "--extra", metavar="FILE", help="Add this YAML file's steps after the playbook's."
            ),
        ] = None,
        env_manager: Annotated[
            str | None,
            typer.Option(
                "--env-manager", metavar="venv|uv|conda|python", help="Environment manager."
            ),
        ] = None,
        env: Annotated[
            str | None,
            typer.Option("--env", hidden=True, help="Deprecated: --env-manager."),
        ] = None,
        python: Annotated[
            str | None,
            typer.Option(
                "--python", metavar="PATH", help="Use this existing interpreter (env=python)."
            ),
        ] = None,
        python_version: Annotated[
            str | None,
            typer.Option("--python-version", help="Python version for uv and conda envs."),
        ] = None,
        env_name: Annotated[
            str | None, typer.Option("--env-name", help="Environment name.")
        ] = None,
        torch: Annotated[
            str | None,
            typer.Option(
                "--torch", metavar="SPEC", help="pip spec for PyTorch, e.g. torch==2.13.0."
            ),
        ] = None,
        torch_index: Annotated[
            str | None,
            typer.Option(
                "--torch-index",
                metavar="auto|none|URL",
                help="Wheel index for torch; auto matches the driver's CUDA (CPU hosts: the CPU"
                " build).",
            ),
        ] = None,
        driver: Annotated[
            str | None,
            typer.Option(
                "--driver", metavar="auto|none|BRANCH", help="NVIDIA driver, e.g. 580-server."
            ),
        ] = None,
        pip: Annotated[
            str | None,
            typer.Option("--pip", metavar="REQS", help="Extra pip requirements, space-separated."),
        ] = None,
        container: Annotated[
            str | None,
            typer.Option(
                "--container",
                metavar="docker|podman|none",
                help="Also install a container engine for train --image (GPU hosts: the NVIDIA"
                " Container Toolkit) and check that the user can run containers.",
            ),
        ] = None,
        param: Annotated[
            list[str] | None,
            typer.Option("--param", metavar="NAME=VALUE", help="Set any playbook parameter."),
        ] = None,
        wheelhouse: Annotated[
            Path | None,
            typer.Option(
                "--wheelhouse",
                metavar="DIR",
                help="Upload this folder of wheels and pip-install from it with --no-index.",
            ),
        ] = None,
        installer: Annotated[
            Path | None,
            typer.Option("--installer", metavar="FILE", help="Upload this Miniconda installer."),
        ] = None,
        index_url: Annotated[str | None, typer.Option("--index-url", metavar="URL")] = None,
        find_links: Annotated[list[str] | None, typer.Option("--find-links", metavar="URL")] = None,
        force: Annotated[
            list[str] | None,
            typer.Option("--force", metavar="STEP", help="Run this step even if it is done."),
        ] = None,
        only: Annotated[
            list[str] | None,
            typer.Option("--only", metavar="STEP", help="Consider only this step."),
        ] = None,
        dry_run: Annotated[
            bool,
            typer.Option("--dry-run", help="Show what would run on each host; change nothing."),
        ] = False,
        reboot_timeout: Annotated[
            float,
            typer.Option(
                "--reboot-timeout", metavar="SECONDS", help="Wait this long for a reboot."
            ),
        ] = 600.0,
        record: Annotated[
            bool,
            typer.Option("--record/--no-record", help="Remember hosts that succeed in vmrun.toml."),
        ] = True,
        autostop: Annotated[
            str | None,
            typer.Option(
                "--autostop",
                metavar="PERIOD",
                help="Then install the autostop watchdog (as `vmrun autostop PERIOD`) on the"
                " hosts set up. Default: autostop in vmrun.toml.",
            ),
        ] = None,
        slurm: Annotated[
            str | None,
            typer.Option(
                "--slurm",
                metavar="NAME",
                help="Then make the hosts one Slurm cluster NAME (the first, or --controller,"
                " runs slurmctld; every host slurmd) and record it for -C NAME.",
            ),
        ] = None,
        controller: Annotated[
            str | None,
            typer.Option("--controller", metavar="HOST", help="With --slurm: the controller."),
        ] = None,
        shared: Annotated[
            str | None,
            typer.Option(
                "--shared",
                metavar="PATH",
                help="With --slurm: a folder every host mounts, where jobs run (checked);"
                " without it each run's project is synced to every node.",
            ),
        ] = None,
        slurmdbd: Annotated[
            bool,
            typer.Option(
                "--slurmdbd",
                help="With --slurm: accounting too (slurmdbd and MariaDB on the controller):"
                " sacct keeps every job.",
            ),
        ] = False,
        slurm_remove: Annotated[
            bool,
            typer.Option(
                "--slurm-remove",
                help="With --slurm NAME: take the cluster down on its hosts and forget it"
                " (packages stay).",
            ),
        ] = False,
        show_playbook: Annotated[
            bool, typer.Option("--show-playbook", help="Print the playbook and exit.")
        ] = False,
        as_json: Annotated[
            bool,
            typer.Option(
                "--json",
                help="Each host's steps and outcome as one JSON document; progress goes to stderr.",
            ),
        ] = False,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.setup import SetupRequest, env_manager_flag

        env_manager = env_manager_flag(env_manager, env, TERMINAL)
        if show_playbook:
            from vmrun.setup import playbook as playbook_mod

            book = playbook_mod.load(playbook)
            say(Path(book.source).read_text(encoding="utf-8"), end="")
            return 0
        targets = [*(hosts or []), *(host or [])]
        refuse_with_cluster(cluster, targets)
        if cluster and as_json:
            raise UsageError(
                "--json reports hosts' steps (-H); a cluster's setup (-C) prints its env's report",
                code="flags-conflict",
            )
        settings = reach.settings(autostop=autostop)
        if slurm is None and (controller or shared or slurm_remove or slurmdbd):
            raise UsageError(
                "--controller, --shared, --slurmdbd and --slurm-remove go with --slurm NAME",
                code="flags-conflict",
            )
        if slurm is not None and (cluster or as_json):
            raise UsageError(
                "--slurm makes a cluster of hosts (-H); it takes no -C or --json",
                code="flags-conflict",
            )
        if slurm is not None and slurm_remove:
            from vmrun.cli.queue_view import render_removed
            from vmrun.operations.queue import remove_cluster

            return render_removed(remove_cluster(settings, slurm, targets or None))
        request = SetupRequest(
            playbook=playbook,
            extra=extra or [],
            env_manager=env_manager,
            python=python,
            python_version=python_version,
            env_name=env_name,
            torch=torch,
            torch_index=torch_index,
            driver=driver,
            pip=pip,
            container=container,
            params=param or [],
            force=force or [],
            only=only or [],
            dry_run=dry_run,
            wheelhouse=wheelhouse,
            installer=installer,
            index_url=index_url,
            find_links=find_links or [],
            reboot_timeout=reboot_timeout,
        )
        if slurm is not None:
            return _make_cluster(
                settings, request, targets, slurm, controller, shared, accounting=slurmdbd
            )
        return _run(settings, request, targets, cluster, gpus_per_node, record, as_json=as_json)


def _make_cluster(
    settings: Settings,
    request: SetupRequest,
    targets: list[str],
    name: str,
    controller: str | None,
    shared: str | None,
    *,
    accounting: bool = False,
) -> int:
    """The hosts' setup shown as always, then the cluster made of them."""
    from vmrun.cli import setup_view as view
    from vmrun.cli.queue_view import render_made
    from vmrun.cli.terminal import Terminal
    from vmrun.operations.queue import make_cluster

    done = make_cluster(
        settings,
        request,
        targets or None,
        name,
        controller=controller,
        shared=shared,
        accounting=accounting,
        out=Terminal(),
    )
    code = view.render_hosts(done.setup)
    if done.made is None:
        return code
    return max(code, render_made(done.made, done.recorded_in))


def _run(
    settings: Settings,
    request: SetupRequest,
    targets: list[str],
    cluster: str | None,
    gpus_per_node: int,
    record: bool,
    *,
    as_json: bool = False,
) -> int:
    """One call to vmrun.operations.setup, shown; then the autostop watchdog on the hosts
    that succeeded (--autostop, or autostop in vmrun.toml), its exit code counted in."""
    from vmrun.cli import setup_view as view
    from vmrun.cli.terminal import Terminal
    from vmrun.errors import CommandFailed
    from vmrun.operations.setup import setup

    try:
        done = setup(
            settings,
            request,
            targets,
            cluster=cluster,
            gpus_per_node=gpus_per_node,
            record=record,
            out=Terminal(json=as_json),
        )
    except CommandFailed as exc:  # a cluster's step failed: its last lines say why
        if not cluster:
            raise
        return view.cluster_failed(exc)
    if cluster:
        return view.render_cluster(done)
    code = view.render_json(done) if as_json else view.render_hosts(done)
    if done.autostop is None:
        return code
    import contextlib

    from vmrun.cli.autostop_cmd import render_applied

    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        return max(code, render_applied(done.autostop))
