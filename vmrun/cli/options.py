"""Options shared by every command that talks to hosts, and how they become Settings."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmrun.config import Settings, load_settings

Hosts = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        "-H",
        metavar="HOST",
        help="user@host[:port], an ~/.ssh/config alias, a vmrun.toml name or @group;"
        " repeatable. Default: $VMRUN_HOSTS, else the hosts in vmrun.toml.",
    ),
]
ConnectTimeout = Annotated[
    float | None,
    typer.Option(
        "--connect-timeout",
        metavar="SECONDS",
        help="Give up connecting after this long [default: 10].",
    ),
]
AcceptNewHostKey = Annotated[
    bool | None,
    typer.Option(
        "--accept-new-host-key/--strict-host-key",
        show_default=False,
        help="Trust an unknown host key on first use and remember it (a changed key"
        " is always refused). Default: strict.",
    ),
]


def settings_from(
    connect_timeout: float | None = None, accept_new_host_key: bool | None = None, **extra: Any
) -> Settings:
    flags: dict[str, Any] = {
        "connect_timeout": connect_timeout,
        "accept_new_host_key": accept_new_host_key,
        **extra,
    }
    return load_settings({k: v for k, v in flags.items() if v is not None})


ClusterName = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        "-C",
        metavar="NAME",
        help="A Slurm cluster named in vmrun.toml ([[clusters]]): work through its login node.",
    ),
]


def refuse_with_cluster(cluster: str | None, host: list[str] | None) -> None:
    """-C and -H name different places to work; one command works in one."""
    from vmrun.errors import UsageError

    if cluster and host:
        raise UsageError(f"-C {cluster} and -H both say where to work: use one")


Runs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[RUN]...",
        show_default=False,
        help="Run ids (results/<id>/ of the project, fetched first if not here) or paths to"
        " results folders. Default: every run under results/, oldest first.",
    ),
]
