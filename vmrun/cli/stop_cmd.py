"""`vmrun stop [RUN]`: end every process of a run on every host, and prove none is left."""

from __future__ import annotations

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

if TYPE_CHECKING:
    from vmrun.operations.stop import Stopped


def register(app: typer.Typer) -> None:
    @app.command(
        "stop",
        help="Stop a run (default: the newest running one) on every host:"
        " SIGTERM to all its processes, SIGKILL after the grace period,"
        " then check that none is left.",
    )
    @reaching()
    def stop_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        grace: Annotated[
            float, typer.Option("--grace", metavar="SECONDS", help="Wait this long before SIGKILL.")
        ] = 10.0,
        host: Hosts = None,
        cluster: ClusterName = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.stop import stop

        refuse_with_cluster(cluster, host)
        settings = reach.settings()
        return render(stop(settings, run, hosts=host, cluster=cluster, grace=grace, out=TERMINAL))


def render(stopped: Stopped) -> int:
    """A line per node (or the cluster's job), each failure's error line, each unreached
    node named; the exit code."""
    from vmrun.cli.output import report, unreached

    run_id = stopped.run_id
    job = f" (job {stopped.job})" if stopped.cluster else ""
    for outcome in stopped.outcomes:
        if outcome.error is not None:
            report(outcome.error)
            continue
        res = outcome.value
        assert res is not None
        if not res.signalled:
            say(f"{res.node}: run {run_id}{job} had already ended")
        elif stopped.cluster:
            say(f"{res.node}: stopped run {run_id}: job {stopped.job} cancelled; no step left")
        else:
            killed = f", {res.killed} needed SIGKILL" if res.killed else ""
            say(f"{res.node}: stopped run {run_id}: {res.signalled} process(es){killed}; none left")
    unreached(stopped.ref, "was not stopped there; its processes may still hold its GPUs")
    return stopped.exit_code
