"""What moto lacks, answered in-process for the quick tier's `mock_aws` tests."""

from __future__ import annotations

from typing import Any


def placement_groups_on(
    ec2: Any, groups: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """moto has no placement groups: the three calls answered here, from a dict (the
    Stubber tests below check the requests vmrun sends)."""
    from botocore.awsrequest import AWSResponse

    groups = {} if groups is None else groups
    ok = AWSResponse("https://ec2", 200, {}, None)

    def create(params: dict[str, Any], **_: Any) -> Any:
        name = params["body"]["GroupName"]
        groups[name] = {"GroupName": name, "State": "available", "Tags": []}
        return ok, {}

    def describe(**_: Any) -> Any:
        return ok, {"PlacementGroups": list(groups.values())}

    def delete(params: dict[str, Any], **_: Any) -> Any:
        groups.pop(params["body"]["GroupName"], None)
        return ok, {}

    events = ec2.meta.events
    events.register("before-call.ec2.CreatePlacementGroup", create)
    events.register("before-call.ec2.DescribePlacementGroups", describe)
    events.register("before-call.ec2.DeletePlacementGroup", delete)
    return groups
