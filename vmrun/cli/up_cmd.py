"""`vmrun up NAME`: cloud VMs made SSH-ready and recorded as hosts @NAME (the work is
vmrun.operations.cloud's; this module parses and renders)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.options import settings_from
from vmrun.cli.output import say
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.operations.cloud import Up, UpAsk


def register(app: typer.Typer) -> None:
    @app.command(
        "up",
        help="Make NAME's VMs in the cloud (AWS, UCloud), pin their host keys, wait until SSH"
        " logs in, and record them in vmrun.toml as hosts @NAME (setup, train -H @NAME, doctor,"
        " watch-gpus then work on them). Values not given come from the [[clouds]] table NAME."
        " Ctrl-C or a failure removes everything made (unless --keep).",
    )
    def up_command(
        name: Annotated[
            str | None,
            typer.Argument(metavar="NAME", help="The cluster's name.", show_default=False),
        ] = None,
        cloud: Annotated[
            str | None, typer.Option("--cloud", help="aws (the default) or ucloud.")
        ] = None,
        instance_type: Annotated[
            str | None, typer.Option("--type", "-t", help="The instance type: g4dn.2xlarge...")
        ] = None,
        count: Annotated[
            int | None, typer.Option("--count", "-n", help="How many VMs (default 1).")
        ] = None,
        region: Annotated[
            str | None, typer.Option("--region", help="Default: the profile's, else us-east-1.")
        ] = None,
        zone: Annotated[
            str | None, typer.Option("--zone", help="Only this zone (default: each in turn).")
        ] = None,
        spot: Annotated[
            bool | None, typer.Option("--spot/--on-demand", help="Spot instances (cheaper).")
        ] = None,
        spot_fallback: Annotated[
            bool | None,
            typer.Option("--spot-fallback", help="Take on-demand when no zone has spot capacity."),
        ] = None,
        disk: Annotated[
            int | None, typer.Option("--disk", metavar="GB", help="Root disk size (gp3).")
        ] = None,
        image: Annotated[
            str | None,
            typer.Option(
                "--os-image",
                help="dlami (default: NVIDIA driver preinstalled), ubuntu (`vmrun setup`"
                " installs it) or ami-...",
            ),
        ] = None,
        user: Annotated[
            str | None, typer.Option("--user", help="The image's login user (default ubuntu).")
        ] = None,
        autostop: Annotated[
            str | None,
            typer.Option("--autostop", metavar="PERIOD", help="Power off once idle this long."),
        ] = None,
        autostop_terminate: Annotated[
            bool | None,
            typer.Option(
                "--autostop-terminate",
                help="A power-off from inside terminates the VMs (default: stops them).",
            ),
        ] = None,
        ssh_from: Annotated[
            str | None,
            typer.Option(
                "--ssh-from",
                metavar="CIDR",
                help="Who may reach SSH (default: this machine's public address, /32).",
            ),
        ] = None,
        ssh_key: Annotated[
            Path | None,
            typer.Option("--ssh-key", help="The public key to put in (default ~/.ssh/id_*.pub)."),
        ] = None,
        profile: Annotated[
            str | None, typer.Option("--profile", help="The AWS profile (default: AWS_PROFILE).")
        ] = None,
        placement: Annotated[
            bool | None,
            typer.Option(
                "--placement/--no-placement",
                help="A cluster placement group for several VMs (default on where allowed).",
            ),
        ] = None,
        keep: Annotated[
            bool, typer.Option("--keep", help="Keep what was made when `up` fails.")
        ] = False,
        store: Annotated[
            str | None,
            typer.Option(
                "--store",
                metavar="s3://BUCKET/PREFIX",
                help="Give the VMs a role of their own that reaches this bucket prefix and"
                " nothing else (runs' --store, push s3://...): no key of yours on them.",
            ),
        ] = None,
        ssh_timeout: Annotated[
            float,
            typer.Option("--ssh-timeout", metavar="SECONDS", help="How long to wait for SSH."),
        ] = 600.0,
        list_: Annotated[
            bool,
            typer.Option("--list", help="List what vmrun made in the cloud (`vmrun cloud`)."),
        ] = False,
        max_hourly_cost: Annotated[
            float | None,
            typer.Option(
                "--max-hourly-cost",
                metavar="AMOUNT",
                help="Refuse (before anything is made) a cluster dearer than this an hour, in"
                " the cloud's currency (USD on AWS, DKK on UCloud).",
            ),
        ] = None,
        max_cost: Annotated[
            float | None,
            typer.Option(
                "--max-cost",
                metavar="AMOUNT",
                help="The cluster's cap, in the cloud's currency: each VM's watchdog stops its"
                " runs (their work saved) and powers it off once it has run its share at the"
                " price list's price (recorded in its [[clouds]] table).",
            ),
        ] = None,
        slurm: Annotated[
            bool,
            typer.Option(
                "--slurm",
                help="Then set the VMs up ([setup] in vmrun.toml) and make them a Slurm"
                " cluster NAME (train -C NAME, sweep -C NAME): the queue for your VMs.",
            ),
        ] = False,
    ) -> int:
        from vmrun.cli.terminal import Terminal
        from vmrun.operations.cloud import UpAsk, up

        if list_:
            from vmrun.cli.cloud_cmd import render
            from vmrun.operations.clusters import list_clusters

            regions = [region] if region else None
            return render(
                list_clusters(settings_from(), profile=profile, regions=regions), as_json=False
            )
        if not name:
            raise UsageError(
                "vmrun up needs the cluster's NAME", hint="e.g. vmrun up w251 --type g4dn.2xlarge"
            )

        ask = UpAsk(
            name=name,
            cloud=cloud,
            instance_type=instance_type,
            count=count,
            region=region,
            zone=zone,
            spot=spot,
            spot_fallback=spot_fallback,
            disk=disk,
            image=image,
            user=user,
            autostop=autostop,
            autostop_terminate=autostop_terminate,
            ssh_from=ssh_from,
            profile=profile,
            placement=placement,
            ssh_key=ssh_key,
            keep=keep,
            ssh_timeout=ssh_timeout,
            store=store,
            max_hourly_cost=max_hourly_cost,
            max_cost=max_cost,
        )
        if slurm:
            return _up_cluster(ask)
        done = up(settings_from(), ask, Terminal())
        _render(done, ask)
        say(f"next: vmrun setup @{name}; vmrun train -H @{name} ...; vmrun down {name}")
        return 0


def _up_cluster(ask: UpAsk) -> int:
    """The VMs shown as `up` shows them, their setup as `setup` does, then the cluster."""
    from vmrun.cli import setup_view as view
    from vmrun.cli.queue_view import render_made
    from vmrun.cli.terminal import Terminal
    from vmrun.operations.queue import up_cluster
    from vmrun.operations.setup import SetupRequest

    done, made = up_cluster(settings_from(), ask, SetupRequest(), Terminal())
    _render(done, ask)
    code = view.render_hosts(made.setup)
    if made.made is None:
        return code
    return max(code, render_made(made.made, made.recorded_in))


def _render(done: Up, ask: UpAsk) -> None:
    """What `up` made or found, and what it costs."""
    name = ask.name
    what = "already up" if done.already else "started again" if done.started else "up"
    say(f"{done.name}: {what} in {done.region}: {len(done.hosts)} host(s) as @{name}")
    for entry in done.hosts:
        say(f"  {entry.label}  {entry.spec.label}  private {entry.vars['private_addr']}")
    if done.per_hour is not None:
        from vmrun.results.cost import money

        say(f"  about {money(done.per_hour, done.currency)} an hour while it runs")
    if done.autostop:
        say(f"  autostop: each powers off after {done.autostop} idle")
    if done.budget:
        say(
            f"  --max-cost: each VM saves and stops its runs and powers off after {done.budget}"
            " running in all"
        )
    if ask.store:
        say(f"  role: the VMs reach {ask.store} with their own credentials")
