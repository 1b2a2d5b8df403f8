"""The network a cluster lives in: the region's default VPC, one subnet per zone, and one
security group per cluster that lets in SSH from one address and all traffic between the
cluster's own members (c10d, NCCL, gloo pick ports at run time), nothing else."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vmrun.errors import CloudError
from vmrun.providers.aws.session import cloud_error, error_code

# A group still attached to an instance that is shutting down refuses deletion for a while.
_DELETE_TRIES = 30
_DELETE_PAUSE = 2.0


def default_subnets(ec2: Any, region: str) -> dict[str, str]:
    """zone -> subnet id of the default VPC's default subnets."""
    try:
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise CloudError(
                f"{region} has no default VPC",
                hint="create one with `aws ec2 create-default-vpc --region " + region + "`",
            )
        vpc = vpcs[0]["VpcId"]
        subnets = ec2.describe_subnets(
            Filters=[
                {"Name": "vpc-id", "Values": [vpc]},
                {"Name": "default-for-az", "Values": ["true"]},
            ]
        )["Subnets"]
    except CloudError:
        raise
    except Exception as exc:
        raise cloud_error(exc, f"reading {region}'s default VPC") from None
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def vpc_of(ec2: Any, subnet: str) -> str:
    try:
        return str(ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["VpcId"])
    except Exception as exc:
        raise cloud_error(exc, "reading the subnet's VPC") from None


def create_group(ec2: Any, name: str, vpc: str, ssh_cidr: str, tags: list[dict[str, str]]) -> str:
    """The cluster's security group: tcp/22 from `ssh_cidr`, everything from itself."""
    try:
        group = ec2.create_security_group(
            GroupName=name,
            Description=f"vmrun cluster {name}: SSH from one address, all traffic inside",
            VpcId=vpc,
            TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
        )["GroupId"]
    except Exception as exc:
        raise cloud_error(exc, f"creating the security group {name}") from None
    try:
        ec2.authorize_security_group_ingress(
            GroupId=group,
            IpPermissions=[
                {
                    "IpProtocol": "tcp",
                    "FromPort": 22,
                    "ToPort": 22,
                    "IpRanges": [{"CidrIp": ssh_cidr, "Description": "SSH from vmrun's user"}],
                },
                {
                    "IpProtocol": "-1",
                    "UserIdGroupPairs": [{"GroupId": group, "Description": "the cluster itself"}],
                },
            ],
        )
    except Exception as exc:
        delete_group(ec2, group)
        raise cloud_error(exc, f"opening SSH in the security group {name}") from None
    return str(group)


def delete_group(ec2: Any, group: str, *, tries: int = _DELETE_TRIES) -> str:
    """Delete a group, waiting while a terminating instance still holds it. "" when it is
    gone (or was never there), else why it is left."""
    return delete_when_free(
        lambda: ec2.delete_security_group(GroupId=group),
        group,
        gone="InvalidGroup.NotFound",
        busy="DependencyViolation",
        tries=tries,
    )


def delete_when_free(
    delete: Callable[[], object], name: str, *, gone: str, busy: str, tries: int = _DELETE_TRIES
) -> str:
    """Call `delete` until it works, retrying while AWS answers `busy` (still in use by an
    instance that is going away); `gone` counts as done. "" when done, else why not."""
    for attempt in range(tries):
        try:
            delete()
            return ""
        except Exception as exc:
            code = error_code(exc)
            if code == gone:
                return ""
            if code != busy or attempt == tries - 1:
                return f"{name}: {code or type(exc).__name__}"
        time.sleep(_DELETE_PAUSE)
    return f"{name}: {busy}"


def find_groups(ec2: Any, cluster: str) -> list[str]:
    from vmrun.providers.api import TAG_CLUSTER

    try:
        groups = ec2.describe_security_groups(
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
        )["SecurityGroups"]
    except Exception as exc:
        raise cloud_error(exc, f"finding {cluster}'s security group") from None
    return [g["GroupId"] for g in groups]
