"""`vmrun clusters`: every resource vmrun tagged, in every region it used, with what the
running ones cost per hour; a cluster this project's vmrun.toml does not name is marked
possibly forgotten (the bill nobody is watching)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmrun.config import CLOUDS, Settings
from vmrun.errors import exit_code_for
from vmrun.providers.api import Resource
from vmrun.providers.aws.listing import BILLING_STATES, Gap

PROVIDER = "aws"


@dataclass(frozen=True)
class Listing:
    """What `list_clusters` found. `gaps`: (region, kind, error) asked and not answered,
    so the listing may miss something there; `per_hour`: USD per hour of what bills by the
    hour now (instances pending or running, volumes left behind) where the price is known,
    `unpriced`: how many of those have none."""

    regions: list[str]
    resources: list[Resource]
    forgotten: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    per_hour: float = 0.0
    unpriced: int = 0
    currency: str = "USD"  # the prices' (UCloud's: DKK)
    cloud: str = PROVIDER

    @property
    def clusters(self) -> list[str]:
        return sorted({r.cluster for r in self.resources})

    @property
    def running(self) -> int:
        """Instances billing by the hour (pending or running)."""
        return sum(r.kind == "instance" and r.state in BILLING_STATES for r in self.resources)

    @property
    def volumes_left(self) -> int:
        return sum(r.kind == "volume" for r in self.resources)

    @property
    def exit_code(self) -> int:
        """0 when every region answered every question, else the worst gap's (15)."""
        return max((exit_code_for(g.error) for g in self.gaps), default=0)


def recorded_clusters(project_data: Mapping[str, Any]) -> set[str]:
    """The clusters a vmrun.toml names: a `[[clouds]]` table's `name`, or a group of any
    host (`vmrun up` records both)."""
    names: set[str] = set()
    for table in project_data.get("clouds") or ():
        if isinstance(table, dict) and isinstance(table.get("name"), str):
            names.add(table["name"])
    for host in project_data.get("hosts") or ():
        groups = host.get("groups") if isinstance(host, dict) else None
        for group in groups if isinstance(groups, list) else ():
            if isinstance(group, str):
                names.add(group.removeprefix("@"))
    return names


def project_regions(project_data: Mapping[str, Any]) -> list[str]:
    return [
        t["region"]
        for t in project_data.get("clouds") or ()
        if isinstance(t, dict) and isinstance(t.get("region"), str) and t["region"]
    ]


def project_profile(project_data: Mapping[str, Any]) -> str | None:
    """The AWS profile the project's `[[clouds]]` use, when they agree on one."""
    named = {
        t["profile"]
        for t in project_data.get("clouds") or ()
        if isinstance(t, dict) and isinstance(t.get("profile"), str) and t["profile"]
    }
    return named.pop() if len(named) == 1 else None


def project_cloud(project_data: Mapping[str, Any]) -> str:
    """The cloud `vmrun clusters` looks in by default: the one every `[[clouds]]` table the
    project has names, else AWS."""
    named = {
        str(t.get("cloud") or PROVIDER)
        for t in project_data.get("clouds") or ()
        if isinstance(t, dict)
    }
    return named.pop() if len(named) == 1 and named <= set(CLOUDS) else PROVIDER


def list_ucloud(settings: Settings, provider: Any = None) -> Listing:
    """What vmrun made at UCloud: its live VM jobs (labelled vmrun-cluster), each running
    one at its product's price an hour, in DKK. `provider`: a UCloudProvider (None: one
    from the environment's token)."""
    from vmrun.providers.api import Instance
    from vmrun.providers.ucloud.provider import UCloudProvider

    provider = provider or UCloudProvider()
    provider.check_credentials()
    priced, currencies = [], set()
    for res in provider.resources([]):
        price = None
        if res.state in BILLING_STATES:
            probe = Instance(
                id=res.id,
                cluster=res.cluster,
                state=res.state,
                instance_type=res.instance_type,
                zone="",
                region=res.region,
                public_addr="",
                private_addr="",
            )
            price = provider.hourly_price(probe)
            if price is not None:
                currencies.add(provider.price_currency(probe))
        priced.append(replace(res, price=price))
    billing = [r for r in priced if r.kind == "instance" and r.state in BILLING_STATES]
    known = recorded_clusters(settings.project_data)
    return Listing(
        regions=sorted({r.region for r in priced if r.region}),
        resources=priced,
        forgotten=sorted({r.cluster for r in priced} - known),
        per_hour=round(sum(r.price for r in billing if r.price is not None), 4),
        unpriced=sum(r.price is None for r in billing),
        currency=currencies.pop() if len(currencies) == 1 else "DKK",
        cloud="ucloud",
    )


def list_clusters(
    settings: Settings,
    *,
    profile: str | None = None,
    regions: Sequence[str] | None = None,
    all_regions: bool = False,
    session: Any = None,
    environ: Mapping[str, str] | None = None,
) -> Listing:
    """Resources of the given `regions`; of every enabled region (`all_regions`); else of
    every region `vmrun up` noted, the project's `[[clouds]]` regions and the profile's
    default region (where a cluster made by hand most likely is). `session`: a
    vmrun.providers.aws.session.Session (None: made from `profile`, else the profile the
    project's [[clouds]] name, else boto3's chain)."""
    from vmrun.providers.aws import listing
    from vmrun.providers.aws.prices import Prices
    from vmrun.providers.aws.session import Session

    environ = os.environ if environ is None else environ
    if session is None:
        session = Session(profile or project_profile(settings.project_data))
    where = _regions(session, settings, regions, all_regions, environ)
    found = listing.survey(session, where)
    prices = Prices(session, environ=environ)
    resources = listing.priced(found.resources, prices)
    prices.save()
    known = recorded_clusters(settings.project_data)
    billing = [r for r in resources if listing.billing(r)]
    return Listing(
        regions=where,
        resources=resources,
        forgotten=sorted({r.cluster for r in resources} - known),
        gaps=list(found.gaps),
        per_hour=round(sum(r.price for r in billing if r.price is not None), 4),
        unpriced=sum(r.price is None for r in billing),
    )


def _regions(
    session: Any,
    settings: Settings,
    regions: Sequence[str] | None,
    all_regions: bool,
    environ: Mapping[str, str],
) -> list[str]:
    if regions:
        return _unique(regions)
    if all_regions:
        from vmrun.providers.aws.session import cloud_error

        try:
            answer = session.client("ec2", session.default_region).describe_regions()
        except Exception as exc:
            raise cloud_error(exc, "listing the account's regions") from None
        return sorted(r["RegionName"] for r in answer.get("Regions", ()))
    from vmrun.providers.regions import regions_used

    return _unique(
        [
            *regions_used(PROVIDER, environ=environ),
            *project_regions(settings.project_data),
            session.default_region,
        ]
    )


def _unique(regions: Iterable[str]) -> list[str]:
    return sorted({r for r in regions if r})
