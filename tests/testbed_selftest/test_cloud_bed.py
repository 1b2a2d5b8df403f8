"""Self-test of CloudBed: moto's EC2 server whose instances boot as real sshd hosts.

boto3 against the bed, the system ssh client from the laptop's namespace: what vmrun's
AWS commands will meet.  Needs root, ``ip netns`` and moto (the dev extra).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from conftest import slow_fixture  # noqa: E402
from testbed import ClientKeys, CloudBed, NetnsBed, skip_reason_no_netns  # noqa: E402
from testbed.cloud import DLAMI_NAME, DLAMI_OWNER, threads_in_netns  # noqa: E402
from testbed.layout import NETNS_RUN_DIR  # noqa: E402

pytest.importorskip("moto")
pytest.importorskip("flask")

SSH = "/usr/bin/ssh"
_NO_NETNS = skip_reason_no_netns()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_NO_NETNS is not None, reason=_NO_NETNS or ""),
]


def connect_error(addr: str, port: int = 22, timeout: float = 2.0) -> str:
    """'ok', 'timeout' or the errno's text (run it in the laptop's thread: cloud.call)."""
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.connect((addr, port))
        return "ok"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return os.strerror(exc.errno or 0)
    finally:
        s.close()


class Ctx:
    def __init__(self, cloud: CloudBed, keys: ClientKeys, tmp: Path) -> None:
        self.cloud = cloud
        self.keys = keys
        self.tmp = tmp
        self.ec2 = cloud.client("ec2")
        key = tmp / "host_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vmrun-c1-host", "-f", str(key)],
            check=True,
        )
        self.host_private = key.read_text()
        self.host_public = key.with_name(key.name + ".pub").read_text().strip()

    def user_data(self) -> str:
        private = "".join(f"      {line}\n" for line in self.host_private.splitlines())
        return (
            "#cloud-config\nssh_deletekeys: true\nssh_genkeytypes: []\nssh_keys:\n"
            f"  ed25519_private: |\n{private}  ed25519_public: {self.host_public}\n"
            f"ssh_authorized_keys:\n  - {self.keys.public_line}\n"
        )

    def run(self, count: int = 1, **kwargs: Any) -> list[dict[str, Any]]:
        kwargs.setdefault("ImageId", self.cloud.images["dlami"])
        kwargs.setdefault("InstanceType", "g4dn.2xlarge")
        kwargs.setdefault("UserData", self.user_data())
        out = self.ec2.run_instances(MinCount=count, MaxCount=count, **kwargs)
        return out["Instances"]

    def describe(self, instance_id: str) -> dict[str, Any]:
        out = self.ec2.describe_instances(InstanceIds=[instance_id])
        return out["Reservations"][0]["Instances"][0]

    def ssh(
        self, addr: str, command: str, *, pinned: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The system ssh from the laptop's namespace; known_hosts holds only the pinned key."""
        known = self.tmp / f"known_hosts-{addr}"
        known.write_text(f"{addr} {pinned or self.host_public}\n")
        argv = [
            SSH,
            "-F",
            "none",
            "-i",
            str(self.keys.private),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"{self.cloud.user}@{addr}",
            command,
        ]
        return subprocess.run(
            self.cloud.argv(argv),
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )

    def terminate_all(self) -> None:
        ids = list(self.cloud.instance_hosts())
        if ids:
            self.ec2.terminate_instances(InstanceIds=ids)


@pytest.fixture(scope="module")
@slow_fixture
def cloud_ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    tmp = tmp_path_factory.mktemp("cloud")
    keys = ClientKeys.generate(tmp / "keys")
    with (
        NetnsBed(tmp / "bed", keys) as bed,
        CloudBed(bed, tmp / "cloud", instances=["n1", "n2", "n3"]) as cloud,
    ):
        yield Ctx(cloud, keys, tmp)


@pytest.fixture
def ctx(cloud_ctx: Ctx) -> Iterator[Ctx]:
    yield cloud_ctx
    cloud_ctx.cloud.fail_zones({})
    cloud_ctx.cloud.fail_all(None)
    cloud_ctx.terminate_all()


