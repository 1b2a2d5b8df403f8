"""`replace_node`: one lost VM of a cluster `vmrun up` made, replaced by its twin (type,
image, zone, groups, node index, host key) while the others keep running, and vmrun.toml's
host moved to the new address with what setup recorded kept. moto in-process stands for
AWS, as in tests/test_cloud_up.py (its fixtures); the SSH wait is replaced."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from test_cloud_up import REGION, _ask, _stand_in_ssh, cloud_hosts
from test_cloud_up import project as cloud_project  # noqa: F401 (a fixture, asked by name)

from vmrun.config import load_settings
from vmrun.errors import CloudError, UsageError
from vmrun.operations import cloud
from vmrun.reporting import Recorder

SUPERVISOR_KEY = "ssh-ed25519 AAAAsupervisor vmrun-supervisor"


@dataclass
class Launches:
    """What RunInstances was asked (its form fields), whether a spot ask is refused in
    every zone (a region out of spot capacity), and the placement groups (moto has none:
    answered from here, one dict for every provider `up` and `replace_node` make)."""

    asked: list[dict[str, Any]] = field(default_factory=list)
    refuse_spot: bool = False
    placement: dict[str, dict[str, Any]] = field(default_factory=dict)
    work: Path = Path()  # the project folder (test_cloud_up's fixture: a HOME with a key)


@pytest.fixture
def launches(request: pytest.FixtureRequest, fresh_moto: Any) -> Any:
    from aws_fakes import placement_groups_on

    seen = Launches(work=request.getfixturevalue("cloud_project"))
    real = cloud.provider_for

    def hook(params: dict[str, Any], **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        seen.asked.append(dict(params["body"]))
        if seen.refuse_spot and params["body"].get("InstanceMarketOptions.MarketType") == "spot":
            error = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "none"}}
            return AWSResponse("https://ec2", 500, {}, None), error
        return None

    def provider_for(name: str, profile: str) -> Any:
        provider = real(name, profile)
        placement_groups_on(provider.ec2(REGION), seen.placement)
        launcher = provider.session.client("ec2", REGION, once=True)
        launcher.meta.events.register("before-call.ec2.RunInstances", hook)
        return provider

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cloud, "provider_for", provider_for)
        yield seen


def _seed_dlami(day: str) -> str:
    """A Deep Learning Base AMI of that day, owned by AWS's DLAMI account (moto's own
    catalog is not loaded)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.amis import Ami
    from moto.ec2.utils import random_ami_id

    from vmrun.providers.aws.images import DLAMI_OWNER

    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    ami = random_ami_id()
    name = f"Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) {day.replace('-', '')}"
    created = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
    backend.amis[ami] = Ami(
        backend,
        ami,
        name=name,
        owner_id=DLAMI_OWNER,
        architecture="x86_64",
        creation_date=created,
        virtualization_type="hvm",
    )
    return ami


def _instances(**filters: list[str]) -> list[dict[str, Any]]:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    asked = [{"Name": "tag:vmrun-cluster", "Values": ["w251"]}]
    asked += [{"Name": k.replace("_", "-"), "Values": v} for k, v in filters.items()]
    found = ec2.describe_instances(Filters=asked)["Reservations"]
    return [i for r in found for i in r["Instances"]]


def _running() -> dict[str, dict[str, Any]]:
    return {i["InstanceId"]: i for i in _instances(instance_state_name=["pending", "running"])}


def _up(monkeypatch: pytest.MonkeyPatch, work: Path, **kw: Any) -> cloud.Up:
    """w251: two nodes, and node 1 as `vmrun setup` leaves it (its python recorded)."""
    from vmrun.ssh.inventory import HostEntry, record_hosts

    _stand_in_ssh(monkeypatch)
    seeded = _seed_dlami("2025-06-01")
    done = cloud.up(load_settings(), _ask(kw.pop("image", seeded), count=2, **kw), Recorder())
    node = done.hosts[1]
    record_hosts(
        work, [HostEntry(node.spec, node.name, node.groups, {**node.vars, "python": "/env/python"})]
    )
    return done


def _known(settings: Any) -> dict[str, str]:
    lines = [ln.split() for ln in settings.known_hosts.read_text().splitlines() if ln.strip()]
    return {ln[0]: ln[2] for ln in lines}


