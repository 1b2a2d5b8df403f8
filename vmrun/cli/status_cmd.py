"""`vmrun status`: every run on the hosts, with state, progress, times and exit code."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import make_console, say
from vmrun.errors import exit_code_for

if TYPE_CHECKING:
    from vmrun.backends.api import RunRow


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def register(app: typer.Typer) -> None:
    @app.command(
        "status",
        help="List the runs on the hosts (or a cluster's, -C; or kept in a bucket, --store):"
        " state, progress, start, duration, exit code and, where the machines' prices are"
        " known, what each has cost.",
    )
    @reaching()
    def status_command(
        host: Hosts = None,
        cluster: ClusterName = None,
        last: Annotated[
            int, typer.Option("--last", metavar="N", help="Only the newest N runs (0: all).")
        ] = 20,
        show_all: Annotated[bool, typer.Option("--all", help="Every run (as --last 0).")] = False,
        as_json: Annotated[
            bool,
            typer.Option(
                "--json",
                help="A JSON list on stdout, one object per run: run, hosts or cluster, state,"
                " launcher, nodes, processes, world size, epochs, start, duration, exit, cost,"
                " hung, slow ranks.",
            ),
        ] = False,
        store: Annotated[
            str | None,
            typer.Option(
                "--store",
                metavar="s3://BUCKET/PREFIX",
                help="The runs kept in this bucket place (`train --store`), as their copies"
                " there say: after `vmrun down` too. With -H or -C, theirs as well (a run"
                " listed there is shown once, as they see it).",
            ),
        ] = None,
        from_store: Annotated[
            bool,
            typer.Option("--from-store", help="As --store, from vmrun.toml's `store`."),
        ] = False,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.output import report
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.status import gather

        refuse_with_cluster(cluster, host)
        settings = reach.settings()
        found = gather(
            settings,
            hosts=host,
            cluster=cluster,
            watchdog=not as_json,
            last=0 if show_all else last,
            out=TERMINAL,
            store=store if store is not None else ("" if from_store else None),
            places=bool(host or cluster) or (store is None and not from_store),
        )
        records, errors, autostop = found.records, found.errors, found.autostop
        if as_json:
            say(json.dumps([*found.runs(), *found.places()], indent=2))
            sys.stdout.flush()
        else:
            images = any(r.record.image for r in records)
            stores = any(r.store for r in records)
            costs = any(r.record.price_per_hour is not None for r in records)
            _render(
                _rows(records, autostop, images, stores, costs),
                autostop=bool(autostop),
                images=images,
                stores=stores,
                costs=costs,
            )
            for r in records:
                if r.store is not None and r.store.state in ("failing", "gave-up"):
                    TERMINAL.warn(f"run {r.id}: {r.store.describe(getattr(r, 'host_now', None))}")
        if found.hidden:
            TERMINAL.info(f"{found.hidden} older run(s) not shown (--last N / --all)")
        for failure in errors:
            report(failure.error)
        return max((exit_code_for(f.error) for f in errors), default=0)


def _rows(
    records: Sequence[Any],
    autostop: dict[str, str],
    images: bool = False,
    stores: bool = False,
    costs: bool = False,
) -> list[tuple[str, ...]]:
    """One row per run and host (and one per task of an array job, `RUN[INDEX]`); an
    AUTOSTOP column where a host has the watchdog, an IMAGE column where a run ran in a
    container image, a BUCKET column where a run is copied to one (--store), a COST column
    where a run's prices are known (on its master's row: the whole run's, so far)."""
    rows = []
    for r in records:
        extra = [
            *([autostop.get(r.host, "-")] if autostop else []),
            *([r.record.image or "-"] if images else []),
            *([_bucket(r)] if stores else []),
            *([_cost(r)] if costs else []),
        ]
        started = time.strftime("%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
        code = "-" if r.exit_code is None else str(r.exit_code)
        progress = ", ".join(p for p in (r.progress, getattr(r, "slow", "")) if p) or "-"
        rows.append(
            (r.id, r.host, _state(r), progress, started, _duration(r.duration), code, *extra)
        )
        for t in r.tasks if r.record.job and r.record.job.array else []:
            state = f"{t.state} ({t.reason})" if t.reason else str(t.state)
            code = "-" if t.exit_code is None else str(t.exit_code)
            where = f"on {t.nodes}" if t.nodes else "-"
            rows.append(
                (
                    f"{r.id}[{t.key}]",
                    r.host,
                    state,
                    where,
                    started,
                    _duration(t.elapsed),
                    code,
                    *extra,
                )
            )
    return rows


def _cost(run: Any) -> str:
    from vmrun.operations.status_runs import cost_of
    from vmrun.results.cost import money
    from vmrun.runs.store_runs import BucketRun

    if run.record.master not in ("", run.host) and not isinstance(run, BucketRun):
        return "-"  # the run's cost is on its master's row (a bucket's run has one row)
    found = cost_of(run.record, run.ran_s)
    return money(found["amount"], found["currency"]) if found else "-"


def _bucket(run: Any) -> str:
    """The copy to the run's bucket in a few words: up to date, 40 s behind, all there."""
    store = run.store
    if store is None:
        return "-"
    behind = store.behind(getattr(run, "host_now", None))
    words = {
        "ok": "up to date",
        "done": "all there",
        "syncing": "copying",
        "gave-up": "gave up",
        "replaced": "newer attempt's",
        "waiting": "waits for its master",
        "copied": "in the bucket",
    }
    if store.state == "failing" and behind is not None:
        return f"{behind:.0f} s behind"
    return words.get(store.state, "behind" if store.state == "failing" else store.state)


def _state(run: RunRow) -> str:
    """The state, and for a queued job why it waits (squeue's reason)."""
    text = f"{run.state} ({run.reason})" if run.reason else str(run.state)
    text = f"{text}, attempt {run.attempts}" if run.attempts > 1 else text
    budget = getattr(run, "budget", None)
    if budget and run.state == "stopped":  # its budget watcher stopped it (--max-cost)
        text += f", at --max-cost {budget.get('cap', '?')}"
    hung = getattr(run, "hung", None)
    if hung:  # its hang watcher found it stuck (and stopped it, or it waits)
        text += ", hung (stopped)" if hung.get("action") == "stop" else ", hung"
    if run.recovering and run.state != "running":  # its supervisor is bringing it back
        return f"recovering, {run.recovering.split(':')[0]}"
    if run.gave_up:  # --recover's limit, or a failure it cannot bring back
        n = run.recoveries
        return f"{text}, gave up after {n} recover{'y' if n == 1 else 'ies'}"
    return f"{text}, recovered {run.recoveries}x" if run.recoveries else text


def _render(
    rows: Sequence[tuple[str, ...]],
    *,
    autostop: bool = False,
    images: bool = False,
    stores: bool = False,
    costs: bool = False,
) -> None:
    headers: tuple[str, ...] = ("RUN", "HOST", "STATE", "PROGRESS", "STARTED", "DURATION", "EXIT")
    headers += ("AUTOSTOP",) * autostop + ("IMAGE",) * images + ("BUCKET",) * stores
    headers += ("COST",) * costs
    if not rows:
        from vmrun.cli.terminal import TERMINAL

        TERMINAL.info("no runs")
        return
    if sys.stdout.isatty():
        from rich.table import Table

        table = Table(*headers, box=None, header_style="bold")
        colours = {
            "running": "cyan",
            "done": "green",
            "failed": "red",
            "stopped": "yellow",
            "lost": "red",
        }
        for row in rows:
            colour = colours.get(row[2].split()[0].rstrip(","), "")
            table.add_row(*row[:2], f"[{colour}]{row[2]}[/]", *row[3:])
        make_console().print(table)
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        say("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