def test_moto_answers_only_inside_the_laptop_namespace(ctx: Ctx) -> None:
    cloud = ctx.cloud
    assert cloud.call(connect_error, "127.0.0.1", cloud.port) == "ok"
    assert connect_error("127.0.0.1", cloud.port) != "ok"  # the root namespace: nothing
    assert cloud.laptop.can_connect("127.0.0.1", cloud.port)  # a process run there
    assert cloud.env()["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{cloud.port}"


def test_the_laptop_reaches_nothing_but_the_public_addresses(ctx: Ctx) -> None:
    cloud = ctx.cloud
    n2 = cloud.hosts[1]
    assert cloud.call(connect_error, "54.12.34.56") == "Network is unreachable"
    assert cloud.call(connect_error, "172.31.5.6") == "Network is unreachable"
    assert cloud.call(connect_error, n2.addr_on("vpc")) == "Network is unreachable"
    assert cloud.call(connect_error, n2.addr_on("main")) == "Connection refused"  # off
    proc = subprocess.run(
        cloud.argv(["/bin/sh", "-c", "ip -4 route"]), capture_output=True, text=True, check=True
    )
    assert "default" not in proc.stdout


def test_images_are_seeded(ctx: Ctx) -> None:
    out = ctx.ec2.describe_images(
        Owners=[DLAMI_OWNER], Filters=[{"Name": "name", "Values": [DLAMI_NAME.format("*")]}]
    )
    newest = max(out["Images"], key=lambda i: i["CreationDate"])
    assert len(out["Images"]) == 2
    assert newest["ImageId"] == ctx.cloud.images["dlami"]
    ubuntu = ctx.ec2.describe_images(Owners=["099720109477"], ImageIds=[ctx.cloud.images["ubuntu"]])
    assert "22.04" in ubuntu["Images"][0]["Name"]


def test_instances_boot_as_hosts_with_the_pinned_key(ctx: Ctx) -> None:
    cloud = ctx.cloud
    launched = ctx.run(2)
    hosts = [cloud.host_of(i["InstanceId"]) for i in launched]
    assert [h.name for h in hosts] == ["n1", "n2"]
    for instance, host in zip(launched, hosts, strict=True):
        described = ctx.describe(instance["InstanceId"])
        assert described["PublicIpAddress"] == host.addr_on("main")
        assert described["PrivateIpAddress"] == host.addr_on("vpc")
    cloud.wait_booted(2)
    n1, n2 = (ctx.describe(i["InstanceId"])["PublicIpAddress"] for i in launched)
    proc = ctx.ssh(n1, "hostname; id -un; echo a > ~/f; cat ~/f")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["vmt-n1", cloud.user, "a"]
    # the instance's sshd offers the user data's host key and no other
    scan = subprocess.run(
        cloud.argv(["ssh-keyscan", "-T", "5", n1]), capture_output=True, text=True
    )
    assert [line.split()[1:] for line in scan.stdout.splitlines()] == [ctx.host_public.split()[:2]]
    # separate machines: n1's file is not on n2
    proc = ctx.ssh(n2, "test -e ~/f && echo shared || echo own; echo $HOME")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "own"
    # a host reaches the other on its private address; the laptop does not
    assert hosts[0].can_connect(hosts[1].addr_on("vpc"))
    assert cloud.call(connect_error, hosts[1].addr_on("vpc")) == "Network is unreachable"


def test_boot_waits_for_sshd_and_then_for_the_keys(ctx: Ctx) -> None:
    cloud = ctx.cloud
    cloud.boot_s, cloud.refuse_s = 1.0, 2.0
    try:
        (instance,) = ctx.run(1)
        addr = ctx.describe(instance["InstanceId"])["PublicIpAddress"]
        assert cloud.call(connect_error, addr) == "Connection refused"  # still off
        deadline = time.monotonic() + 10
        while cloud.call(connect_error, addr) != "ok":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        refused = ctx.ssh(addr, "true")  # sshd answers, with the pinned key, but no login yet
        assert refused.returncode == 255
        assert "Permission denied (publickey)" in refused.stderr
        cloud.wait_booted(1)
        assert ctx.ssh(addr, "true").returncode == 0
    finally:
        cloud.boot_s, cloud.refuse_s = 0.2, 0.3


def test_stop_start_terminate_power_the_host(ctx: Ctx) -> None:
    cloud = ctx.cloud
    (instance,) = ctx.run(1)
    instance_id = instance["InstanceId"]
    host = cloud.host_of(instance_id)
    addr = host.addr_on("main")
    cloud.wait_booted(1)
    assert ctx.ssh(addr, "echo kept > ~/disk").returncode == 0
    ctx.ec2.stop_instances(InstanceIds=[instance_id])
    assert host.sshd_pid() is None and host.pids() == []
    assert "PublicIpAddress" not in ctx.describe(instance_id)  # a stopped instance has none
    ctx.ec2.start_instances(InstanceIds=[instance_id])
    assert ctx.describe(instance_id)["PublicIpAddress"] == addr
    cloud.wait_booted(1)
    assert ctx.ssh(addr, "cat ~/disk").stdout.strip() == "kept"  # same disk
    ctx.ec2.terminate_instances(InstanceIds=[instance_id])
    assert host.sshd_pid() is None and host.pids() == []
    assert cloud.call(connect_error, addr) == "Connection refused"
    # the host is free again: a new instance gets a fresh disk
    (again,) = ctx.run(1)
    assert cloud.host_of(again["InstanceId"]) is host
    cloud.wait_booted(1)
    assert ctx.ssh(addr, "test -e ~/disk || echo fresh").stdout.strip() == "fresh"


def test_stopping_one_machine_spares_the_shared_users_processes_on_another(ctx: Ctx) -> None:
    cloud = ctx.cloud
    a, b = (cloud.host_of(i["InstanceId"]) for i in ctx.run(2))
    cloud.wait_booted(2)
    for host in (a, b):
        proc = ctx.ssh(host.addr, "setsid -f sleep 300 </dev/null >/dev/null 2>&1")
        assert proc.returncode == 0, proc.stderr
    assert a.user_pids() and b.user_pids()
    ctx.ec2.stop_instances(InstanceIds=[i for i, h in cloud.instance_hosts().items() if h is a])
    assert a.user_pids() == [] and len(b.user_pids()) == 1  # b's sleep lives on


def test_a_process_in_the_laptop_namespace_uses_moto(ctx: Ctx) -> None:
    cloud = ctx.cloud
    image = cloud.images["dlami"]
    script = (
        "import boto3\n"
        f"images = boto3.client('ec2').describe_images(ImageIds=['{image}'])['Images']\n"
        "print(images[0]['OwnerId'])\n"
    )
    proc = subprocess.run(
        cloud.argv([sys.executable, "-c", script], env=cloud.env()),
        env={**os.environ, "AWS_PROFILE": "nosuch"},  # env(1) drops it
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == DLAMI_OWNER


def test_security_groups_are_enforced(ctx: Ctx) -> None:
    cloud, ec2 = ctx.cloud, ctx.ec2
    cloud.enforce_security_groups = True
    try:
        vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]
        sg = ec2.create_security_group(
            GroupName="vmrun-sg", Description="vmrun", VpcId=vpc["VpcId"]
        )["GroupId"]
        ssh_rule = {
            "IpProtocol": "tcp",
            "FromPort": 22,
            "ToPort": 22,
            "IpRanges": [{"CidrIp": cloud.ssh_cidr}],
        }
        members = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}
        ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule, members])
        a, b = (cloud.host_of(i["InstanceId"]) for i in ctx.run(2, SecurityGroupIds=[sg]))
        cloud.wait_booted(2)
        assert ctx.ssh(a.addr, "true").returncode == 0  # tcp/22 from the laptop
        assert cloud.call(connect_error, a.addr, 8080, 0.5) == "timeout"  # no other port
        probe = "timeout 1 bash -c 'exec 3<>/dev/tcp/{}/8080'; echo $?"
        # a member reaches any port of another on its private address (refused: no listener)
        assert a.run(["sh", "-c", probe.format(b.addr_on("vpc"))], text=True).stdout == "1\n"
        assert a.run(["sh", "-c", probe.format(b.addr_on("main"))], text=True).stdout == "124\n"
        ec2.revoke_security_group_ingress(GroupId=sg, IpPermissions=[ssh_rule])
        assert cloud.call(connect_error, a.addr, 22, 0.5) == "timeout"  # no rule, no SSH
    finally:
        cloud.enforce_security_groups = False


