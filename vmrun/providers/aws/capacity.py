"""What an EC2 refusal means for the next try: another zone, or stop and tell the user which
quota to raise. The split follows AWS's error list (docs.aws.amazon.com/AWSEC2/latest/
APIReference/errors-overview.html) and ParallelCluster's fast-failover codes."""

from __future__ import annotations

import re

from vmrun.errors import CloudError

# This zone cannot (now) give the type: the next zone may.
ZONE_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "UnfulfillableCapacity",
        "Unsupported",
        "SpotMaxPriceTooLow",
    }
)
# The account (in this region) may not have more: no other zone helps.
QUOTA_CODES = frozenset(
    {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}
)

# family -> (the quota's name in the Service Quotas console, on-demand code, spot code)
_QUOTAS = {
    "standard": ("Standard (A, C, D, H, I, M, R, T, Z)", "L-1216C47A", "L-34B43A08"),
    "g": ("G and VT", "L-DB2E81BA", "L-3819A6DF"),
    "vt": ("G and VT", "L-DB2E81BA", "L-3819A6DF"),
    "p": ("P", "L-417A185B", "L-7212CCBC"),
    "inf": ("Inf", "L-1945791B", "L-B5D1601B"),
    "trn": ("Trn", "L-2C3B7624", "L-6B0D517C"),
    "dl": ("DL", "L-6E869C2A", "L-85EED4F7"),
    "f": ("F", "L-74FC7D96", "L-88CF9481"),
    "x": ("X", "L-7295265B", "L-E3A00192"),
}


def family(instance_type: str) -> str:
    match = re.match(r"[a-z]+", instance_type)
    letters = match.group(0) if match else ""
    for name in ("inf", "trn", "dl", "vt"):
        if letters.startswith(name):
            return name
    return letters[:1] if letters[:1] in _QUOTAS else "standard"


def quota_error(code: str, message: str, instance_type: str, region: str, spot: bool) -> CloudError:
    """The one line for a quota refusal: which quota, and how to ask for more."""
    name, on_demand, spot_code = _QUOTAS[family(instance_type)]
    quota = spot_code if spot else on_demand
    kind = "Spot Instance Requests" if spot else "On-Demand instances"
    return CloudError(
        f"AWS refused {instance_type} in {region}: {code} ({message}); the quota is"
        f" 'Running {kind}: {name}' ({quota}), counted in vCPUs",
        hint=(
            f"ask for more: aws service-quotas request-service-quota-increase --region {region}"
            f" --service-code ec2 --quota-code {quota} --desired-value VCPUS (or the Service"
            " Quotas console)"
        ),
        code="cloud-quota",
    )
