"""The AWS provider's own decisions against moto in-process (`mock_aws` patches botocore:
nothing is dialled): zones tried in turn, quota lines, spot never silently on-demand, every
resource tagged and removed, Ctrl-C mid-launch leaving nothing. Calls moto lacks (placement
groups, the DLAMI catalog) are checked with botocore's Stubber at that one point."""

from __future__ import annotations

from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from aws_fakes import placement_groups_on, use_test_credentials  # noqa: E402
from botocore.stub import ANY, Stubber  # noqa: E402

from vmrun.errors import CloudError, UsageError  # noqa: E402
from vmrun.providers.api import TAG_CLUSTER, Request  # noqa: E402
from vmrun.providers.aws import images  # noqa: E402
from vmrun.providers.aws.provider import AwsProvider, _delete_placement  # noqa: E402
from vmrun.providers.aws.session import Session  # noqa: E402
from vmrun.reporting import Recorder  # noqa: E402

REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, fresh_moto: Any) -> Any:
    use_test_credentials(monkeypatch)
    provider = AwsProvider(Session())
    placement_groups_on(provider.ec2(REGION))
    yield provider


def _ami(provider: AwsProvider) -> str:
    ec2 = provider.ec2(REGION)
    found = ec2.describe_images(Owners=["self"])["Images"]
    if found:
        return str(found[0]["ImageId"])
    return str(ec2.register_image(Name="gpu", RootDeviceName="/dev/sda1")["ImageId"])


def _request(provider: AwsProvider, **kw: Any) -> Request:
    values: dict[str, Any] = {
        "cluster": "c1",
        "instance_type": "g4dn.xlarge",
        "count": 1,
        "region": REGION,
        "image": _ami(provider),
        "ssh_cidr": "198.51.100.7/32",
        "user_data": "#cloud-config\n",
        "creator": "me@laptop",
        **kw,
    }
    return Request(**values)


def _refuse(provider: AwsProvider, codes: dict[str, str]) -> list[str]:
    """RunInstances in a zone named in `codes` answers that AWS error code: (what a real
    region does when it has no capacity); the zones asked, in order."""
    from botocore.awsrequest import AWSResponse

    asked: list[str] = []

    def hook(params: dict[str, Any], **_: Any) -> Any:
        zone = params["body"].get("Placement.AvailabilityZone", "")
        asked.append(zone)
        code = codes.get(zone) or codes.get("*")
        if code:
            error = {"Error": {"Code": code, "Message": f"no {code} here"}}
            return AWSResponse("https://ec2", 500, {}, None), error
        return None

    _launcher(provider).meta.events.register("before-call.ec2.RunInstances", hook)
    return asked


def _launcher(provider: AwsProvider) -> Any:
    """The client RunInstances goes through (one attempt per call: no retries)."""
    return provider.session.client("ec2", REGION, once=True)


