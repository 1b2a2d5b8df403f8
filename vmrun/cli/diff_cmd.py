"""`vmrun diff A B [C]...`: what differs between runs (vmrun.results.rundiff); `report --diff`
prints the same."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    StoreFrom,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import say

if TYPE_CHECKING:
    from vmrun.config import Settings

DiffRuns = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="RUN RUN [RUN]...",
        show_default=False,
        help="Run ids (results/<id>/ of the project, fetched first if not here) or paths to"
        " results folders; each run after the first is compared with the first.",
    ),
]


def register(app: typer.Typer) -> None:
    @app.command(
        "diff",
        help="Show what differs between runs, from what each recorded: the code (commit,"
        " branch, uncommitted changes, untracked files), the packages, the Python and torch"
        " stack and --env variables, each node's hardware and Slurm allocation, and how"
        " the run was launched. Nothing is said of what is equal; exit 0 either way.",
    )
    @reaching(parallel=False)
    def diff_command(
        runs: DiffRuns = None,
        as_json: Annotated[
            bool,
            typer.Option("--json", help='{"runs": [ids], "diffs": [one per run after the first]}'),
        ] = False,
        host: Hosts = None,
        cluster: ClusterName = None,
        store: StoreFrom = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        refuse_with_cluster(cluster, host)
        show_diffs(
            runs,
            flag="diff",
            as_json=as_json,
            host=host,
            cluster=cluster,
            settings=lambda: reach.settings(**({"store": store} if store else {})),
        )
        return 0


def show_diffs(
    runs: list[str] | None,
    *,
    flag: str,
    as_json: bool,
    host: list[str] | None,
    cluster: str | None,
    settings: Callable[[], Settings],
) -> None:
    """Gather the runs (fetching those not here), then print each diff with the first:
    text, or one JSON object on stdout."""
    import json

    from vmrun.cli.terminal import TERMINAL
    from vmrun.operations.histories import run_diffs
    from vmrun.results.rundiff import render_text

    found, diffs = run_diffs(
        runs, flag=flag, hosts=host, cluster=cluster, settings=settings, out=TERMINAL
    )
    if as_json:
        data = {"runs": [r.run_id for r in found], "diffs": [d.to_json() for d in diffs]}
        say(json.dumps(data, indent=2))
        return
    say("\n".join(render_text(d) for d in diffs), end="")
