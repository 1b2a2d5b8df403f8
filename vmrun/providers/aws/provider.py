"""EC2 behind the provider seam: offer, launch (zone by zone), add one more, describe, wait,
stop, start, terminate. Everything it makes carries the cluster's tags and is found again by
them, so a crash, a Ctrl-C or another machine's `vmrun down` can always remove it."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from vmrun.errors import CloudError, UsageError, VmrunError
from vmrun.providers.api import (
    EVERY_STATE,
    TAG_CLUSTER,
    TAG_CREATED,
    TAG_CREATOR,
    Instance,
    Offer,
    Removed,
    Request,
    Resource,
)
from vmrun.providers.aws import capacity, network
from vmrun.providers.aws.images import find_image
from vmrun.providers.aws.session import Session, cloud_error, error_code, error_message
from vmrun.reporting import Reporter

TAG_NODE = "vmrun-node"  # the instance's place in the cluster (0: the first node)
LIVE_STATES = ("pending", "running", "stopping", "stopped")
# Burstable types cannot be in a cluster placement group.
_NO_PLACEMENT = ("t2.", "t3.", "t3a.", "t4g.")


class AwsProvider:
    name = "aws"

    def __init__(self, session: Session) -> None:
        self.session = session

    @property
    def default_region(self) -> str:
        return self.session.default_region

    def ec2(self, region: str) -> Any:
        return self.session.client("ec2", region)

    # ------------------------------------------------------------------ offer

    def check_credentials(self) -> None:
        self.session.check_credentials()

    def offer(self, request: Request) -> Offer:
        """The image, the zones to try in order and whether a placement group is made;
        refuses a type no zone offers before anything is created."""
        region = request.region or self.session.default_region
        ec2 = self.ec2(region)
        arch = self._arch(ec2, request.instance_type, region)
        zones = self._zones(ec2, request.instance_type, region, request.zone)
        image = find_image(ec2, request.image, arch, request.user)
        placement = (
            request.placement
            and request.count > 1
            and not request.instance_type.startswith(_NO_PLACEMENT)
        )
        return Offer(region, image.id, image.name, image.user, zones, placement, image.root_device)

    def _arch(self, ec2: Any, instance_type: str, region: str) -> str:
        try:
            types = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
        except Exception as exc:
            if error_code(exc) in ("InvalidInstanceType", "InvalidParameterValue"):
                raise UsageError(
                    f"{instance_type} is not an EC2 instance type in {region}",
                    hint="e.g. g4dn.xlarge, g5.2xlarge, p4d.24xlarge",
                    code="cloud-type-not-offered",
                ) from None
            raise cloud_error(exc, f"looking up {instance_type}") from None
        archs = types[0].get("ProcessorInfo", {}).get("SupportedArchitectures", []) if types else []
        return "arm64" if archs and "x86_64" not in archs else "x86_64"

    def _zones(self, ec2: Any, instance_type: str, region: str, zone: str) -> list[str]:
        try:
            pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [instance_type]}],
            )
            offered = sorted(
                {o["Location"] for page in pages for o in page.get("InstanceTypeOfferings", [])}
            )
        except Exception as exc:
            raise cloud_error(exc, f"finding the zones that offer {instance_type}") from None
        if zone:
            if zone not in offered:
                raise UsageError(
                    f"{zone} does not offer {instance_type}"
                    + (f" (zones that do: {', '.join(offered)})" if offered else ""),
                    hint="drop --zone to let vmrun pick, or choose a zone listed",
                    code="cloud-type-not-offered",
                )
            return [zone]
        if not offered:
            raise UsageError(
                f"no zone of {region} offers {instance_type}",
                hint="try another --region (g4dn and g5 are in most regions)",
                code="cloud-type-not-offered",
            )
        return offered

    # ------------------------------------------------------------------ launch

    def launch(self, request: Request, offer: Offer, out: Reporter) -> list[Instance]:
        """Make the group, the placement group and the instances (all in one zone); on any
        failure or Ctrl-C remove what this call made, then raise."""
        ec2 = self.ec2(offer.region)
        tags = _tags(request)
        token = secrets.token_hex(8)
        try:
            subnets = network.default_subnets(ec2, offer.region)
            zones = _with_subnets(offer, subnets)
            vpc = network.vpc_of(ec2, subnets[zones[0]])
            group = network.create_group(
                ec2, f"vmrun-{request.cluster}", vpc, request.ssh_cidr, tags
            )
            out.info(f"{request.cluster}: security group {group}: SSH from {request.ssh_cidr} only")
            placement = self._placement_group(ec2, request, tags) if offer.placement else ""
            profile = self._role(request, offer.region, tags, out) if request.store else ""
            ids = self._run_in_zones(
                ec2, request, offer, zones, subnets, group, (placement, profile), token, out
            )
            for index, instance_id in enumerate(ids):
                _tag(ec2, instance_id, request.cluster, index)
            return self.wait_running(request.cluster, offer.region, ids, timeout=600)
        except BaseException:
            self._undo(request.cluster, offer.region, token, out)
            raise

    def add(self, request: Request, offer: Offer, index: int, out: Reporter) -> Instance:
        """One instance, node `index`, for a cluster that is there (a lost node's
        replacement): its security group, placement group and role, zones in turn as
        `launch` tries them. A failure or Ctrl-C terminates what this call made and nothing
        else: `_undo` would end the whole cluster, which is still working."""
        ec2 = self.ec2(offer.region)
        before = {i.id for i in self.describe(request.cluster, offer.region, EVERY_STATE)}
        ids: list[str] = []
        try:
            subnets, group, placed = self._existing(ec2, request.cluster, offer.region)
            # a cluster placement group lies in one zone: the first (the cluster's) alone
            zones = _with_subnets(offer, subnets)[: 1 if placed[0] else None]
            one = replace(request, count=1)
            token = secrets.token_hex(8)
            ids = self._run_in_zones(ec2, one, offer, zones, subnets, group, placed, token, out)
            _tag(ec2, ids[0], request.cluster, index)
            running = self.wait_running(request.cluster, offer.region, ids, timeout=600)
            if not running:
                raise CloudError(f"{ids[0]} ended before it ran", code="cloud-no-capacity")
            return running[0]
        except BaseException:
            self._drop_new(request.cluster, offer.region, ids, before, out)
            raise

    def _existing(
        self, ec2: Any, cluster: str, region: str
    ) -> tuple[dict[str, str], str, tuple[str, str]]:
        """The cluster's subnets, security group, and (placement group, instance profile),
        "" for none: what its first launch made, found by its tag."""
        from vmrun.providers.aws import roles

        subnets = network.default_subnets(ec2, region)
        groups = network.find_groups(ec2, cluster)
        if not groups:
            raise CloudError(
                f"{cluster} has no security group any more (vmrun-{cluster})",
                hint=f"`vmrun down {cluster}` and `vmrun up {cluster}` again",
            )
        placements = _placement_groups(ec2, cluster)
        profile = roles.role_name(cluster) if self._roles(cluster, region) else ""
        return subnets, groups[0], (placements[0] if placements else "", profile)

    def _drop_new(
        self, cluster: str, region: str, ids: list[str], before: set[str], out: Reporter
    ) -> None:
        """After a failed `add`: terminate its instance; one whose id never came back (Ctrl-C
        during the launch) is the cluster's instance that was not there before."""
        try:
            if not ids:
                ids = [i.id for i in self.describe(cluster, region) if i.id not in before]
            if ids:
                out.warn(f"{cluster}: terminating the new {', '.join(ids)}")
                self.terminate_ids(region, ids)
        except Exception as exc:  # the failure that brought us here is the one to raise
            what = ", ".join(ids) or "the new instance"
            out.warn(f"{cluster}: could not terminate {what}: {exc} (`vmrun cloud` lists it)")

    def _role(
        self, request: Request, region: str, tags: list[dict[str, str]], out: Reporter
    ) -> str:
        from vmrun.providers.aws import roles
        from vmrun.store_url import parse_store

        store = parse_store(request.store)
        profile = roles.make_role(self.session.client("iam", region), request.cluster, store, tags)
        out.info(f"{request.cluster}: role {profile}: the VMs reach {store} and nothing else")
        return profile

    def _placement_group(self, ec2: Any, request: Request, tags: list[dict[str, str]]) -> str:
        name = f"vmrun-{request.cluster}"
        try:
            ec2.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
            )
        except Exception as exc:
            raise cloud_error(exc, f"creating the placement group {name}") from None
        return name

    def _run_in_zones(
        self,
        ec2: Any,
        request: Request,
        offer: Offer,
        zones: list[str],
        subnets: dict[str, str],
        group: str,
        placed: tuple[str, str],
        token: str,
        out: Reporter,
    ) -> list[str]:
        """Each zone in turn until one gives all `count` instances; spot first when asked,
        on-demand after every zone said no only with spot_fallback. `placed`: the placement
        group and the instance profile ("" for none)."""
        markets = [request.spot] + ([False] if request.spot and request.spot_fallback else [])
        refusals: list[str] = []
        for spot in markets:
            if not spot and request.spot:
                out.warn(f"{request.cluster}: no spot capacity anywhere: on-demand instead")
            for zone in zones:
                params = _run_params(request, offer, zone, subnets[zone], group, placed, spot)
                params["ClientToken"] = f"{token}-{zone}-{'spot' if spot else 'od'}"
                try:
                    reply = self._run(offer.region, params)
                except Exception as exc:
                    code = error_code(exc)
                    if code in capacity.QUOTA_CODES:
                        raise capacity.quota_error(
                            code, error_message(exc), request.instance_type, offer.region, spot
                        ) from None
                    if code not in capacity.ZONE_CODES:
                        raise cloud_error(
                            exc, f"launching {request.instance_type} in {zone}"
                        ) from None
                    refusals.append(f"{zone}{' (spot)' if spot else ''}: {code}")
                    out.info(
                        f"{request.cluster}: {zone} has no {request.instance_type} now ({code})"
                    )
                    continue
                ids = [i["InstanceId"] for i in reply["Instances"]]
                for index, instance_id in enumerate(ids):
                    out.info(f"{request.cluster}: node {index} {instance_id} requested in {zone}")
                return ids
        raise CloudError(
            f"no zone of {offer.region} has {request.count} x {request.instance_type} now: "
            + "; ".join(refusals),
            hint=(
                "add --spot-fallback to take on-demand instances"
                if request.spot and not request.spot_fallback
                else "try another --region or --type, or later"
            ),
            code="cloud-no-capacity",
        )

    def _run(self, region: str, params: dict[str, Any]) -> Any:
        """RunInstances, tried again while a new instance profile settles (bounded)."""
        from vmrun.providers.aws import roles

        again = roles.wait_profile()
        attempt = 0
        while True:
            try:
                return self.session.client("ec2", region, once=True).run_instances(**params)
            except Exception as exc:
                attempt += 1
                if not (roles.profile_not_ready(exc) and again(attempt)):
                    raise

    # ------------------------------------------------------------------ find, wait

    def describe(
        self, cluster: str, region: str, states: tuple[str, ...] = LIVE_STATES
    ) -> list[Instance]:
        ec2 = self.ec2(region)
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
        try:
            pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
            found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        except Exception as exc:
            raise cloud_error(exc, f"listing {cluster}'s instances") from None
        instances = [_instance(raw, cluster, region) for raw in found]
        return sorted(instances, key=lambda i: (i.index, i.id))

    def wait_running(
        self, cluster: str, region: str, ids: list[str], timeout: float
    ) -> list[Instance]:
        ec2 = self.ec2(region)
        delay = 5
        try:
            ec2.get_waiter("instance_running").wait(
                InstanceIds=ids,
                WaiterConfig={"Delay": delay, "MaxAttempts": max(1, int(timeout // delay))},
            )
        except Exception as exc:
            raise cloud_error(exc, f"waiting for {cluster}'s instances to run") from None
        running = [i for i in self.describe(cluster, region, ("running",)) if i.id in ids]
        return running

    # ------------------------------------------------------------------ stop, start, remove

    def stop(self, cluster: str, region: str) -> Removed:
        ec2 = self.ec2(region)
        instances = [i for i in self.describe(cluster, region) if i.state in ("pending", "running")]
        ids = [i.id for i in instances]
        spot = [i.id for i in instances if i.spot]
        if spot:
            raise UsageError(
                f"{cluster}'s spot instances ({', '.join(spot)}) cannot be stopped, only ended",
                hint=f"`vmrun down {cluster}` without --stop",
                code="flags-conflict",
            )
        if ids:
            try:
                ec2.stop_instances(InstanceIds=ids)
                ec2.get_waiter("instance_stopped").wait(
                    InstanceIds=ids, WaiterConfig={"Delay": 5, "MaxAttempts": 120}
                )
            except Exception as exc:
                raise cloud_error(exc, f"stopping {cluster}") from None
        return Removed(instances=ids)

    def start(self, cluster: str, region: str, out: Reporter) -> list[Instance]:
        ec2 = self.ec2(region)
        ids = [i.id for i in self.describe(cluster, region) if i.state in ("stopped", "stopping")]
        if ids:
            try:
                ec2.get_waiter("instance_stopped").wait(
                    InstanceIds=ids, WaiterConfig={"Delay": 5, "MaxAttempts": 120}
                )
                ec2.start_instances(InstanceIds=ids)
            except Exception as exc:
                raise cloud_error(exc, f"starting {cluster}") from None
            out.info(f"{cluster}: starting {', '.join(ids)}")
        all_ids = [i.id for i in self.describe(cluster, region)]
        return self.wait_running(cluster, region, all_ids, timeout=600)

    def terminate(self, cluster: str, region: str) -> Removed:
        """Every instance, then the security and placement groups once nothing uses them;
        checked again with describe calls. Idempotent: nothing left is no error."""
        ec2 = self.ec2(region)
        ids = [i.id for i in self.describe(cluster, region, (*LIVE_STATES, "shutting-down"))]
        if ids:
            try:
                ec2.terminate_instances(InstanceIds=ids)
                ec2.get_waiter("instance_terminated").wait(
                    InstanceIds=ids, WaiterConfig={"Delay": 5, "MaxAttempts": 120}
                )
            except Exception as exc:
                raise cloud_error(exc, f"terminating {cluster}'s instances") from None
        left = [
            f"{i.id}: {i.state}"
            for i in self.describe(cluster, region, (*LIVE_STATES, "shutting-down"))
        ]
        groups = _or_unchecked(lambda: network.find_groups(ec2, cluster), "security groups", left)
        left += [why for why in (network.delete_group(ec2, g) for g in groups) if why]
        placements = _or_unchecked(
            lambda: _placement_groups(ec2, cluster), "placement groups", left
        )
        left += [why for why in (_delete_placement(ec2, p) for p in placements) if why]
        roles = _or_unchecked(lambda: self._roles(cluster, region), "role", left)
        left += [why for why in (self._remove_role(cluster, region) for _ in roles) if why]
        return Removed(ids, groups, placements, left, roles)

    def terminate_ids(self, region: str, ids: list[str]) -> list[str]:
        """These instances alone, not waited for (a replaced node; an `add` that failed).
        An id AWS no longer knows is gone already."""
        if not ids:
            return []
        try:
            self.ec2(region).terminate_instances(InstanceIds=ids)
        except Exception as exc:
            if error_code(exc) != "InvalidInstanceID.NotFound":
                raise cloud_error(exc, f"terminating {', '.join(ids)}") from None
            if len(ids) > 1:  # one unknown id refuses them all: each on its own then
                for one in ids:
                    self.terminate_ids(region, [one])
        return ids

    def _roles(self, cluster: str, region: str) -> list[str]:
        from vmrun.providers.aws import roles

        iam = self.session.client("iam", region)
        return [roles.role_name(cluster)] if roles.has_role(iam, cluster) else []

    def _remove_role(self, cluster: str, region: str) -> str:
        from vmrun.providers.aws import roles

        return roles.remove_role(self.session.client("iam", region), cluster)

    def hourly_price(self, instance: Instance) -> float | None:
        """USD per hour for one instance like this (None where the price list is silent)."""
        from vmrun.providers.aws.prices import Prices

        prices = Prices(self.session)
        price = prices.hourly(instance.instance_type, instance.region, instance.zone, instance.spot)
        prices.save()
        return price

    def price_currency(self, instance: Instance) -> str:
        return "USD"  # the Price List's and the spot history's

    def host_key(self, instance: Instance) -> str:
        """The public host key vmrun handed the instance at launch ("ssh-ed25519 AAAA..."),
        read back from its user data: how another machine, or a lost known_hosts, pins it."""
        for line in self.user_data(instance).splitlines():
            key, _, value = line.strip().partition(": ")
            if key == "ed25519_public":
                return " ".join(value.split()[:2])
        return ""

    def user_data(self, instance: Instance) -> str:
        """The cloud-init document the instance was launched with: a replacement gets the
        same (the cluster's host key, the user's key)."""
        import base64

        try:
            answer = self.ec2(instance.region).describe_instance_attribute(
                InstanceId=instance.id, Attribute="userData"
            )
        except Exception as exc:
            raise cloud_error(exc, f"reading {instance.id}'s user data") from None
        data = base64.b64decode(answer.get("UserData", {}).get("Value", "") or b"")
        return data.decode("utf-8", "replace")

    def resources(self, regions: list[str]) -> list[Resource]:
        from vmrun.providers.aws.listing import resources

        return resources(self.session, regions)

    def _undo(self, cluster: str, region: str, token: str, out: Reporter) -> None:
        """After a failed or interrupted launch: remove what it made (found by tag, and by
        the launch's client token for an instance whose tags were not yet visible)."""
        out.warn(f"{cluster}: removing what was made so far")
        removed = self.terminate(cluster, region)
        if removed.left:
            out.warn(f"{cluster}: still there: {'; '.join(removed.left)} (`vmrun down {cluster}`)")


def _with_subnets(offer: Offer, subnets: dict[str, str]) -> list[str]:
    """The offer's zones that have a default subnet, in its order."""
    zones = [z for z in offer.zones if z in subnets]
    if not zones:
        raise CloudError(
            f"the default VPC of {offer.region} has no subnet in " + ", ".join(offer.zones),
            hint="create default subnets (`aws ec2 create-default-subnet`) or pass --zone",
        )
    return zones


def _tags(request: Request) -> list[dict[str, str]]:
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [
        {"Key": TAG_CLUSTER, "Value": request.cluster},
        {"Key": TAG_CREATOR, "Value": request.creator},
        {"Key": TAG_CREATED, "Value": created},
        {"Key": "Name", "Value": f"vmrun-{request.cluster}"},
    ]


def _run_params(
    request: Request,
    offer: Offer,
    zone: str,
    subnet: str,
    group: str,
    placed: tuple[str, str],
    spot: bool,
) -> dict[str, Any]:
    placement, profile = placed
    tags = _tags(request)
    params: dict[str, Any] = {
        "ImageId": offer.image_id,
        "InstanceType": request.instance_type,
        "MinCount": request.count,
        "MaxCount": request.count,
        "SubnetId": subnet,
        "SecurityGroupIds": [group],
        "Placement": {"AvailabilityZone": zone, **({"GroupName": placement} if placement else {})},
        "UserData": request.user_data,
        # A power-off from inside (autostop) ends the bill; a one-time spot can only end.
        "InstanceInitiatedShutdownBehavior": "terminate" if spot else request.power_off,
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
    }
    if profile:
        params["IamInstanceProfile"] = {"Name": profile}
    if request.disk_gb:
        params["BlockDeviceMappings"] = [
            {
                "DeviceName": offer.root_device,
                "Ebs": {
                    "VolumeSize": request.disk_gb,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                },
            }
        ]
    if spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    return params


def _tag(ec2: Any, instance_id: str, cluster: str, index: int) -> None:
    try:
        ec2.create_tags(
            Resources=[instance_id],
            Tags=[
                {"Key": "Name", "Value": f"vmrun-{cluster}-{index}"},
                {"Key": TAG_NODE, "Value": str(index)},
            ],
        )
    except Exception as exc:
        raise cloud_error(exc, f"tagging {instance_id}") from None


def _instance(raw: dict[str, Any], cluster: str, region: str) -> Instance:
    tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
    index = tags.get(TAG_NODE, "")
    return Instance(
        id=raw["InstanceId"],
        cluster=cluster,
        state=raw.get("State", {}).get("Name", ""),
        instance_type=raw.get("InstanceType", ""),
        zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
        region=region,
        public_addr=raw.get("PublicIpAddress", "") or "",
        private_addr=raw.get("PrivateIpAddress", "") or "",
        launched=raw.get("LaunchTime"),
        spot=raw.get("InstanceLifecycle") == "spot",
        index=int(index) if index.isdigit() else 1_000_000,
        image_id=raw.get("ImageId", "") or "",
    )


def _or_unchecked(find: Callable[[], list[str]], what: str, left: list[str]) -> list[str]:
    """The cluster's `what`, or none with a line in `left` when the cloud did not say: the
    rest of the removal goes on, and what was not checked is said (and fails the command)."""
    try:
        return find()
    except VmrunError as exc:
        left.append(f"its {what} were not checked ({exc.message})")
        return []


def _placement_groups(ec2: Any, cluster: str) -> list[str]:
    try:
        groups = ec2.describe_placement_groups(
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
        )["PlacementGroups"]
    except Exception as exc:
        raise cloud_error(exc, f"finding {cluster}'s placement group") from None
    return [g["GroupName"] for g in groups if g.get("State") != "deleted"]


def _delete_placement(ec2: Any, name: str, tries: int = 15) -> str:
    return network.delete_when_free(
        lambda: ec2.delete_placement_group(GroupName=name),
        name,
        gone="InvalidPlacementGroup.Unknown",
        busy="InvalidPlacementGroup.InUse",
        tries=tries,
    )
