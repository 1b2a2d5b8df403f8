"""CloudBed's losses: a lost VM's host is off for good and never handed out again, so a
replacement lands on another host; with listen="main" the instances reach moto themselves
(a recovery supervisor on one of them calls EC2); on_boot prepares each fresh disk."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import slow_fixture
from testbed import ClientKeys, CloudBed, NetnsBed, TestHost, skip_reason_no_netns

pytest.importorskip("moto")
pytest.importorskip("flask")

_NO_NETNS = skip_reason_no_netns()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_NO_NETNS is not None, reason=_NO_NETNS or ""),
]


def _mark(host: TestHost) -> None:
    (host.home / "prepared").write_text(host.name)


@pytest.fixture
@slow_fixture
def cloud(tmp_path: Path) -> Iterator[CloudBed]:
    keys = ClientKeys.generate(tmp_path / "keys")
    with (
        NetnsBed(tmp_path / "bed", keys) as bed,
        CloudBed(
            bed, tmp_path / "cloud", instances=["n1", "n2", "n3"], listen="main", on_boot=_mark
        ) as cloud,
    ):
        yield cloud


@pytest.mark.timeout(120)
def test_lost_vm_is_replaced_on_another_host(cloud: CloudBed) -> None:
    ec2 = cloud.client("ec2")

    def launch(count: int) -> list[str]:
        out = ec2.run_instances(
            ImageId=cloud.images["ubuntu"],
            InstanceType="g4dn.2xlarge",
            MinCount=count,
            MaxCount=count,
        )
        return [i["InstanceId"] for i in out["Instances"]]

    def state(instance_id: str) -> str:
        found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return str(found[0]["Instances"][0]["State"]["Name"])

    first, second = launch(2)
    cloud.wait_booted(2)
    n1, n2, n3 = cloud.hosts
    assert (cloud.host_of(first), cloud.host_of(second)) == (n1, n2)
    assert (n2.home / "prepared").read_text() == "n2"  # on_boot ran on the fresh disk

    assert cloud.lose(second, terminate=True) is n2
    assert state(second) == "terminated"
    assert not cloud.laptop.can_connect(n2.addr_on("main"), n2.port)
    (third,) = launch(1)  # n2 is free in moto's eyes, but retired: n3
    assert cloud.host_of(third) is n3 and n3.addr_on("main") != n2.addr_on("main")
    cloud.wait_booted(2)
    assert not cloud.laptop.can_connect(n2.addr_on("main"), n2.port)

    cloud.lose(first, terminate=False)  # a dead VM: still "running" in moto
    assert state(first) == "running"
    assert not cloud.laptop.can_connect(n1.addr_on("main"), n1.port)
    with pytest.raises(Exception, match="TestbedOutOfHosts"):
        launch(1)
    assert set(cloud.instance_hosts()) == {first, third}

    # an instance reaches moto at the endpoint vmrun is given, and boto3 works there
    assert cloud.endpoint == f"http://{cloud.laptop.addr_on('main')}:{cloud.port}"
    assert n3.can_connect(cloud.listen_addr, cloud.port)
    script = (
        "import boto3; r = boto3.client('ec2').describe_instances()['Reservations'];"
        "print(sorted(i['InstanceId'] for x in r for i in x['Instances']))"
    )
    out = n3.run([sys.executable, "-c", script], env=cloud.env(), text=True, timeout=60)
    assert repr(sorted([first, second, third])) in out.stdout
