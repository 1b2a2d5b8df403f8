"""`vmrun up/down`'s own decisions (vmrun.operations.cloud), quick: flags over the [[clouds]]
table, the host key pinned per address (and an old line for a reused address dropped), what
vmrun.toml records, and a failure or Ctrl-C while waiting for SSH removing the whole cluster.
moto in-process stands for AWS; the SSH wait is replaced (the netns test logs in for real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aws_fakes import use_test_credentials

moto = pytest.importorskip("moto")

from vmrun.config import load_settings  # noqa: E402
from vmrun.errors import CloudError, UsageError  # noqa: E402
from vmrun.operations import cloud  # noqa: E402
from vmrun.reporting import Recorder  # noqa: E402

REGION = "us-east-1"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519.pub").write_text("ssh-ed25519 AAAAuserkey me@laptop\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("VMRUN_CONFIG", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    use_test_credentials(monkeypatch)
    return work


@pytest.fixture
def aws(project: Path, fresh_moto: Any) -> Any:
    import boto3
    from aws_fakes import placement_groups_on

    real = cloud.provider_for

    def provider_for(name: str, profile: str) -> Any:
        provider = real(name, profile)
        placement_groups_on(provider.ec2(REGION))  # type: ignore[attr-defined]
        return provider

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cloud, "provider_for", provider_for)
        ec2 = boto3.client("ec2", region_name=REGION)
        yield ec2.register_image(Name="gpu", RootDeviceName="/dev/sda1")["ImageId"]


def _ask(image: str, **kw: Any) -> cloud.UpAsk:
    values: dict[str, Any] = {
        "name": "w251",
        "instance_type": "g4dn.2xlarge",
        "image": image,
        "ssh_from": "198.51.100.7/32",
        "ssh_timeout": 5.0,
        **kw,
    }
    return cloud.UpAsk(**values)


def _live() -> list[str]:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    found = ec2.describe_instances(Filters=[{"Name": "tag:vmrun-cluster", "Values": ["w251"]}])
    states = [i["State"]["Name"] for r in found["Reservations"] for i in r["Instances"]]
    groups = ec2.describe_security_groups(
        Filters=[{"Name": "tag:vmrun-cluster", "Values": ["w251"]}]
    )["SecurityGroups"]
    return [s for s in states if s != "terminated"] + [g["GroupId"] for g in groups]


def test_flags_win_over_the_clouds_table_over_the_defaults(project: Path) -> None:
    (project / "vmrun.toml").write_text(
        '[[clouds]]\nname = "w251"\ncloud = "aws"\ntype = "g4dn.2xlarge"\ncount = 2\nspot = true\n'
    )
    settings = load_settings()
    done = cloud.resolve(cloud.UpAsk("w251", count=3), settings)
    assert (done.instance_type, done.count, done.spot, done.image) == (
        "g4dn.2xlarge",
        3,
        True,
        "dlami",
    )
    with pytest.raises(UsageError) as err:
        cloud.resolve(cloud.UpAsk("other"), settings)
    assert "--type" in err.value.one_line()
    with pytest.raises(UsageError) as err:
        cloud.resolve(cloud.UpAsk("w251", spot=False, spot_fallback=True), settings)
    assert err.value.code == "flags-conflict"
    with pytest.raises(UsageError):
        cloud.resolve(cloud.UpAsk("Bad_Name", instance_type="g4dn.xlarge"), settings)


def test_no_credentials_is_said_before_the_ssh_source_is_looked_up(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local check first: no credentials is the answer, and this machine's public
    address is never asked for (no --ssh-from given)."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    asked: list[str] = []

    def looked_up(ssh_from: str, timeout: float = 5.0) -> str:
        asked.append(ssh_from)
        raise AssertionError("the public address was looked up before the credentials")

    monkeypatch.setattr(cloud, "ssh_source", looked_up)
    with pytest.raises(CloudError) as refused:
        cloud.up(load_settings(), _ask("ami-1", ssh_from=None))
    assert refused.value.code == "cloud-credentials" and asked == []


def test_the_ssh_source_is_a_cidr() -> None:
    assert cloud.ssh_source("203.0.113.7") == "203.0.113.7/32"
    assert cloud.ssh_source("10.1.2.0/24") == "10.1.2.0/24"
    with pytest.raises(UsageError):
        cloud.ssh_source("my laptop")


def _stand_in_ssh(
    monkeypatch: pytest.MonkeyPatch, effect: BaseException | None = None
) -> list[Any]:
    """STAND-IN for the SSH wait: moto's instances run no sshd (the netns test logs in)."""
    seen: list[Any] = []

    def wait(entries: Any, settings: Any, timeout: float, out: Any) -> None:
        seen.extend(entries)
        if effect is not None:
            raise effect

    monkeypatch.setattr(cloud, "_wait_ssh", wait)
    return seen


