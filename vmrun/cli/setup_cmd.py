"""`vmrun setup HOST...`: provision hosts in parallel from a playbook, with a live view."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmrun.cli.options import (
    AcceptNewHostKey,
    ClusterName,
    ConnectTimeout,
    Hosts,
    refuse_with_cluster,
    settings_from,
)
from vmrun.errors import UsageError
from vmrun.setting_types import period_seconds

if TYPE_CHECKING:
    from vmrun.setup.playbook import Playbook
    from vmrun.setup.report import SetupOptions

_FLAG_PARAMS = (
    "env",
    "python",
    "python_version",
    "env_name",
    "torch",
    "torch_index",
    "driver",
    "pip",
)


def resolve_params(
    defaults: dict[str, str],
    configured: dict[str, Any],
    environ: dict[str, str],
    flags: dict[str, str | None],
    pairs: list[str],
) -> dict[str, str]:
    """defaults < [setup] in config files < VMRUN_SETUP_<PARAM> < flags and --param."""
    params = dict(defaults)
    layers: list[tuple[str, dict[str, Any]]] = [
        (
            "[setup] in vmrun.toml/config.toml",
            {k: v for k, v in configured.items() if k != "steps"},
        ),
        (
            "environment",
            {
                k[len("VMRUN_SETUP_") :].lower(): v
                for k, v in environ.items()
                if k.startswith("VMRUN_SETUP_")
            },
        ),
        ("flags", {k: v for k, v in flags.items() if v is not None}),
    ]
    explicit = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--param {pair!r}: use --param NAME=VALUE")
        explicit[key.strip()] = value
    layers.append(("--param", explicit))
    for origin, layer in layers:
        for key, value in layer.items():
            if key not in params:
                known = ", ".join(sorted(params))
                raise UsageError(
                    f"unknown setup parameter {key!r} (from {origin}); the"
                    f" playbook's parameters: {known}"
                )
            params[key] = "" if value is None else str(value)
    if flags.get("python") and not flags.get("env"):
        params["env"] = "python"
    return params


def register(app: typer.Typer) -> None:
    @app.command(
        "setup",
        help="Provision hosts idempotently: NVIDIA driver (with reboot), a"
        " Python environment and PyTorch, then verify torch sees the"
        " GPUs. A second run skips what is done.",
    )
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
        show_playbook: Annotated[
            bool, typer.Option("--show-playbook", help="Print the playbook and exit.")
        ] = False,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        flags = {
            "env": env_manager_flag(env_manager, env),
            "python": python,
            "python_version": python_version,
            "env_name": env_name,
            "torch": torch,
            "torch_index": torch_index,
            "driver": driver,
            "pip": pip,
        }
        if show_playbook:
            from vmrun.setup import playbook as playbook_mod

            book = playbook_mod.load(playbook)
            typer.echo(Path(book.source).read_text(encoding="utf-8"), nl=False)
            return 0
        refuse_with_cluster(cluster, [*(hosts or []), *(host or [])])
        if cluster and autostop:
            raise UsageError("--autostop powers off hosts (-H); a cluster's nodes are the admins'")
        if autostop:
            period_seconds(autostop, what="--autostop")
        settings = settings_from(connect_timeout, accept_new_host_key, autostop=autostop)
        options = setup_options(
            settings.section("setup"),
            flags,
            playbook=playbook,
            extra=extra or [],
            params=param or [],
            force=force or [],
            only=only or [],
            dry_run=dry_run,
            wheelhouse=wheelhouse,
            installer=installer,
            index_url=index_url,
            find_links=find_links or [],
            reboot_timeout=reboot_timeout,
            log_dir=(settings.project_dir or Path.cwd()) / ".vmrun" / "logs",
        )
        if cluster:
            from vmrun.cli.setup_view import run_cluster_setup

            return run_cluster_setup(settings, cluster, options, gpus_per_node)
        from vmrun.ssh.inventory import select_hosts

        entries = select_hosts([*(hosts or []), *(host or [])], settings)
        from vmrun.cli.autostop_cmd import apply as autostop_apply
        from vmrun.cli.setup_view import run_setup

        return run_setup(
            entries,
            settings,
            options,
            record=record and not dry_run,
            project=settings.project_dir or Path.cwd(),
            started=time.monotonic(),
            then=None if dry_run else partial(autostop_apply, settings=settings, required=False),
        )


def env_manager_flag(env_manager: str | None, env: str | None) -> str | None:
    """--env-manager, or the deprecated --env (in exec and train --env sets a variable)."""
    if env is None:
        return env_manager
    from vmrun.cli.output import TERMINAL

    TERMINAL.warn("setup --env is deprecated: use --env-manager (--env sets a variable elsewhere)")
    if env_manager is not None and env_manager != env:
        raise UsageError(f"--env {env} and --env-manager {env_manager} disagree: give one")
    return env


def _with_extra_steps(book: Playbook, extra: list[Path], configured: dict[str, Any]) -> Playbook:
    """The playbook with --extra files' steps, then [[setup.steps]]' (in that order)."""
    from vmrun.setup import playbook as playbook_mod

    for path in extra:
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"--extra {path}: {exc}".splitlines()[0]) from None
        raw = data.get("steps") if isinstance(data, dict) else data
        book = book.extended(
            playbook_mod.parse_steps(raw or [], str(path), set(book.params), book.choices),
            str(path),
        )
    if configured.get("steps"):
        book = book.extended(
            playbook_mod.parse_steps(
                configured["steps"], "[setup.steps]", set(book.params), book.choices
            ),
            "[setup.steps]",
        )
    return book


def _check_uploads(wheelhouse: Path | None, installer: Path | None) -> None:
    for given, what in ((wheelhouse, "--wheelhouse"), (installer, "--installer")):
        if given is not None and not given.exists():
            raise UsageError(f"{what} {given} does not exist")
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise UsageError(f"--wheelhouse {wheelhouse} is not a folder")
    if installer is not None and not installer.is_file():
        raise UsageError(f"--installer {installer} is not a file")


def check_env_manager(params: dict[str, str]) -> None:
    """The env manager decides where the interpreter is (vmrun.setup.environment), so a value
    vmrun does not know is bad input, said before connecting rather than on each host."""
    from vmrun.setup.environment import ENV_MANAGERS

    if "env" in params and params["env"] not in ENV_MANAGERS:
        raise UsageError(
            f"unknown env manager {params['env']!r}: use --env-manager"
            f" {', '.join(ENV_MANAGERS[:-1])} or {ENV_MANAGERS[-1]}"
        )


def check_choices(choices: dict[str, tuple[str, ...]], params: dict[str, str]) -> None:
    """A param the playbook gives choices (a script may branch on it) takes one of them."""
    for name, allowed in choices.items():
        if params.get(name) not in allowed:
            raise UsageError(
                f"setup parameter {name}={params.get(name)!r} is not one of the playbook's"
                f" choices: {', '.join(allowed)}"
            )


def setup_options(
    configured: dict[str, Any],
    flags: dict[str, str | None],
    *,
    playbook: Path | None,
    extra: list[Path],
    params: list[str],
    force: list[str],
    only: list[str],
    dry_run: bool,
    wheelhouse: Path | None,
    installer: Path | None,
    index_url: str | None,
    find_links: list[str],
    reboot_timeout: float,
    log_dir: Path,
) -> SetupOptions:
    """Everything the command line says, checked before any connection (bad input: exit 2)."""
    from vmrun.setup import playbook as playbook_mod
    from vmrun.setup.report import SetupOptions

    book = _with_extra_steps(playbook_mod.load(playbook), extra, configured)
    resolved = resolve_params(dict(book.params), configured, dict(os.environ), flags, params)
    check_env_manager(resolved)
    check_choices(dict(book.choices), resolved)
    for name in [*force, *only]:
        book.step(name)  # an unknown step name is a usage error, before any connection
    _check_uploads(wheelhouse, installer)
    return SetupOptions(
        playbook=book,
        params=resolved,
        force=frozenset(force),
        only=frozenset(only),
        dry_run=dry_run,
        wheelhouse=wheelhouse,
        installer=installer,
        index_url=index_url,
        find_links=tuple(find_links),
        reboot_timeout=reboot_timeout,
        log_dir=log_dir,
    )
