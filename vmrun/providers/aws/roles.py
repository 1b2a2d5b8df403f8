"""`vmrun up NAME --store s3://BUCKET/PREFIX`: the cluster's VMs get a role of their own
(an instance profile, `vmrun-NAME`) that may list, read and write that bucket prefix and
nothing else, so a run's copy to the bucket (`train --store`) and `push s3://...` need no
key of the user's on the VMs (`store_credentials = "host"`). Made before the instances,
removed with them (`down`, or a failed `up`); a role left from an earlier cluster of the
same name is made anew."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from vmrun.providers.aws.session import cloud_error, error_code
from vmrun.store_url import StoreURL

ASSUME = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole",
        },
    ],
}
POLICY = "vmrun-store"
_GONE = ("NoSuchEntity",)


def role_name(cluster: str) -> str:
    return f"vmrun-{cluster}"


def store_policy(store: StoreURL) -> dict[str, Any]:
    """List the prefix, read and write under it; nothing else of the bucket or the account."""
    bucket = f"arn:aws:s3:::{store.bucket}"
    under = f"{bucket}/{store.prefix}/*" if store.prefix else f"{bucket}/*"
    listing: dict[str, Any] = {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": bucket}
    if store.prefix:
        listing["Condition"] = {"StringLike": {"s3:prefix": [store.prefix, f"{store.prefix}/*"]}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            listing,
            {"Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": bucket},
            {
                "Effect": "Allow",
                "Resource": under,
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
            },
        ],
    }


def make_role(iam: Any, cluster: str, store: StoreURL, tags: list[dict[str, str]]) -> str:
    """The role and its instance profile (named alike); the profile's name."""
    name = role_name(cluster)
    remove_role(iam, cluster)  # an earlier cluster's, if any: its policy may name another place
    try:
        iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(ASSUME),
            Tags=tags,
            Description=f"vmrun cluster {cluster}: {store} only",
        )
        iam.put_role_policy(
            RoleName=name, PolicyName=POLICY, PolicyDocument=json.dumps(store_policy(store))
        )
        iam.create_instance_profile(InstanceProfileName=name, Tags=tags)
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    except Exception as exc:
        raise cloud_error(exc, f"making the role {name} for {store}") from None
    return name


def remove_role(iam: Any, cluster: str) -> str:
    """The cluster's profile and role, if there; "" when gone, else what is left and why."""
    name = role_name(cluster)
    steps: list[Callable[[], Any]] = [
        lambda: iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name),
        lambda: iam.delete_instance_profile(InstanceProfileName=name),
        lambda: iam.delete_role_policy(RoleName=name, PolicyName=POLICY),
        lambda: iam.delete_role(RoleName=name),
    ]
    for step in steps:
        try:
            step()
        except Exception as exc:
            if error_code(exc) not in _GONE:
                return f"role {name}: {error_code(exc) or exc}"
    return ""


def has_role(iam: Any, cluster: str) -> bool:
    try:
        iam.get_role(RoleName=role_name(cluster))
    except Exception as exc:
        if error_code(exc) in _GONE:
            return False
        raise cloud_error(exc, f"looking for the role {role_name(cluster)}") from None
    return True


def profile_not_ready(exc: Exception) -> bool:
    """EC2 does not know a new instance profile for some seconds (IAM is eventually
    consistent): RunInstances says the name is invalid until it does."""
    return error_code(exc) == "InvalidParameterValue" and "iamInstanceProfile" in str(exc)


def wait_profile(tries: int = 20, pause: float = 3.0) -> Callable[[int], bool]:
    """A try counter for launches refused while the profile settles: True to try again."""

    def again(attempt: int) -> bool:
        if attempt >= tries:
            return False
        time.sleep(pause)
        return True

    return again