@pytest.mark.parametrize("behavior", ["stop", "terminate"])
def test_power_off_from_inside(ctx: Ctx, behavior: str) -> None:
    cloud = ctx.cloud
    (instance,) = ctx.run(1, InstanceInitiatedShutdownBehavior=behavior)
    instance_id = instance["InstanceId"]
    host = cloud.host_of(instance_id)
    cloud.wait_booted(1)
    ctx.ssh(host.addr, f"{cloud.poweroff_command} -h now")  # the session may die with it
    wanted = {"stop": "stopped", "terminate": "terminated"}[behavior]
    deadline = time.monotonic() + 10
    while ctx.describe(instance_id)["State"]["Name"] != wanted:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert host.sshd_pid() is None and host.pids() == []


def test_capacity_fault_in_one_zone_only(ctx: Ctx) -> None:
    from botocore.exceptions import ClientError

    ctx.cloud.fail_zones({"us-east-1a": "InsufficientInstanceCapacity"})
    with pytest.raises(ClientError) as info:
        ctx.run(1, Placement={"AvailabilityZone": "us-east-1a"})
    err = info.value.response
    assert err["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 500  # as AWS sends it
    assert "(us-east-1a)" in err["Error"]["Message"]
    assert ctx.cloud.instance_hosts() == {}
    subnet = ctx.ec2.describe_subnets(
        Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}]
    )["Subnets"][0]["SubnetId"]
    with pytest.raises(ClientError):  # the zone of the subnet counts too
        ctx.run(1, SubnetId=subnet)
    (instance,) = ctx.run(1, Placement={"AvailabilityZone": "us-east-1b"})
    assert ctx.describe(instance["InstanceId"])["Placement"]["AvailabilityZone"] == "us-east-1b"


