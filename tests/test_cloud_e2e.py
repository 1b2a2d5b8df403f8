"""`vmrun up` -> `setup` -> `train` on 2 nodes -> `fetch` -> `down`, over real SSH, against
moto's EC2 server (tests/testbed/cloud.py). vmrun runs in a namespace with only loopback and
the test hosts: an address moto makes up cannot be reached from there. STAND-IN, at that one
boundary: each instance's addresses are a test host's, which boots from the user data vmrun
sent (its host key, the user's key), and the security group is enforced there by nftables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from conftest import TORCH_SPEC, error_in, slow_fixture, wait_for
from testbed import ClientKeys, CloudBed, NetnsBed, skip_reason_no_netns

pytest.importorskip("moto")
pytest.importorskip("flask")

ROOT = Path(__file__).resolve().parent.parent
_NO_NETNS = skip_reason_no_netns()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(_NO_NETNS is not None, reason=_NO_NETNS or ""),
]


@dataclass
class Laptop:
    """The user's side, in the laptop's namespace: a home with the key vmrun logs in with,
    a project directory, and the real CLI run there."""

    cloud: CloudBed
    home: Path
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return self.cloud.argv([sys.executable, "-m", "vmrun", *args], env=self.env)

    def vmrun(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def toml(self) -> str:
        path = self.cwd / "vmrun.toml"
        return path.read_text() if path.exists() else ""

    def live(self) -> dict[str, list[str]]:
        """What the cloud holds for cluster c1: instances not terminated, its groups."""
        ec2 = self.cloud.client("ec2")
        tag = [{"Name": "tag:vmrun-cluster", "Values": ["c1"]}]
        found = ec2.describe_instances(Filters=tag)["Reservations"]
        states = [i["State"]["Name"] for r in found for i in r["Instances"]]
        groups = ec2.describe_security_groups(Filters=tag)["SecurityGroups"]
        placement = ec2.describe_placement_groups(Filters=tag)["PlacementGroups"]
        return {
            "instances": [s for s in states if s != "terminated"],
            "groups": [g["GroupId"] for g in groups],
            "placement": [p["GroupName"] for p in placement],
        }


@pytest.fixture(scope="module")
@slow_fixture
def laptop(tmp_path_factory: pytest.TempPathFactory, host_python: Path) -> Iterator[Laptop]:
    tmp = tmp_path_factory.mktemp("cloud-e2e")
    keys = ClientKeys.generate(tmp / "keys")
    with (
        NetnsBed(tmp / "bed", keys) as bed,
        CloudBed(bed, tmp / "cloud", instances=["n1", "n2"], enforce_security_groups=True) as cloud,
    ):
        home = tmp / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        shutil.copy(keys.private, home / ".ssh" / "id_ed25519")
        (home / ".ssh" / "id_ed25519").chmod(0o600)
        (home / ".ssh" / "id_ed25519.pub").write_text(keys.public_line + "\n")
        cwd = tmp / "project"
        cwd.mkdir()
        env = {
            **cloud.env(),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT),
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
        }
        yield Laptop(cloud, home, cwd, env)


@pytest.fixture
def user(laptop: Laptop) -> Iterator[Laptop]:
    yield laptop
    laptop.cloud.fail_zones({})
    laptop.cloud.fail_all(None)
    laptop.cloud.boot_s = 0.2
    if laptop.live()["instances"]:
        laptop.vmrun("down", "c1", timeout=120)
    (laptop.cwd / "vmrun.toml").unlink(missing_ok=True)


def _up(user: Laptop, *args: str) -> list[str]:
    return [
        "up",
        "c1",
        "--type",
        "g4dn.2xlarge",
        "--user",
        user.cloud.user,
        "--ssh-from",
        user.cloud.ssh_cidr,
        *args,
    ]


@pytest.mark.timeout(600)
def test_up_setup_train_fetch_down_over_real_ssh(user: Laptop, host_python: Path) -> None:
    cloud = user.cloud
    up = user.vmrun(*_up(user, "-n", "2", "--disk", "500"), timeout=180)
    assert up.returncode == 0, up.stderr + up.stdout
    n1, n2 = cloud.hosts
    # recorded as @c1: the public addresses to log in, the private ones for the nodes
    toml = user.toml()
    for name, host in (("c1-0", n1), ("c1-1", n2)):
        block = toml[toml.index(f'name = "{name}"') - 200 :]
        assert f'address = "{cloud.user}@{host.addr_on("main")}"' in block[:400], toml
        assert f'private_addr = "{host.addr_on("vpc")}"' in block[:400], toml
    assert 'groups = ["c1"]' in toml and "[[clouds]]" in toml
    # the first connection was already strict: the pinned key, and no other, for each address
    known = (user.home / ".config" / "vmrun" / "known_hosts").read_text().split("\n")
    pinned = {line.split()[0]: line.split()[2] for line in known if line}
    assert sorted(pinned) == sorted([n1.addr_on("main"), n2.addr_on("main")])
    assert len(set(pinned.values())) == 1
    assert "--accept-new-host-key" not in up.stderr
    assert user.live()["placement"] == ["vmrun-c1"]  # two nodes: a cluster placement group
    listed = user.vmrun("cloud", "--json")
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["forgotten"] == [], found  # vmrun.toml here names c1
    kinds = sorted(r["kind"] for r in found["resources"] if r["cluster"] == "c1")
    assert kinds.count("instance") == 2 and "security-group" in kinds, kinds

    setup = user.vmrun(
        "setup", "@c1", "--python", str(host_python), "--torch", TORCH_SPEC, timeout=300
    )
    assert setup.returncode == 0, setup.stderr + setup.stdout

    train = user.vmrun("train", "-H", "@c1", "--epochs", "2", "--save-every", "1", timeout=300)
    assert train.returncode == 0, train.stderr + train.stdout
    rid = re.search(r"run (\S+) finished", train.stderr)
    assert rid, train.stderr
    fetch = user.vmrun("fetch", "results", "--run", rid.group(1), timeout=120)
    assert fetch.returncode == 0, fetch.stderr + fetch.stdout
    run_dir = user.cwd / "results" / rid.group(1)  # every node's outputs, the master's record
    assert (run_dir / "finalmodel.pt").is_file(), sorted(p.name for p in run_dir.iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    assert n1.addr_on("vpc") in json.dumps(record)  # the nodes met on the private address

    down = user.vmrun("down", "c1", timeout=180)
    assert down.returncode == 0, down.stderr + down.stdout
    assert user.live() == {"instances": [], "groups": [], "placement": []}
    assert "[[hosts]]" not in user.toml() and "[[clouds]]" not in user.toml()
    assert not n1.can_connect(n1.addr_on("main"))  # the VM is gone
    again = user.vmrun("down", "c1")
    assert again.returncode == 0 and "nothing of it" in again.stdout, again.stderr


def test_a_zone_without_capacity_is_passed_for_the_next(user: Laptop) -> None:
    user.cloud.fail_zones({"us-east-1a": "InsufficientInstanceCapacity"})
    up = user.vmrun(*_up(user), timeout=180)
    assert up.returncode == 0, up.stderr
    assert "us-east-1a has no g4dn.2xlarge now (InsufficientInstanceCapacity)" in up.stderr
    ec2 = user.cloud.client("ec2")
    found = ec2.describe_instances(
        Filters=[
            {"Name": "tag:vmrun-cluster", "Values": ["c1"]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )
    zones = {
        i["Placement"]["AvailabilityZone"] for r in found["Reservations"] for i in r["Instances"]
    }
    assert zones == {"us-east-1b"}


def test_a_quota_refusal_is_one_line_and_leaves_nothing(user: Laptop) -> None:
    user.cloud.fail_all("VcpuLimitExceeded")
    up = user.vmrun(*_up(user, "-n", "2"), timeout=180)
    code, message = error_in(up.stderr)
    assert (up.returncode, code) == (15, "cloud-quota"), up.stderr
    assert "L-DB2E81BA" in message  # the G and VT on-demand quota, and how to raise it
    assert user.live() == {"instances": [], "groups": [], "placement": []}


def test_ctrl_c_while_the_vms_boot_leaves_nothing(user: Laptop) -> None:
    user.cloud.boot_s = 60.0  # the VMs run but do not let anyone in for a minute
    proc = subprocess.Popen(
        user.argv(*_up(user, "-n", "2")),
        cwd=user.cwd,
        env=user.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(user.cloud.instance_hosts()) == 2, 60, "both instances launched")
        time.sleep(0)  # the SSH wait is under way: nothing can log in yet
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert user.live() == {"instances": [], "groups": [], "placement": []}, stderr
    assert not (user.cwd / "vmrun.toml").exists()


def test_a_clusters_max_cost_powers_its_vm_off_from_inside_at_its_share(user: Laptop) -> None:
    """`up --max-cost 20` at 3600 USD an hour (the price list's answer seeded in this
    laptop's price cache: moto has no Price List): the VM's watchdog gets a budget of 20 s
    running time, adds it up, and powers the VM off from inside once it is spent (no run on
    it: at once); EC2 then stops it. The runs' side (saved first) is test_autostop's."""
    cloud = user.cloud
    cache = user.home / ".cache" / "vmrun" / "prices.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({f"on-demand/{cloud.region}/g4dn.2xlarge": [3600.0, time.time()]}))
    (user.cwd / "vmrun.toml").write_text(
        f'autostop_command = "{cloud.poweroff_command}"\nautostop_interval = "2s"\n'
    )
    up = user.vmrun(*_up(user, "--max-cost", "20"), timeout=180)
    assert up.returncode == 0, up.stderr + up.stdout
    assert "about $3,600.00 an hour" in up.stderr + up.stdout, up.stderr + up.stdout
    assert "powers off after 20s running in all" in up.stdout, up.stdout
    assert "max_cost = 20" in user.toml() and 'autostop_budget = "20s"' in user.toml()
    ec2 = cloud.client("ec2")
    (instance,) = [i for i, _ in cloud.instance_hosts().items()]

    def state() -> str:
        found = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]
        return str(found["Instances"][0]["State"]["Name"])

    wait_for(lambda: state() == "stopped", 120, "the VM powered off at its budget")
    refused = user.vmrun(
        "up",
        "c9",
        "--type",
        "g4dn.xlarge",
        "--user",
        cloud.user,
        "--ssh-from",
        cloud.ssh_cidr,
        "--max-cost",
        "5",
    )
    code, said = error_in(refused.stderr)  # no price known for that type: nothing made
    assert "no price for g4dn.xlarge" in said, said
    assert refused.returncode == 2 and code == "over-budget", refused.stderr
    tagged = [{"Name": "tag:vmrun-cluster", "Values": ["c9"]}]
    assert ec2.describe_instances(Filters=tagged)["Reservations"] == []


def test_a_power_off_from_inside_stops_the_vm_and_up_starts_it_again(user: Laptop) -> None:
    cloud = user.cloud
    (user.cwd / "vmrun.toml").write_text(f'autostop_command = "{cloud.poweroff_command}"\n')
    up = user.vmrun(*_up(user, "--autostop", "30m"), timeout=180)
    assert up.returncode == 0, up.stderr + up.stdout
    assert "autostop: each powers off after 30m idle" in up.stdout
    ec2 = cloud.client("ec2")
    (instance,) = [i for i, _ in cloud.instance_hosts().items()]
    behaviour = ec2.describe_instance_attribute(
        InstanceId=instance, Attribute="instanceInitiatedShutdownBehavior"
    )["InstanceInitiatedShutdownBehavior"]["Value"]
    assert behaviour == "stop"
    # what the watchdog does once idle: the power-off ends the bill without this machine
    off = user.vmrun("exec", "-H", "@c1", "--", cloud.poweroff_command)
    assert off.returncode in (0, 12, 13), off.stderr

    def state() -> str:
        found = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]
        return str(found["Instances"][0]["State"]["Name"])

    wait_for(lambda: state() == "stopped", 30, "the instance stopped from inside")
    again = user.vmrun("up", "c1", timeout=180)  # every value from its [[clouds]] table
    assert again.returncode == 0, again.stderr + again.stdout
    assert "started again" in again.stdout and state() == "running"
    assert user.vmrun("exec", "-H", "@c1", "--", "true").returncode == 0
    stop = user.vmrun("down", "c1", "--stop", timeout=180)
    assert stop.returncode == 0 and "disks are kept and billed" in stop.stdout, stop.stderr
    assert state() == "stopped" and "[[hosts]]" in user.toml()
    gone = user.vmrun("down", "c1", timeout=180)
    assert gone.returncode == 0, gone.stderr
    assert user.live() == {"instances": [], "groups": [], "placement": []}


def _met_at_the_private_names(hosts: tuple[Any, ...], rid: str) -> None:
    """Each node's record: the rendezvous at the master's private name, and the interface
    that carries the network (the wire, eth1 on these hosts), found on the node."""
    for host in hosts:
        meta = json.loads((host.home / ".vmrun/runs" / rid / "run.json").read_text())
        assert meta["rdzv"].startswith("uc-0:") and meta["ifname"] == "eth1", meta


def _apart_cannot_train(run: Laptop, fake: Any, host_python: Path) -> None:
    """Two clusters of one VM each (no network): their first rendezvous fails, as every
    two-VM run at UCloud did before vmrun joined a cluster's VMs."""
    for name in ("a", "b"):
        one = run.vmrun("up", name, "--cloud", "ucloud", "--type", "u1-standard-2", timeout=180)
        assert one.returncode == 0, one.stderr + one.stdout
    assert fake.networks == {}
    setup = run.vmrun(
        "setup", "@a", "@b", "--python", str(host_python), "--torch", TORCH_SPEC, timeout=300
    )
    assert setup.returncode == 0, setup.stderr + setup.stdout
    apart = run.vmrun("train", "-H", "@a", "-H", "@b", "--epochs", "1", timeout=300)
    assert apart.returncode != 0 and "rendezvous-unreachable" in apart.stderr, apart.stderr
    for name in ("a", "b"):
        assert run.vmrun("down", name, timeout=120).returncode == 0
    assert fake.live() == []


@pytest.mark.timeout(600)
def test_ucloud_up_setup_train_fetch_down_against_its_stand_in(
    user: Laptop, host_python: Path
) -> None:
    """`vmrun up uc --cloud ucloud -n 2` against the UCloud STAND-IN (tests/testbed/ucloud.py,
    served in the laptop's namespace: UCloud is never dialed): two VM jobs queue, run and
    announce their SSH line (a port of the stand-in's SSH gateway); each is a test host that
    gets the account's SSH keys and, as UCloud's VMs, reaches no other VM unless they share a
    private network (VmHosts); vmrun
    makes one for the cluster, pins the host key it first sees (said once), then setup,
    train on both (meeting at the private names), fetch, down: nothing left. Two single
    VMs, each a cluster of its own (no network), cannot train together."""
    from testbed.ucloud import REFRESH, FakeUCloud, VmHosts

    bed = user.cloud.bed
    machines = [
        bed.add_host(n, login_user="ucloud", authorized=False, networks=("main", "ucpn"))
        for n in ("u1", "u2", "u3", "u4")
    ]
    fake = FakeUCloud(queue_polls=2, access_ttl=5.0)
    vms = VmHosts(fake, machines, user.cloud.laptop)
    fake.boot = vms.boot
    served = user.cloud.call(fake.serve)
    env = {
        **user.env,
        "VMRUN_UCLOUD_URL": served.url,
        "VMRUN_UCLOUD_TOKEN": REFRESH,
        "VMRUN_UCLOUD_PROJECT": "p-lab",
    }
    try:
        run = replace(user, env=env)
        up = run.vmrun(
            "up", "uc", "--cloud", "ucloud", "--type", "u1-standard-2", "-n", "2", timeout=180
        )
        assert up.returncode == 0, up.stderr + up.stdout
        assert "trust on first use" in up.stderr and "queued at UCloud" in up.stderr, up.stderr
        assert len(fake.live()) == 2 and set(fake.projects) == {"p-lab"}
        assert [n["specification"]["subdomain"] for n in fake.networks.values()] == ["vmrun-uc"]
        toml = run.toml()
        assert 'cloud = "ucloud"' in toml and 'groups = ["uc"]' in toml, toml
        u1, u2 = machines[:2]
        ports = {vms.booted[j].name: p for j, p in vms.ports.items()}
        for host, name in ((u1, "uc-0"), (u2, "uc-1")):  # logged in where the SSH line said
            at = f"{host.user}@{vms.gateway.addr}:{ports[host.name]}"  # the gateway's port
            assert f'address = "{at}"' in toml and f'private_addr = "{name}"' in toml, toml
        # the stand-in's rule: not over the SSH address, only inside the network, by name
        assert not u1.can_connect(u2.addr_on("main"), u2.port)
        assert u1.can_connect("uc-1", u2.port) and u2.can_connect("uc-0", u1.port)
        setup = run.vmrun(
            "setup", "@uc", "--python", str(host_python), "--torch", TORCH_SPEC, timeout=300
        )
        assert setup.returncode == 0, setup.stderr + setup.stdout
        train = run.vmrun("train", "-H", "@uc", "--epochs", "1", "--save-every", "1", timeout=300)
        assert train.returncode == 0, train.stderr + train.stdout
        rid = re.search(r"run (\S+) finished", train.stderr)
        assert rid, train.stderr
        _met_at_the_private_names((u1, u2), rid.group(1))
        fetch = run.vmrun("fetch", "results", "--run", rid.group(1), timeout=120)
        assert fetch.returncode == 0, fetch.stderr + fetch.stdout
        assert (user.cwd / "results" / rid.group(1) / "finalmodel.pt").is_file()
        assert "about 4.20 DKK an hour" in up.stderr + up.stdout, up.stderr + up.stdout
        report = run.vmrun("report", rid.group(1), "--json")
        (row,) = json.loads(report.stdout)  # its cost kept in UCloud's currency
        assert row["currency"] == "DKK" and row["cost"] is not None, row
        down = run.vmrun("down", "uc", timeout=120)
        assert down.returncode == 0, down.stderr + down.stdout
        assert "1 private network(s)" in down.stdout, down.stdout
        # nothing left: jobs, the network, the key vmrun added for the cluster, its hosts
        assert (fake.live(), fake.networks, fake.keys) == ([], {}, [])
        assert "[[hosts]]" not in run.toml()
        _apart_cannot_train(run, fake, host_python)
    finally:
        fake.terminate_all()  # what a failed test left
        user.cloud.call(served.close)
        vms.close()
        for host in machines:
            host.stop_sshd()
