"""`vmrun down NAME`: nothing of the cluster left billing (vmrun.operations.cloud's `down`)."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.options import settings_from
from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command(
        "down",
        help="Terminate NAME's VMs, then delete its security and placement groups, and remove"
        " its hosts from vmrun.toml. Idempotent. --stop stops the VMs instead (their disks"
        " are kept, and billed).",
    )
    def down_command(
        name: Annotated[str, typer.Argument(metavar="NAME", help="The cluster's name.")],
        stop: Annotated[
            bool, typer.Option("--stop", help="Stop (disks kept) instead of terminating.")
        ] = False,
        region: Annotated[
            str | None, typer.Option("--region", help="Default: the one `vmrun up` recorded.")
        ] = None,
        profile: Annotated[str | None, typer.Option("--profile", help="The AWS profile.")] = None,
    ) -> int:
        from vmrun.cli.terminal import Terminal
        from vmrun.operations.cloud import GP3_GB_MONTH, down

        done = down(
            settings_from(), name, region=region, stop=stop, profile=profile, out=Terminal()
        )
        removed = done.removed
        if done.stopped:
            count = len(removed.instances) if removed else 0
            say(f"{name}: {count} instance(s) stopped in {done.region}")
            cost = f" (about ${done.disk_gb * GP3_GB_MONTH:.0f}/month)" if done.disk_gb else ""
            say(
                f"their disks are kept and billed{cost}; `vmrun up {name}` starts them again,"
                f" `vmrun down {name}` ends them"
            )
            return 0
        if removed is None or not (
            removed.instances or removed.security_groups or removed.roles or removed.networks
        ):
            say(f"{name}: nothing of it in {done.region}")
            return 0
        deleted = [
            f"{len(ids)} {kind}(s)"
            for kind, ids in (
                ("security group", removed.security_groups),
                ("placement group", removed.placement_groups),
                ("private network", removed.networks),
                ("account SSH key", removed.keys),
            )
            if ids
        ]
        role = f", and its role {removed.roles[0]}" if removed.roles else ""
        say(
            f"{name}: terminated {len(removed.instances)} instance(s)"
            + (f", deleted {' and '.join(deleted)}" if deleted else "")
            + f" in {done.region or 'UCloud'}{role}"
        )
        if done.forgotten:
            say(f"removed from vmrun.toml: {', '.join(done.forgotten)}")
        return 0