def test_quota_fault_everywhere(ctx: Ctx) -> None:
    from botocore.exceptions import ClientError

    ctx.cloud.fail_all("VcpuLimitExceeded")
    for zone in ("us-east-1a", "us-east-1c"):
        with pytest.raises(ClientError) as info:
            ctx.run(1, Placement={"AvailabilityZone": zone})
        assert info.value.response["Error"]["Code"] == "VcpuLimitExceeded"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    ctx.cloud.fail_all("InsufficientInstanceCapacity", spot_only=True)
    ctx.run(1)  # on-demand still launches
    with pytest.raises(ClientError):
        ctx.run(1, InstanceMarketOptions={"MarketType": "spot"})


def test_placement_groups(ctx: Ctx) -> None:
    from botocore.exceptions import ClientError

    ec2 = ctx.ec2
    tags = [{"Key": "vmrun-cluster", "Value": "c1"}]
    created = ec2.create_placement_group(
        GroupName="vmrun-c1",
        Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
    )["PlacementGroup"]
    assert created["GroupName"] == "vmrun-c1" and created["GroupId"].startswith("pg-")
    found = ec2.describe_placement_groups(
        Filters=[{"Name": "tag:vmrun-cluster", "Values": ["c1"]}]
    )["PlacementGroups"]
    assert [(g["GroupName"], g["Strategy"], g["Tags"]) for g in found] == [
        ("vmrun-c1", "cluster", tags)
    ]
    with pytest.raises(ClientError) as info:
        ec2.create_placement_group(GroupName="vmrun-c1", Strategy="cluster")
    assert info.value.response["Error"]["Code"] == "InvalidPlacementGroup.Duplicate"
    with pytest.raises(ClientError) as info:
        ctx.run(1, Placement={"GroupName": "nosuch"})
    assert info.value.response["Error"]["Code"] == "InvalidPlacementGroup.Unknown"
    (instance,) = ctx.run(1, Placement={"GroupName": "vmrun-c1"})
    with pytest.raises(ClientError) as info:
        ec2.delete_placement_group(GroupName="vmrun-c1")
    assert info.value.response["Error"]["Code"] == "InvalidPlacementGroup.InUse"
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    ec2.delete_placement_group(GroupName="vmrun-c1")
    assert ec2.describe_placement_groups()["PlacementGroups"] == []
    with pytest.raises(ClientError) as info:
        ec2.delete_placement_group(GroupName="vmrun-c1")
    assert info.value.response["Error"]["Code"] == "InvalidPlacementGroup.Unknown"


def test_api_calls_are_counted(ctx: Ctx) -> None:
    before = len(ctx.cloud.api_calls)
    ctx.ec2.describe_instances()
    assert ctx.cloud.api_calls[before:] == ["DescribeInstances"]


def test_close_leaves_nothing(cloud_ctx: Ctx) -> None:
    """Last: closes the module's bed (closing again in the fixture is a no-op)."""
    from moto.ec2.responses import EC2Response

    cloud = cloud_ctx.cloud
    ctx_hosts = [cloud.laptop, *cloud.hosts]
    cloud_ctx.run(2)
    cloud.wait_booted(2)
    cloud.close()
    assert threads_in_netns(cloud.laptop.netns) == []
    assert not cloud.laptop.can_connect("127.0.0.1", cloud.port)
    assert all(h.sshd_pid() is None and h.pids() == [] for h in ctx_hosts)
    assert "create_placement_group" not in EC2Response.__dict__  # moto as it was
    cloud.bed.close()
    assert not any((NETNS_RUN_DIR / h.netns).exists() for h in ctx_hosts)
