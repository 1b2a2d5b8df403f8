"""`vmrun fetch [WHAT|REMOTE_PATH]...`: bring back only what is new, verified, atomically
(vmrun.operations.fetch does it; this parses the flags and shows each round)."""

from __future__ import annotations

import re
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
    from vmrun.operations.fetch import FetchJob
    from vmrun.ssh.group import Outcome
    from vmrun.transfer.types import Report

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
        " ~/PATH in the home, or absolute; with --run, relative to the run's folder. A run"
        " copied to a bucket (`train --store`) whose files its hosts lack, or that do not"
        " answer, comes from its copy there.",
    )
    @reaching()
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
        store: Annotated[
            str | None,
            typer.Option(
                "--store",
                metavar="s3://BUCKET/PREFIX",
                help="From the run's copy in this bucket place (`train --store`),"
                " not its hosts: straight here, when the hosts are gone.",
            ),
        ] = None,
        from_store: Annotated[
            bool,
            typer.Option("--from-store", help="As --store, from vmrun.toml's `store`."),
        ] = False,
        cluster: ClusterName = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.operations.fetch import FetchJob

        refuse_with_cluster(cluster, host)
        job = FetchJob(
            items=list(what or ["results"]),
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
            settings=reach.settings(),
            cluster=cluster,
            store=store if store is not None else ("" if from_store else None),
        )
        return run_fetch(job)


def run_fetch(job: FetchJob) -> int:
    """Fetch, showing each round as it ends (a live view on a terminal, unless --watch);
    the exit code of the last round."""
    from vmrun.cli.output import error_line, unreached
    from vmrun.cli.terminal import TERMINAL
    from vmrun.operations.fetch import rounds

    code = 0
    for n, fetched in enumerate(rounds(job, TERMINAL)):
        if n == 0 and fetched.ref is not None:
            unreached(fetched.ref, "has no files fetched from there")
        _report(fetched.outcomes, prefix=fetched.several, quiet=job.watch)
        for conflict in fetched.conflicts:
            error_line(conflict.line(), code="node-files-differ")
        code = fetched.exit_code
    return code


def _report(outcomes: list[Outcome[Report]], *, prefix: bool, quiet: bool) -> None:
    """Each host's summary line (with --watch, only when something happened), what it
    skipped, and a coded error line for each failure."""
    from vmrun.cli.fetch_view import summary
    from vmrun.cli.output import error_line, report
    from vmrun.cli.terminal import TERMINAL
    from vmrun.store_url import is_store

    for outcome in outcomes:
        if outcome.error is not None:
            report(outcome.error)
            continue
        rep = outcome.value
        assert rep is not None
        busy = rep.fetched or rep.failed or rep.missing or rep.replaced
        if not quiet or busy:
            say(summary(rep, prefix=prefix))
        if not quiet:
            for text in rep.skipped:
                TERMINAL.warn(f"{rep.host}: skipped {text}")
        for path, why in rep.failed.items():
            if path in rep.mismatched:
                error_line(f"{rep.host}: {path}: {why}", code="checksum-mismatch")
            else:
                error_line(f"{rep.host}: {path}: {why}", code="file-not-fetched")
        where = "not in the bucket" if is_store(rep.host) else "not found on the host"
        for name in rep.missing:
            error_line(
                f"{rep.host}: {name}: {where}{_tilde_hint(name)}", code="remote-path-not-found"
            )


def _tilde_hint(name: str) -> str:
    """`vmrun fetch ~/x` unquoted reaches vmrun as this machine's home: say how to quote it."""
    home = str(Path.home()).rstrip("/")
    if not home or not (name == home or name.startswith(home + "/")):
        return ""
    rel = name[len(home) :].lstrip("/")
    return (
        f" (your shell turned `~` into this machine's home, {home}; for the host's home,"
        f" quote it: vmrun fetch '~/{rel}')"
    )
