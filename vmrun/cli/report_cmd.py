"""`vmrun report [RUN]...`: one row per run, to compare them (vmrun.results.report)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    Runs,
    StoreFrom,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import make_console, say
from vmrun.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        "report",
        help="Compare runs, one row each: nodes, processes per node, world size, launcher,"
        " epochs, total time, median time per epoch and samples/s, speed-up and scaling"
        " efficiency against the run with the smallest world size, final loss and accuracy.",
    )
    @reaching(parallel=False)
    def report_command(
        runs: Runs = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="A JSON list of objects (null where unknown).")
        ] = False,
        markdown: Annotated[
            bool, typer.Option("--markdown", help="A GitHub Markdown table.")
        ] = False,
        diff: Annotated[
            bool,
            typer.Option(
                "--diff",
                help="Instead of the rows, what differs between the runs (as `vmrun diff`);"
                " with --json, its JSON.",
            ),
        ] = False,
        host: Hosts = None,
        cluster: ClusterName = None,
        store: StoreFrom = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.errors import VmrunError
        from vmrun.operations.histories import gather
        from vmrun.results.report import render_markdown, report_rows, rows_json

        if as_json and markdown:
            raise UsageError("--json and --markdown: give one")
        if diff and markdown:
            raise UsageError("--diff and --markdown: give one (--diff prints text, or --json)")
        refuse_with_cluster(cluster, host)
        if diff:
            from vmrun.cli.diff_cmd import show_diffs

            show_diffs(
                runs,
                flag="--diff",
                as_json=as_json,
                host=host,
                cluster=cluster,
                settings=lambda: reach.settings(**({"store": store} if store else {})),
            )
            return 0
        left_out: list[VmrunError] = []
        try:
            histories = gather(
                runs,
                hosts=host,
                cluster=cluster,
                settings=lambda: reach.settings(**({"store": store} if store else {})),
                verb="report",
                out=TERMINAL,
                left_out=left_out,
            )
        except UsageError:
            if as_json and left_out:  # every run named was left out: the JSON says why
                say(rows_json([], left_out))
            raise
        rows = report_rows(histories)
        if as_json:
            say(rows_json(rows, left_out))
        elif markdown:
            say(render_markdown(rows), end="")
        else:
            show_table(rows)
        return 0


def show_table(rows: list) -> None:
    from vmrun.results.report import notes, table

    heads, numeric, shown = table(rows)
    note = notes(rows)
    if sys.stdout.isatty():
        from rich.table import Table

        view = Table(box=None, header_style="bold")
        for i, header in enumerate(heads):
            view.add_column(header, justify="right" if i in numeric else "left")
        for row in shown:
            view.add_row(*row)
        console = make_console()
        console.print(view)
        if note:
            console.print(note, style="dim", highlight=False)
        return
    widths = [max(len(h), *(len(r[i]) for r in shown)) for i, h in enumerate(heads)]
    for row in (heads, *shown):
        text = "  ".join(
            v.rjust(w) if i in numeric else v.ljust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        )
        say(text.rstrip())
    if note:
        say(f"\n{note}")