def _live(provider: AwsProvider) -> dict[str, list[str]]:
    ec2 = provider.ec2(REGION)
    tag = [{"Name": "tag-key", "Values": [TAG_CLUSTER]}]
    reservations = ec2.describe_instances(Filters=tag)["Reservations"]
    instances = [
        i["InstanceId"]
        for r in reservations
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]
    groups = [g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
    return {"instances": instances, "groups": groups}


def test_offer_lists_only_zones_that_offer_the_type(aws: AwsProvider) -> None:
    offer = aws.offer(_request(aws, instance_type="p4d.24xlarge"))
    assert offer.zones and all(z.startswith(REGION) for z in offer.zones)
    assert set(offer.zones) <= {"us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"}
    with pytest.raises(UsageError) as err:
        aws.offer(_request(aws, instance_type="p4d.24xlarge", zone="us-east-1e"))
    assert err.value.code == "cloud-type-not-offered"


def test_launch_tags_everything_and_opens_ssh_to_one_address_only(aws: AwsProvider) -> None:
    request = _request(aws, count=2, placement=False)
    instances = aws.launch(request, aws.offer(request), Recorder())
    assert [i.index for i in instances] == [0, 1] and all(i.state == "running" for i in instances)
    ec2 = aws.ec2(REGION)
    (group,) = ec2.describe_security_groups(
        Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": ["c1"]}]
    )["SecurityGroups"]
    rules = group["IpPermissions"]
    ssh = [r for r in rules if r.get("FromPort") == 22]
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == ["198.51.100.7/32"]
    inside = [r for r in rules if r["IpProtocol"] == "-1"]
    assert inside[0]["UserIdGroupPairs"][0]["GroupId"] == group["GroupId"]
    assert not any(r.get("IpRanges") for r in inside)  # nothing else is open to anyone
    reply = ec2.describe_instances(InstanceIds=[i.id for i in instances])
    raw = [i for r in reply["Reservations"] for i in r["Instances"]]
    tags = [{t["Key"]: t["Value"] for t in i["Tags"]} for i in raw]
    assert {t[TAG_CLUSTER] for t in tags} == {"c1"}
    assert all(t["vmrun-creator"] == "me@laptop" and t["vmrun-created"] for t in tags)
    assert sorted(t["Name"] for t in tags) == ["vmrun-c1-0", "vmrun-c1-1"]
    assert len({i["Placement"]["AvailabilityZone"] for i in raw}) == 1  # one zone for all


def test_a_zone_without_capacity_is_skipped_for_the_next(aws: AwsProvider) -> None:
    request = _request(aws)
    offer = aws.offer(request)
    first, second = offer.zones[0], offer.zones[1]
    asked = _refuse(aws, {first: "InsufficientInstanceCapacity"})
    out = Recorder()
    (instance,) = aws.launch(request, offer, out)
    assert instance.zone == second and asked[:2] == [first, second]
    assert any("InsufficientInstanceCapacity" in text for _, text in out.said)


def test_no_capacity_anywhere_leaves_nothing_behind(aws: AwsProvider) -> None:
    request = _request(aws)
    _refuse(aws, {"*": "InsufficientInstanceCapacity"})
    with pytest.raises(CloudError) as err:
        aws.launch(request, aws.offer(request), Recorder())
    assert err.value.code == "cloud-no-capacity"
    assert _live(aws) == {"instances": [], "groups": []}


def test_a_quota_refusal_names_the_quota_and_tries_no_other_zone(aws: AwsProvider) -> None:
    request = _request(aws, instance_type="g4dn.2xlarge")
    asked = _refuse(aws, {"*": "VcpuLimitExceeded"})
    with pytest.raises(CloudError) as err:
        aws.launch(request, aws.offer(request), Recorder())
    assert err.value.code == "cloud-quota" and len(asked) == 1
    assert "L-DB2E81BA" in err.value.one_line()  # Running On-Demand G and VT instances
    assert _live(aws) == {"instances": [], "groups": []}


def test_spot_never_becomes_on_demand_unless_asked(aws: AwsProvider) -> None:
    offer = aws.offer(_request(aws))
    asked = _refuse(aws, {"*": "InsufficientInstanceCapacity"})
    with pytest.raises(CloudError) as err:
        aws.launch(_request(aws, spot=True), offer, Recorder())
    assert err.value.code == "cloud-no-capacity" and "--spot-fallback" in err.value.one_line()
    assert len(asked) == len(offer.zones)  # every zone tried, none on-demand


def test_spot_fallback_takes_on_demand_after_every_zone_said_no(aws: AwsProvider) -> None:
    from botocore.awsrequest import AWSResponse

    def hook(params: dict[str, Any], **_: Any) -> Any:
        if params["body"].get("InstanceMarketOptions.MarketType") == "spot":
            error = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none"}}
            return AWSResponse("https://ec2", 500, {}, None), error
        return None

    _launcher(aws).meta.events.register("before-call.ec2.RunInstances", hook)
    request = _request(aws, spot=True, spot_fallback=True)
    out = Recorder()
    (instance,) = aws.launch(request, aws.offer(request), out)
    assert not instance.spot and any(kind == "warn" for kind, _ in out.said)


def test_ctrl_c_during_launch_removes_what_was_made(aws: AwsProvider) -> None:
    def interrupt(**_: Any) -> None:
        raise KeyboardInterrupt

    aws.ec2(REGION).meta.events.register("before-call.ec2.CreateTags", interrupt)
    request = _request(aws)
    with pytest.raises(KeyboardInterrupt):
        aws.launch(request, aws.offer(request), Recorder())
    assert _live(aws) == {"instances": [], "groups": []}


def test_terminate_twice_is_fine(aws: AwsProvider) -> None:
    request = _request(aws)
    aws.launch(request, aws.offer(request), Recorder())
    first = aws.terminate("c1", REGION)
    assert len(first.instances) == 1 and len(first.security_groups) == 1 and not first.left
    second = aws.terminate("c1", REGION)
    assert second.instances == [] and second.left == []


def test_a_placement_lookup_the_cloud_refuses_removes_the_rest_and_says_so(
    aws: AwsProvider,
) -> None:
    """DescribePlacementGroups answering 500 (as moto's server does): the instances and the
    security group still go, and what was not checked is in `left` (down exits non-zero)."""
    from botocore.awsrequest import AWSResponse

    request = _request(aws)
    aws.launch(request, aws.offer(request), Recorder())
    failing = AWSResponse("https://ec2", 500, {}, None)
    body = {"Error": {"Code": "InternalError", "Message": "not implemented"}}
    ec2 = aws.ec2(REGION)
    ec2.meta.events.register_first(
        "before-call.ec2.DescribePlacementGroups", lambda **_: (failing, body)
    )
    removed = aws.terminate("c1", REGION)
    assert len(removed.instances) == 1 and len(removed.security_groups) == 1
    assert _live(aws) == {"instances": [], "groups": []}
    (why,) = removed.left
    assert why.startswith("its placement groups were not checked") and "InternalError" in why


def test_stop_keeps_the_instances(aws: AwsProvider) -> None:
    request = _request(aws)
    aws.launch(request, aws.offer(request), Recorder())
    aws.stop("c1", REGION)
    assert [i.state for i in aws.describe("c1", REGION)] == ["stopped"]
    started = aws.start("c1", REGION, Recorder())
    assert [i.state for i in started] == ["running"]


# -- what moto lacks, at that one point: Stubber ---------------------------------------------


def _stubbed() -> tuple[Any, Stubber]:
    client = boto3.client(
        "ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    return client, Stubber(client)


def test_the_placement_group_is_a_tagged_cluster_group() -> None:
    client, stub = _stubbed()
    provider = AwsProvider.__new__(AwsProvider)
    request = Request(cluster="c2", instance_type="g4dn.12xlarge", count=2, creator="me@laptop")
    stub.add_response(
        "create_placement_group",
        {},
        {
            "GroupName": "vmrun-c2",
            "Strategy": "cluster",
            "TagSpecifications": [{"ResourceType": "placement-group", "Tags": ANY}],
        },
    )
    with stub:
        assert (
            provider._placement_group(client, request, [{"Key": TAG_CLUSTER, "Value": "c2"}])
            == "vmrun-c2"
        )
    stub.assert_no_pending_responses()


def test_a_placement_group_in_use_is_retried_and_an_unknown_one_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("vmrun.providers.aws.network.time.sleep", lambda s: None)
    client, stub = _stubbed()
    stub.add_client_error("delete_placement_group", "InvalidPlacementGroup.InUse")
    stub.add_response("delete_placement_group", {}, {"GroupName": "vmrun-c2"})
    stub.add_client_error("delete_placement_group", "InvalidPlacementGroup.Unknown")
    with stub:
        assert _delete_placement(client, "vmrun-c2") == ""
        assert _delete_placement(client, "vmrun-c2") == ""


def test_the_newest_dlami_for_the_architecture_is_chosen() -> None:
    client, stub = _stubbed()
    name = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) {}"
    found = [
        {"ImageId": "ami-old", "Name": name.format(20250101), "CreationDate": "2025-01-01"},
        {"ImageId": "ami-new", "Name": name.format(20260101), "CreationDate": "2026-01-01"},
    ]
    expected = {"Owners": [images.DLAMI_OWNER], "Filters": ANY}
    stub.add_response("describe_images", {"Images": found}, expected)
    stub.add_response("describe_images", {"Images": []}, expected)
    with stub:
        chosen = images.find_image(client, "dlami", "x86_64")
        assert (chosen.id, chosen.user) == ("ami-new", "ubuntu")
        with pytest.raises(UsageError) as err:
            images.find_image(client, "dlami", "arm64")
    assert err.value.code == "cloud-image-not-found"


def test_the_quota_line_names_each_family() -> None:
    from vmrun.providers.aws.capacity import quota_error

    assert (
        "L-417A185B"
        in quota_error("VcpuLimitExceeded", "x", "p4d.24xlarge", REGION, False).one_line()
    )
    assert (
        "L-3819A6DF"
        in quota_error("MaxSpotInstanceCountExceeded", "x", "g5.xlarge", REGION, True).one_line()
    )
    assert (
        "L-1216C47A" in quota_error("VcpuLimitExceeded", "x", "c5.large", REGION, False).one_line()
    )


def test_the_host_key_goes_into_the_user_data() -> None:
    import yaml

    from vmrun.providers.cloudinit import new_host_key, user_data

    key = new_host_key("vmrun-c1-host")
    data = yaml.safe_load(user_data(key, "ssh-ed25519 AAAAkey me@laptop"))
    assert data["ssh_keys"]["ed25519_public"] == key.public_line
    assert data["ssh_keys"]["ed25519_private"].strip() == key.private_openssh.strip()
    assert data["ssh_genkeytypes"] == [] and data["ssh_authorized_keys"] == [
        "ssh-ed25519 AAAAkey me@laptop"
    ]


def _iam(provider: AwsProvider) -> Any:
    return provider.session.client("iam", REGION)


def test_a_store_gives_the_vms_a_role_for_that_prefix_alone_and_down_removes_it(
    aws: AwsProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from vmrun.providers.aws import roles

    settle = roles.wait_profile
    monkeypatch.setattr(roles, "wait_profile", lambda: settle(pause=0))
    first = [True]

    def settling(params: dict[str, Any], **_: Any) -> Any:  # EC2 does not know it at first
        from botocore.awsrequest import AWSResponse

        if first.pop() if first else False:
            message = "Value (vmrun-c1) for parameter iamInstanceProfile.name is invalid."
            error = {"Error": {"Code": "InvalidParameterValue", "Message": message}}
            return AWSResponse("https://ec2", 400, {}, None), error
        return None

    _launcher(aws).meta.events.register("before-call.ec2.RunInstances", settling)
    request = _request(aws, store="s3://bkt/runs")
    out = Recorder()
    (instance,) = aws.launch(request, aws.offer(request), out)
    iam = _iam(aws)
    policy = iam.get_role_policy(RoleName="vmrun-c1", PolicyName=roles.POLICY)["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    resources = {r for s in policy["Statement"] for r in [s["Resource"]]}
    assert resources == {"arn:aws:s3:::bkt", "arn:aws:s3:::bkt/runs/*"}  # nothing wider
    listing = next(s for s in policy["Statement"] if s["Action"] == ["s3:ListBucket"])
    assert listing["Condition"]["StringLike"]["s3:prefix"] == ["runs", "runs/*"]
    (profile,) = iam.list_instance_profiles()["InstanceProfiles"]
    assert [r["RoleName"] for r in profile["Roles"]] == ["vmrun-c1"]
    raw = aws.ec2(REGION).describe_instances(InstanceIds=[instance.id])["Reservations"][0]
    assert raw["Instances"][0]["IamInstanceProfile"]["Arn"] == profile["Arn"]
    assert any("reach s3://bkt/runs and nothing else" in text for _, text in out.said)

    removed = aws.terminate("c1", REGION)
    assert removed.roles == ["vmrun-c1"] and not removed.left
    assert iam.list_instance_profiles()["InstanceProfiles"] == []
    assert iam.list_roles()["Roles"] == []
    assert aws.terminate("c1", REGION).roles == []  # twice is fine
    assert first == []  # the launch refused while the profile settled went again


def test_a_failed_launch_with_a_store_leaves_no_role(aws: AwsProvider) -> None:
    request = _request(aws, store="s3://bkt")
    _refuse(aws, {"*": "InsufficientInstanceCapacity"})
    with pytest.raises(CloudError):
        aws.launch(request, aws.offer(request), Recorder())
    assert _iam(aws).list_roles()["Roles"] == []


def test_a_host_with_its_own_role_uses_it_under_auto() -> None:
    from vmrun.stores.access import Access

    mine = Access("AKIA1", "secret", region="eu-west-1", auto=True)
    assert mine.on({"store_role": "s3://bkt/runs"}).from_host
    assert mine.on({"store_role": "s3://bkt/runs"}).secret == ""
    assert mine.on({}) is mine  # no role there: the user's
    told = Access("AKIA1", "secret", auto=False)  # store_credentials = "mine"
    assert told.on({"store_role": "s3://bkt/runs"}) is told
