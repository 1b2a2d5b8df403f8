"""Everything tagged `vmrun-cluster` in some regions: instances (all but terminated),
security groups, placement groups and the volumes left behind (available, so attached to
nothing and billing all the same).

Each (region, kind) is asked on its own: one that fails (an IAM policy without
`ec2:DescribePlacementGroups`, a region that does not answer) is a `Gap` in the survey,
named and never read as "nothing there", while the others are still listed. Only when
every question failed (no credentials, say) does the survey raise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from vmrun.providers.api import TAG_CLUSTER, TAG_CREATED, TAG_CREATOR, Resource

# The order `vmrun cloud` shows a cluster's resources in: what bills first.
KINDS = ("instance", "volume", "placement-group", "security-group")
LIVE_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
BILLING_STATES = ("pending", "running")  # an instance's hours count from pending on
_TAGGED = {"Name": "tag-key", "Values": [TAG_CLUSTER]}


@dataclass(frozen=True)
class Gap:
    """One kind of resource in one region that could not be listed, and why (a
    CloudError: its code and line)."""

    region: str
    kind: str
    error: BaseException


@dataclass(frozen=True)
class Survey:
    resources: list[Resource] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)


def resources(session: Any, regions: Sequence[str]) -> list[Resource]:
    """Every tagged resource in `regions`, sorted by (cluster, kind, region, id); the first
    gap raised (the Provider protocol's call: all or an error)."""
    found = survey(session, regions)
    if found.gaps:
        raise found.gaps[0].error
    return found.resources


def survey(session: Any, regions: Sequence[str]) -> Survey:
    """What `resources` finds, with the gaps instead of the first one raised."""
    regions = list(dict.fromkeys(regions))
    clients = {region: session.client("ec2", region) for region in regions}  # not thread-safe
    if not regions:
        return Survey()
    with ThreadPoolExecutor(max_workers=min(8, len(regions))) as pool:
        per_region = list(pool.map(lambda r: _region(clients[r], r), regions))
    found = [res for listed, _ in per_region for res in listed]
    gaps = [gap for _, missed in per_region for gap in missed]
    if gaps and len(gaps) == len(regions) * len(KINDS):
        raise gaps[0].error  # nothing answered: one error, not a gap per question
    return Survey(sorted(found, key=sort_key), gaps)


def sort_key(res: Resource) -> tuple[str, int, str, str]:
    rank = KINDS.index(res.kind) if res.kind in KINDS else len(KINDS)
    return (res.cluster, rank, res.region, res.id)


def _region(ec2: Any, region: str) -> tuple[list[Resource], list[Gap]]:
    from vmrun.providers.aws.session import cloud_error

    found: list[Resource] = []
    gaps: list[Gap] = []
    for kind, lister in (
        ("instance", _instances),
        ("volume", _volumes),
        ("placement-group", _placement_groups),
        ("security-group", _security_groups),
    ):
        try:
            found.extend(lister(ec2, region))
        except Exception as exc:
            error = cloud_error(exc, f"listing {kind}s in {region}")
            if error is exc:  # not botocore's: a bug, not a gap
                raise
            gaps.append(Gap(region, kind, error))
    return found, gaps


def _tags(item: Mapping[str, Any]) -> dict[str, str]:
    return {t.get("Key", ""): t.get("Value", "") for t in item.get("Tags") or ()}


def _created(tags: Mapping[str, str], fallback: Any = None) -> datetime | None:
    if isinstance(fallback, datetime):
        return fallback if fallback.tzinfo else fallback.replace(tzinfo=timezone.utc)
    text = tags.get(TAG_CREATED, "")
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _pages(ec2: Any, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for page in ec2.get_paginator(operation).paginate(**params):
        items.extend(page.get(key) or ())
    return items


def _instances(ec2: Any, region: str) -> list[Resource]:
    filters = [_TAGGED, {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    reservations = _pages(ec2, "describe_instances", "Reservations", Filters=filters)
    found = []
    for reservation in reservations:
        for inst in reservation.get("Instances") or ():
            tags = _tags(inst)
            found.append(
                Resource(
                    kind="instance",
                    id=inst["InstanceId"],
                    cluster=tags.get(TAG_CLUSTER, ""),
                    region=region,
                    state=inst.get("State", {}).get("Name", ""),
                    instance_type=inst.get("InstanceType", ""),
                    created=_created(tags, inst.get("LaunchTime")),
                    creator=tags.get(TAG_CREATOR, ""),
                    spot=inst.get("InstanceLifecycle") == "spot",
                    zone=inst.get("Placement", {}).get("AvailabilityZone", ""),
                )
            )
    return found


def _volumes(ec2: Any, region: str) -> list[Resource]:
    filters = [_TAGGED, {"Name": "status", "Values": ["available"]}]
    found = []
    for vol in _pages(ec2, "describe_volumes", "Volumes", Filters=filters):
        tags = _tags(vol)
        found.append(
            Resource(
                kind="volume",
                id=vol["VolumeId"],
                cluster=tags.get(TAG_CLUSTER, ""),
                region=region,
                state=vol.get("State", ""),
                instance_type=vol.get("VolumeType", ""),
                size_gb=int(vol.get("Size") or 0),
                created=_created(tags, vol.get("CreateTime")),
                creator=tags.get(TAG_CREATOR, ""),
                zone=vol.get("AvailabilityZone", ""),
            )
        )
    return found


def _security_groups(ec2: Any, region: str) -> list[Resource]:
    found = []
    for group in _pages(ec2, "describe_security_groups", "SecurityGroups", Filters=[_TAGGED]):
        tags = _tags(group)
        found.append(
            Resource(
                kind="security-group",
                id=group["GroupId"],
                cluster=tags.get(TAG_CLUSTER, ""),
                region=region,
                created=_created(tags),
                creator=tags.get(TAG_CREATOR, ""),
            )
        )
    return found


def _placement_groups(ec2: Any, region: str) -> list[Resource]:
    # No paginator: the call answers every group at once.
    answer = ec2.describe_placement_groups(Filters=[_TAGGED])
    found = []
    for group in answer.get("PlacementGroups") or ():
        tags = _tags(group)
        found.append(
            Resource(
                kind="placement-group",
                id=group.get("GroupName") or group.get("GroupId", ""),
                cluster=tags.get(TAG_CLUSTER, ""),
                region=region,
                state=group.get("State", ""),
                instance_type=group.get("Strategy", ""),
                created=_created(tags),
                creator=tags.get(TAG_CREATOR, ""),
            )
        )
    return found


def priced(found: Sequence[Resource], prices: Any) -> list[Resource]:
    """What bills by the hour now with its price (`prices`: a prices.Prices): instances
    pending or running, volumes left behind; the rest as they are (a stopped instance
    costs no instance hours; its disks are its volumes, attached, not listed)."""
    return [_priced(r, prices) for r in found]


def _priced(res: Resource, prices: Any) -> Resource:
    if res.kind == "instance" and res.instance_type and res.state in BILLING_STATES:
        return replace(res, price=prices.hourly(res.instance_type, res.region, res.zone, res.spot))
    if res.kind == "volume" and res.instance_type and res.size_gb:
        return replace(res, price=prices.volume(res.instance_type, res.size_gb, res.region))
    return res


def billing(res: Resource) -> bool:
    """Whether `res` costs money by the hour now."""
    return (res.kind == "instance" and res.state in BILLING_STATES) or res.kind == "volume"