def test_a_lost_node_gets_its_twin_in_its_place(
    launches: Launches, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _up(monkeypatch, launches.work, image="dlami")
    survivor, lost = first.instances
    _seed_dlami("2026-01-01")  # a newer release since: the twin boots the cluster's own
    launches.asked.clear()
    done = cloud.replace_node(load_settings(), "w251", "w251-1", Recorder())

    running = _running()
    assert set(running) == {survivor.id, done.new_instance} and done.old_instance == lost.id
    raw = running[done.new_instance]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert (tags["vmrun-node"], tags["Name"]) == ("1", "vmrun-w251-1")
    kept = running[survivor.id]
    same = ("InstanceType", "ImageId", "Placement.AvailabilityZone", "SecurityGroups")
    assert [_at(raw, k) for k in same] == [_at(kept, k) for k in same]
    (asked,) = launches.asked
    assert asked["Placement.GroupName"] == "vmrun-w251" and str(asked["MinCount"]) == "1"

    settings = load_settings()
    hosts = cloud_hosts(settings)
    assert [h.label for h in hosts] == ["w251-0", "w251-1"]  # its place kept
    node = hosts[1]
    assert node.spec.label == f"ubuntu@{raw['PublicIpAddress']}" == f"ubuntu@{done.address}"
    assert node.vars["instance"] == done.new_instance == done.host.vars["instance"]
    assert node.vars["private_addr"] == raw["PrivateIpAddress"]
    assert node.vars["python"] == "/env/python"  # setup's, kept for the replay
    known = _known(settings)
    assert known[done.address] == known[survivor.public_addr]  # the cluster's key, pinned
    assert lost.public_addr not in known


def _at(raw: dict[str, Any], key: str) -> Any:
    head, _, rest = key.partition(".")
    value = raw[head]
    if head == "SecurityGroups":
        return [g["GroupId"] for g in value]
    return value[rest] if rest else value


@pytest.mark.parametrize("fallback", [False, True])
def test_no_spot_anywhere_is_no_capacity_unless_on_demand_is_allowed(
    launches: Launches, monkeypatch: pytest.MonkeyPatch, fallback: bool
) -> None:
    first = _up(monkeypatch, launches.work, spot=True, spot_fallback=fallback)
    launches.refuse_spot = True
    out = Recorder()
    if not fallback:
        with pytest.raises(CloudError) as err:
            cloud.replace_node(load_settings(), "w251", "w251-1", out)
        assert err.value.code == "cloud-no-capacity"
        assert set(_running()) == {first.instances[0].id}  # nothing new left running
        assert cloud_hosts(load_settings())[1].spec == first.hosts[1].spec  # as it was
        return
    done = cloud.replace_node(load_settings(), "w251", "w251-1", out)
    assert "InstanceLifecycle" not in _running()[done.new_instance]  # on-demand
    assert any(kind == "warn" and "on-demand" in text for kind, text in out.said)


def test_ssh_never_answering_ends_the_new_vm_alone(
    launches: Launches, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _up(monkeypatch, launches.work)
    _stand_in_ssh(monkeypatch, CloudError("never", code="cloud-ssh-never-up"))
    with pytest.raises(CloudError) as err:
        cloud.replace_node(load_settings(), "w251", "w251-1", Recorder())
    assert err.value.code == "cloud-ssh-never-up"
    assert set(_running()) == {first.instances[0].id}  # the survivor runs on
    settings = load_settings()
    assert cloud_hosts(settings)[1].spec == first.hosts[1].spec  # vmrun.toml untouched
    assert set(_known(settings)) == {i.public_addr for i in first.instances}


def test_a_reclaimed_node_comes_back_with_autostop_and_more_keys(
    launches: Launches, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    monkeypatch.setattr(cloud, "_autostop", lambda settings, entries, period, budget=False: period)
    first = _up(monkeypatch, launches.work, autostop="30m")
    lost = first.instances[1]
    boto3.client("ec2", region_name=REGION).terminate_instances(InstanceIds=[lost.id])
    installed: list[tuple[list[str], str]] = []

    def autostop(settings: Any, entries: list[Any], period: str) -> str:
        installed.append(([e.label for e in entries], period))
        return period

    monkeypatch.setattr(cloud, "_autostop", autostop)
    with pytest.raises(UsageError):  # refused before anything is made
        cloud.replace_node(load_settings(), "w251", "w251-1", extra_keys=["not a key"])
    done = cloud.replace_node(
        load_settings(), "w251", "w251-1", Recorder(), extra_keys=[SUPERVISOR_KEY]
    )
    assert done.old_instance == lost.id and installed == [(["w251-1"], "30m")]
    from vmrun.providers.aws.provider import AwsProvider
    from vmrun.providers.aws.session import Session

    provider = AwsProvider(Session())
    (new,) = [i for i in provider.describe("w251", REGION) if i.id == done.new_instance]
    assert new.index == 1
    text = provider.user_data(new)
    assert f"  - {SUPERVISOR_KEY}\n" in text and "me@laptop" in text
    assert provider.host_key(new) == provider.host_key(first.instances[0])
    assert cloud_hosts(load_settings())[1].vars["autostop"] == "30m"


def test_a_moved_host_keeps_its_place_its_values_and_the_comments(tmp_path: Path) -> None:
    from vmrun.config import PROJECT_FILE
    from vmrun.errors import ConfigError
    from vmrun.ssh.hosts import parse_host
    from vmrun.ssh.inventory import HostEntry, move_host

    path = tmp_path / PROJECT_FILE
    path.write_text(
        "# the lab's hosts\n"
        'hosts = ["me@gpu1", { address = "ubuntu@192.0.2.5", name = "w251-1",'
        ' python = "/env/python", instance = "i-old" }, "me@gpu2"]\n'
    )
    moved = HostEntry(parse_host("ubuntu@192.0.2.9"), "w251-1", (), {"instance": "i-new"})
    move_host(tmp_path, moved)
    text = path.read_text()
    assert text.startswith("# the lab's hosts\n")
    assert text.index("me@gpu1") < text.index("192.0.2.9") < text.index("me@gpu2")
    assert "192.0.2.5" not in text and '"/env/python"' in text and '"i-new"' in text
    with pytest.raises(ConfigError):
        move_host(tmp_path, HostEntry(parse_host("ubuntu@192.0.2.9"), "w251-7"))
