"""`vmrun cloud`: every resource vmrun tagged in the cloud, what it costs per hour, and
which clusters no vmrun.toml here names (possibly forgotten). The work is
vmrun.operations.clusters.list_clusters; this module renders its Listing."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmrun.cli.options import settings_from
from vmrun.cli.output import say
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.operations.clusters import Listing
    from vmrun.providers.api import Resource

HEADERS = ("CLUSTER", "RESOURCE", "ID", "REGION", "STATE", "TYPE", "AGE", "$/H")
FORGOTTEN = " (forgotten?)"


def register(app: typer.Typer) -> None:
    @app.command(
        "cloud",
        help="List every cloud resource vmrun tagged (instances, disks left behind, security"
        " and placement groups) in every region `vmrun up` used, with state, type, age and"
        " hourly price; clusters that no vmrun.toml here names are marked possibly forgotten.",
    )
    def cloud_command(
        region: Annotated[
            list[str] | None,
            typer.Option(
                "--region",
                "-r",
                metavar="REGION",
                help="Look in this region only; repeatable. Default: every region `vmrun up`"
                " used, the project's [[clouds]] regions and the profile's own.",
            ),
        ] = None,
        all_regions: Annotated[
            bool, typer.Option("--all-regions", help="Look in every region of the account.")
        ] = False,
        profile: Annotated[
            str | None,
            typer.Option(
                "--profile",
                metavar="PROFILE",
                help="The AWS profile (~/.aws) [default: AWS_PROFILE, else boto3's chain].",
            ),
        ] = None,
        as_json: Annotated[
            bool,
            typer.Option(
                "--json",
                help="A JSON object on stdout: regions, resources (one object each),"
                " forgotten clusters, the total per hour, errors.",
            ),
        ] = False,
        cloud: Annotated[
            str | None,
            typer.Option(
                "--cloud",
                metavar="aws|ucloud",
                help="Where to look [default: ucloud when every [[clouds]] table of the"
                " project says so, else aws].",
            ),
        ] = None,
    ) -> int:
        from vmrun.operations.clusters import list_clusters, list_ucloud, project_cloud

        if region and all_regions:
            raise UsageError("--region and --all-regions: use one")
        settings = settings_from()
        where = cloud or project_cloud(settings.project_data)
        if where not in ("aws", "ucloud"):
            raise UsageError(f"--cloud {where!r}: aws or ucloud")
        if where == "ucloud":
            if region or all_regions or profile:
                raise UsageError(
                    "--region, --all-regions and --profile are AWS's; UCloud lists every job"
                    " vmrun made there",
                    code="flags-conflict",
                )
            return render(list_ucloud(settings), as_json=as_json)
        found = list_clusters(settings, profile=profile, regions=region, all_regions=all_regions)
        return render(found, as_json=as_json)


def render(found: Listing, *, as_json: bool, now: datetime | None = None) -> int:
    """Print the listing (a table, or --json) and its gaps; the exit code."""
    from vmrun.cli.output import report
    from vmrun.cli.terminal import TERMINAL

    now = now or datetime.now(timezone.utc)
    if as_json:
        say(json.dumps(to_json(found, now), indent=1))
        sys.stdout.flush()
        return found.exit_code
    if found.resources:
        per_hour = "$/H" if found.currency == "USD" else f"{found.currency}/H"
        _table(rows(found, now), (*HEADERS[:-1], per_hour))
        for line in closing(found):
            say(line)
    elif found.cloud == "ucloud":
        TERMINAL.info("nothing vmrun made at UCloud")
    else:
        TERMINAL.info(f"nothing vmrun made in {', '.join(found.regions) or 'no region'}")
    for gap in found.gaps:
        report(gap.error)
    return found.exit_code


def rows(found: Listing, now: datetime) -> list[tuple[str, ...]]:
    forgotten = set(found.forgotten)
    return [
        (
            r.cluster + (FORGOTTEN if r.cluster in forgotten else ""),
            r.kind,
            r.id,
            r.zone or r.region,
            r.state or "-",
            _type(r),
            age_text(r.created, now),
            "-" if r.price is None else f"{r.price:.3f}",
        )
        for r in found.resources
    ]


def _type(r: Resource) -> str:
    if r.kind == "volume" and r.size_gb:
        return f"{r.instance_type or '?'} {r.size_gb}G"
    return (r.instance_type + (" spot" if r.spot else "")) or "-"


def closing(found: Listing) -> list[str]:
    """The lines under the table: what runs costs, and how to remove a cluster."""
    left = f", {found.volumes_left} volume(s) left behind" if found.volumes_left else ""
    unpriced = f" ({found.unpriced} without a price)" if found.unpriced else ""
    from vmrun.results.cost import money

    billing = f"billing: {found.running} instance(s) running{left}"
    lines = [f"{billing}: {money(found.per_hour, found.currency)}/h{unpriced}"]
    if found.forgotten:
        lines.append(
            f"possibly forgotten (in no vmrun.toml here): {', '.join(found.forgotten)};"
            " remove one with `vmrun down NAME`"
        )
    else:
        lines.append("remove a cluster with `vmrun down NAME`")
    return lines


def age_text(created: datetime | None, now: datetime) -> str:
    """The two largest units: 3d4h, 5h12m, 7m; "-" when unknown."""
    if created is None:
        return "-"
    seconds = max(0, int((now - created).total_seconds()))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size or (unit == "m" and not parts):
            count, seconds = divmod(seconds, size)
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])


def to_json(found: Listing, now: datetime) -> dict[str, Any]:
    from vmrun.errors import error_json

    forgotten = set(found.forgotten)
    return {
        "regions": found.regions,
        "resources": [
            {
                "cluster": r.cluster,
                "kind": r.kind,
                "id": r.id,
                "region": r.region,
                "zone": r.zone or None,
                "state": r.state or None,
                "type": r.instance_type or None,
                "size_gb": r.size_gb or None,
                "spot": r.spot,
                "created": r.created.isoformat(timespec="seconds") if r.created else None,
                "age_s": int((now - r.created).total_seconds()) if r.created else None,
                "creator": r.creator or None,
                "price_per_hour": r.price,
                "forgotten": r.cluster in forgotten,
            }
            for r in found.resources
        ],
        "forgotten": found.forgotten,
        "per_hour": found.per_hour,
        "currency": found.currency,
        "unpriced": found.unpriced,
        "errors": [{"region": g.region, "kind": g.kind, **error_json(g.error)} for g in found.gaps],
    }


def _table(table: list[tuple[str, ...]], headers: tuple[str, ...] = HEADERS) -> None:
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    for row in (headers, *table):
        say("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
