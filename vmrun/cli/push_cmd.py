"""`vmrun push PATH...`: data onto every host (vmrun.operations.push does it; this module
parses and renders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    reaching,
)
from vmrun.cli.output import say

if TYPE_CHECKING:
    from vmrun.operations.push import Pushed


def register(app: typer.Typer) -> None:
    @app.command(
        "push",
        help="Send files or folders (a dataset) to every host: each PATH arrives as"
        " DIR/<its name>, DIR being --to or the project's work directory there (where a"
        " run's `data/` is looked for). Only what is new or changed travels; every file is"
        " verified by SHA-256 on the host and renamed into place only when whole; each host's"
        " folder and free space are checked first. A bucket prefix (s3://BUCKET/PREFIX) instead:"
        " every host copies it straight from the bucket.",
    )
    @reaching()
    def push_command(
        paths: Annotated[
            list[str],
            typer.Argument(
                metavar="PATH...", help="Files or folders to send, or s3://BUCKET/PREFIX."
            ),
        ],
        to: Annotated[
            str | None,
            typer.Option(
                "--to",
                metavar="DIR",
                help="Where on the hosts: absolute, ~/DIR, or relative to the project's work"
                " directory [default: the work directory].",
            ),
        ] = None,
        host: Hosts = None,
        cluster: ClusterName = None,
        delete: Annotated[
            bool,
            typer.Option(
                "--delete",
                help="Also remove files under a pushed folder on the hosts that are not in it"
                " here (after every file arrived).",
            ),
        ] = False,
        bwlimit: Annotated[
            str | None,
            typer.Option(
                "--bwlimit", metavar="RATE", help="At most this many bytes/s per host (20M)."
            ),
        ] = None,
        relay: Annotated[
            bool,
            typer.Option(
                "--relay/--no-relay",
                help="With several hosts that list a private_addr: send folders once, to the"
                " nearest host, and from there host to host [default: relay].",
            ),
        ] = True,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Say what would be sent; send nothing.")
        ] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="One JSON object on stdout: per host, what moved.")
        ] = False,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.fetch_cmd import parse_rate
        from vmrun.cli.terminal import Terminal
        from vmrun.operations.push import PushJob, push
        from vmrun.store_url import is_store, parse_store

        settings = reach.settings()
        job = PushJob(
            settings=settings,
            paths=[Path(p) for p in paths if not is_store(p)],
            stores=[parse_store(p) for p in paths if is_store(p)],
            store_credentials=settings.store_credentials,
            to=to,
            hosts=host,
            dry_run=dry_run,
            delete=delete,
            bwlimit=parse_rate(bwlimit),
            relay=relay,
            cluster=cluster,
        )
        done = push(job, Terminal(json=as_json))
        if as_json:
            say(json.dumps(to_json(done), indent=2))
        else:
            render(done)
        return done.exit_code


def render(done: Pushed) -> None:
    from vmrun.cli.fetch_view import human_bytes, summary
    from vmrun.cli.output import error_line, report

    for outcome in done.outcomes:
        if outcome.error is not None:
            report(outcome.error)
            continue
        pushed = outcome.value
        assert pushed is not None
        head = f"[{pushed.host}] " if done.several else ""
        if done.dry_run:
            for plan in pushed.planned:
                gone = f"; --delete would remove {len(plan.extra)}" if done.delete else ""
                say(
                    f"{head}{plan.local} -> {plan.remote}: would send {plan.to_send} of"
                    f" {plan.files} files ({human_bytes(plan.bytes_to_send)} of"
                    f" {human_bytes(plan.nbytes)}){gone}"
                )
            continue
        via = f" (from {pushed.via}, host to host)" if pushed.via else ""
        for rep, plan in zip(pushed.reports, pushed.planned, strict=False):
            verb = "copied" if rep.engine == "rclone" else "sent"  # from a bucket, or from here
            line = summary(rep, prefix=False).replace("fetched", verb, 1)
            say(f"{head}{plan.local} -> {plan.remote}: {line}{via}")
            for path, why in rep.failed.items():
                code = "checksum-mismatch" if path in rep.mismatched else "transfer-failed"
                code = "store-copy-failed" if rep.engine == "rclone" else code
                error_line(f"{pushed.host}: {path}: {why}", code=code)
        if pushed.deleted:
            say(f"{head}removed {len(pushed.deleted)} file(s) not here (--delete)")


def to_json(done: Pushed) -> dict[str, Any]:
    from vmrun.errors import code_of, error_object, exit_code_for

    hosts = []
    for outcome in done.outcomes:
        item: dict[str, Any] = {"host": outcome.host, "error": None, "paths": []}
        if outcome.error is not None:
            err = outcome.error
            item["error"] = error_object(code_of(err), str(err), exit_code_for(err))
        elif outcome.value is not None:
            for index, plan in enumerate(outcome.value.planned):
                entry: dict[str, Any] = {
                    "local": str(plan.local),
                    "remote": plan.remote,
                    "files": plan.files,
                    "bytes": plan.nbytes,
                    "to_send": plan.to_send,
                    "bytes_to_send": plan.bytes_to_send,
                    "not_here": list(plan.extra),
                }
                if index < len(outcome.value.reports):
                    rep = outcome.value.reports[index]
                    entry.update(
                        sent=len(rep.fetched),
                        bytes_sent=rep.wire_bytes,
                        resumed=rep.resumed,
                        unchanged=rep.unchanged,
                        failed=sorted(rep.failed),
                        seconds=round(rep.seconds, 3),
                    )
                item["paths"].append(entry)
        if outcome.value is not None:
            item["deleted"] = outcome.value.deleted
            item["via"] = outcome.value.via or None
            for key, value in (("began_s", outcome.value.began), ("ended_s", outcome.value.ended)):
                item[key] = None if value is None else round(value, 3)
        hosts.append(item)
    return {"dest": done.dest, "dry_run": done.dry_run, "hosts": hosts}
