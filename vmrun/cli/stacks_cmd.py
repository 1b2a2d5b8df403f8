"""`vmrun stacks [RUN] [--hang] [--full] [--json]`: where every rank of a live run is now,
ranks in the same place printed once (vmrun.operations.stacks does the work)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from vmrun.cli.options import NO_FLAGS, ClusterName, Hosts, Reach, reaching, refuse_with_cluster
from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command(
        "stacks",
        help="Show where every rank of a live run is now (default: the newest running run):"
        " each rank's Python stack on every host, read by py-spy, ranks in the same place"
        " printed once. --hang shows those the hang watcher took. Kept in"
        " results/RUN/stacks/.",
    )
    @reaching()
    def stacks_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        hang: Annotated[
            bool,
            typer.Option("--hang", help="The stacks taken when the run was found hung."),
        ] = False,
        full: Annotated[
            bool, typer.Option("--full", help="Each place's whole stack and its other threads.")
        ] = False,
        as_json: Annotated[
            bool, typer.Option("--json", help="Every rank's stack as JSON.")
        ] = False,
        host: Hosts = None,
        cluster: ClusterName = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.operations.stacks import take
        from vmrun.runs.stacks import as_json as stack_json

        refuse_with_cluster(cluster, host)
        taken = take(reach.settings(), run, hosts=host, cluster=cluster, hang=hang)
        if as_json:
            from dataclasses import asdict

            say(
                json.dumps(
                    {
                        "run": taken.run_id,
                        "ranks": [stack_json(s) for s in taken.stacks],
                        "failed": taken.failed,
                        "hangs": taken.hangs,
                        "flight_recorder": [asdict(f) for f in taken.flights],
                    },
                    indent=1,
                )
            )
            return taken.exit_code
        for node, seen in taken.hangs.items():
            if seen:
                say(
                    f"{node}: hung since {_clock(seen.get('since'))}, found"
                    f" {_clock(seen.get('seen'))}; {seen.get('action', 'wait')}"
                )
        for line in taken.lines(full=full):
            say(line)
        for node, why in taken.failed.items():
            say(f"{node}: {why}", err=True)
        if taken.saved is not None:
            say(f"kept in {taken.saved} ({taken.seconds:.1f} s)", err=True)
        elif hang and not taken.stacks:
            say(f"run {taken.run_id}: no hang's stacks recorded", err=True)
        return taken.exit_code


def _clock(when: object) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(float(when))) if when else "?"  # type: ignore[arg-type]
