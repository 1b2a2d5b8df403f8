"""`vmrun logs [RUN] [-f] [-n N] [--node H]`: a run's output, once or followed to the end.

A run on several hosts shows every node's log, each line prefixed `[host rankN]`, merged by
when each line was written (live with -f, which also applies the failure rule of `vmrun
train`: a node that fails stops the run on the others). Whatever runs the run, the backend
does the work (vmrun.operations.logs finds it, vmrun.backends.api reads it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli import output
from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    reaching,
    refuse_with_cluster,
)
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.operations.logs import RunLog


def register(app: typer.Typer) -> None:
    @app.command(
        "logs",
        help="Show a run's log (default: the newest run); -f follows it until"
        " the run ends and exits with the run's exit code. A multi-node run shows every"
        " node, lines prefixed [host rankN]; --node picks one.",
    )
    @reaching()
    def logs_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Follow until the run ends.")
        ] = False,
        lines: Annotated[
            int, typer.Option("--lines", "-n", metavar="N", help="Only the last N lines (0: all).")
        ] = 0,
        node: Annotated[
            list[str] | None,
            typer.Option("--node", metavar="HOST", help="Only this node's log; repeatable."),
        ] = None,
        verbose: Annotated[
            bool,
            typer.Option(
                "--verbose", "-v", help="Also torchrun's banner and c10d's host name warnings."
            ),
        ] = False,
        host: Hosts = None,
        cluster: ClusterName = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.operations.logs import run_log

        if lines < 0:
            raise UsageError(f"--lines must be >= 0, got {lines}")
        refuse_with_cluster(cluster, host)
        settings = reach.settings()
        with run_log(settings, run, hosts=host, cluster=cluster, nodes=node or ()) as log:
            return _show(log, follow, lines, verbose)


def _show(log: RunLog, follow: bool, lines: int, verbose: bool) -> int:
    """The log of every node that answered; the others are named (before following, after
    a listing: where they are seen), and the exit status is then not 0."""
    from vmrun.cli.terminal import TERMINAL

    if not log.ref.nodes:
        return output.unreached(log.ref, "has no log shown from there")
    if not follow:
        log.read(TERMINAL, last=lines, verbose=verbose)
        return output.unreached(log.ref, "has no log shown from there")
    left = output.unreached(log.ref, "is not followed there")
    return max(log.follow(TERMINAL, last=lines, verbose=verbose), left)
