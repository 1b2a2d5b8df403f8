"""`vmrun fetch [WHAT|REMOTE_PATH]...`: bring back only what is new, verified, atomically."""

from __future__ import annotations

import re
from typing import Annotated

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

_RATE = re.compile(r"(?i)\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]?)i?b?(?:/s)?\s*")


def parse_rate(text: str | None) -> float | None:
    """`--bwlimit 20M`: bytes per second; K, M, G are powers of 1024."""
    if text is None:
        return None
    m = _RATE.fullmatch(text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--bwlimit {text!r}: expected a rate like 500K, 20M or 1G (per second)")
    return float(m.group(1)) * 1024 ** " kmg".index(m.group(2).lower() or " ")


def register(app: typer.Typer) -> None:
    @app.command(
        "fetch",
        help="Bring back results: only files that are new or changed, each verified by SHA-256"
        " on both ends and renamed into place only when complete. WHAT is results,"
        " checkpoints, logs or metrics (of the newest run, or --run, from the hosts it ran"
        " on), or a path on the host: relative to the project's work directory there,"
        " ~/PATH in the home, or absolute; with --run, relative to the run's folder.",
    )
    def fetch_command(
        what: Annotated[
            list[str] | None,
            typer.Argument(metavar="[WHAT|REMOTE_PATH]...", show_default=False),
        ] = None,
        run: Annotated[
            str | None, typer.Option("--run", metavar="RUN", help="The run [default: newest].")
        ] = None,
        to: Annotated[
            str | None,
            typer.Option(
                "--to", metavar="DIR", help="Where to put it [default: the project directory]."
            ),
        ] = None,
        host: Hosts = None,
        all_hosts: Annotated[
            bool,
            typer.Option(
                "--all-hosts",
                help="Every host in vmrun.toml (of a run: every host it ran on), each into a"
                " folder of its own.",
            ),
        ] = False,
        latest: Annotated[
            int | None,
            typer.Option("--latest", metavar="N", min=1, help="Only the newest N checkpoints."),
        ] = None,
        include: Annotated[
            list[str] | None,
            typer.Option("--include", metavar="GLOB", help="Only matching files; repeatable."),
        ] = None,
        exclude: Annotated[
            list[str] | None,
            typer.Option("--exclude", metavar="GLOB", help="Leave matching files; repeatable."),
        ] = None,
        verify: Annotated[
            bool,
            typer.Option("--verify", help="Also compare checksums of files that look unchanged."),
        ] = False,
        watch: Annotated[
            bool,
            typer.Option("--watch", help="Keep fetching new files until Ctrl-C."),
        ] = False,
        interval: Annotated[
            float,
            typer.Option("--interval", metavar="SECONDS", min=0.05, help="Pause between rounds."),
        ] = 10.0,
        bwlimit: Annotated[
            str | None,
            typer.Option("--bwlimit", metavar="RATE", help="At most this many bytes/s (20M)."),
        ] = None,
        cluster: ClusterName = None,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.cli.fetch_run import FetchJob, run_fetch

        refuse_with_cluster(cluster, host)
        if cluster and all_hosts:
            raise UsageError(f"--all-hosts is for hosts; -C {cluster} fetches from its login node")
        from vmrun.runs.outputs import check_paths

        items = list(what or ["results"])
        if all_hosts and host:
            raise UsageError("give either --host or --all-hosts, not both")
        check_paths(items, run)
        if run is not None:
            from vmrun.runs.outputs import check_run_id

            check_run_id(run)
        job = FetchJob(
            items=items,
            run=run,
            to=to,
            hosts=host,
            all_hosts=all_hosts,
            latest=latest,
            include=tuple(include or ()),
            exclude=tuple(exclude or ()),
            verify=verify,
            watch=watch,
            interval=interval,
            bwlimit=parse_rate(bwlimit),
            settings=settings_from(connect_timeout, accept_new_host_key),
            cluster=cluster,
        )
        return run_fetch(job)