def test_up_pins_the_key_and_records_the_cluster(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _stand_in_ssh(monkeypatch)
    settings = load_settings()
    known = settings.known_hosts
    known.parent.mkdir(parents=True, exist_ok=True)
    done = cloud.up(settings, _ask(aws, count=2, placement=False), Recorder())
    assert [e.label for e in seen] == ["w251-0", "w251-1"]
    addrs = [i.public_addr for i in done.instances]
    lines = [ln.split() for ln in known.read_text().splitlines()]
    assert [ln[0] for ln in lines] == addrs and len({ln[2] for ln in lines}) == 1
    again = load_settings()
    hosts = [e for e in cloud_hosts(again)]
    assert [h.spec.label for h in hosts] == [f"ubuntu@{a}" for a in addrs]
    assert [h.vars["private_addr"] for h in hosts] == [i.private_addr for i in done.instances]
    assert cloud.table_for(again, "w251")["count"] == 2


def test_up_with_a_store_records_the_role_its_hosts_use(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_ssh(monkeypatch)
    settings = load_settings()
    settings.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    cloud.up(settings, _ask(aws, store="s3://bkt/runs"), Recorder())
    again = load_settings()
    (host,) = cloud_hosts(again)
    assert host.vars["store_role"] == "s3://bkt/runs"  # "auto" credentials: the host's own
    assert cloud.table_for(again, "w251")["store"] == "s3://bkt/runs"
    down = cloud.down(again, "w251")
    assert down.removed is not None and down.removed.roles == ["vmrun-w251"]
    with pytest.raises(UsageError):
        cloud.resolve(_ask(aws, store="gs://bkt"), settings)


def cloud_hosts(settings: Any) -> list[Any]:
    from vmrun.ssh.inventory import select_hosts

    return select_hosts(["@w251"], settings)


def test_an_address_reused_from_an_earlier_vm_loses_its_old_key(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_ssh(monkeypatch)
    settings = load_settings()
    done = cloud.up(settings, _ask(aws), Recorder())
    addr = done.instances[0].public_addr
    cloud.down(load_settings(), "w251")
    assert addr not in settings.known_hosts.read_text()  # down drops the line too
    settings.known_hosts.write_text(f"{addr} ssh-ed25519 AAAAold\n")
    from vmrun.providers.cloudinit import new_host_key

    fresh = new_host_key("x")
    cloud._pin(settings, done.hosts, fresh)
    assert settings.known_hosts.read_text().split() == [addr, "ssh-ed25519", fresh.base64]


@pytest.mark.parametrize(
    "effect", [KeyboardInterrupt(), CloudError("never", code="cloud-ssh-never-up")]
)
def test_ctrl_c_or_no_ssh_removes_the_whole_cluster(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch, effect: BaseException
) -> None:
    _stand_in_ssh(monkeypatch, effect)
    with pytest.raises(type(effect)):
        cloud.up(load_settings(), _ask(aws, count=2, placement=False), Recorder())
    assert _live() == []
    assert not (project / "vmrun.toml").exists()  # nothing recorded for a cluster that is gone


def test_keep_keeps_it_and_down_removes_it_twice_over(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_ssh(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        cloud.up(load_settings(), _ask(aws, keep=True, placement=False), Recorder())
    assert len(_live()) == 2  # the instance and its group
    first = cloud.down(load_settings(), "w251")
    assert first.removed is not None and len(first.removed.instances) == 1 and _live() == []
    second = cloud.down(load_settings(), "w251")
    assert second.removed is not None and second.removed.instances == []


def test_up_of_a_running_cluster_makes_nothing_new(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _stand_in_ssh(monkeypatch)
    first = cloud.up(load_settings(), _ask(aws), Recorder())
    known = load_settings().known_hosts
    pinned = known.read_text()
    known.unlink()  # another machine, or a lost known_hosts: the key comes from the user data
    from vmrun.ssh.inventory import HostEntry, record_hosts

    node = first.hosts[0]  # as `vmrun setup @w251` leaves it
    setup = HostEntry(node.spec, node.name, node.groups, {**node.vars, "python": "/env/python"})
    record_hosts(project, [setup])
    again = cloud.up(load_settings(), _ask(aws), Recorder())
    assert again.already and [i.id for i in again.instances] == [i.id for i in first.instances]
    assert known.read_text() == pinned
    assert cloud_hosts(load_settings())[0].vars["python"] == "/env/python"  # setup's, kept


def test_the_hourly_cost_is_said_first_and_a_dearer_cluster_is_refused_before_it_is_made(
    aws: str, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` says what the cluster costs an hour before it makes anything (the price list's
    price, here 0.752 USD a VM); above --max-hourly-cost it is refused then, and nothing is
    made; an unknown price with a limit given is refused too."""
    from vmrun.providers.aws.provider import AwsProvider

    _stand_in_ssh(monkeypatch)
    price: list[float | None] = [0.752]
    monkeypatch.setattr(AwsProvider, "hourly_price", lambda self, inst: price[0])
    settings = load_settings()
    with pytest.raises(UsageError) as dear:
        cloud.up(settings, _ask(aws, count=2, placement=False, max_hourly_cost=1.0), Recorder())
    assert dear.value.code == "over-budget" and "$1.50 an hour" in dear.value.message
    assert _live() == []  # nothing made: no instance, no security group
    price[0] = None
    with pytest.raises(UsageError) as unknown:
        cloud.up(settings, _ask(aws, count=2, placement=False, max_hourly_cost=9.0), Recorder())
    assert unknown.value.code == "over-budget" and "no price" in unknown.value.message
    price[0] = 0.752
    out = Recorder()
    done = cloud.up(settings, _ask(aws, count=2, placement=False, max_hourly_cost=2.0), out)
    said = next(i for i, line in enumerate(out.lines) if "about $1.50 an hour" in line)
    made = next(i for i, line in enumerate(out.lines) if "requested" in line or "running" in line)
    assert said < made, out.lines
    assert done.per_hour == pytest.approx(1.504)
