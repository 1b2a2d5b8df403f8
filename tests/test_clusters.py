"""`vmrun cloud`: what vmrun tagged, per region, priced, and which clusters no vmrun.toml
names. The listing runs against moto's in-process EC2 (mock_aws: botocore is patched,
nothing is dialled); moto has neither placement groups nor the Price List API, so those
calls are answered by botocore's Stubber or a before-call hook at exactly that point."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, errors_in

pytest.importorskip("moto")
from botocore.stub import ANY, Stubber
from moto import mock_aws

from vmrun.config import load_settings
from vmrun.errors import CloudError, ConfigError
from vmrun.operations.clusters import Listing, list_clusters, recorded_clusters
from vmrun.providers import regions as record
from vmrun.providers.api import TAG_CLUSTER, TAG_CREATED, Resource
from vmrun.providers.aws import listing, prices
from vmrun.providers.aws.listing import Gap
from vmrun.providers.aws.session import Session

AMI = "ami-12c6146b"  # in moto's bundled catalog


@pytest.fixture
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Test credentials, no ~/.aws, no endpoint override, config and cache in tmp_path."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def ec2_mock(aws_env: dict[str, str]) -> Iterator[None]:
    with mock_aws():
        yield


def _tags(kind: str, cluster: str, **more: str) -> list[dict[str, Any]]:
    tags = [
        {"Key": TAG_CLUSTER, "Value": cluster},
        *({"Key": k, "Value": v} for k, v in more.items()),
    ]
    return [{"ResourceType": kind, "Tags": tags}]


def _launch(
    region: str, cluster: str | None, *, spot: bool = False, kind: str = "g4dn.xlarge"
) -> str:
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    extra: dict[str, Any] = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    if cluster is not None:
        extra["TagSpecifications"] = _tags("instance", cluster)
    answer = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType=kind, **extra)
    return str(answer["Instances"][0]["InstanceId"])


def _no_placement_groups(
    session: Session, region: str, groups: list[dict[str, Any]] | None = None
) -> None:
    """moto lacks DescribePlacementGroups: answer it before the call is sent."""
    from botocore.awsrequest import AWSResponse

    def answer(**kwargs: Any) -> Any:
        return AWSResponse("https://stub", 200, {}, None), {"PlacementGroups": groups or []}

    session.client("ec2", region).meta.events.register(
        "before-call.ec2.DescribePlacementGroups", answer
    )


def _stub_pricing(session: Session, answers: dict[str, float | None]) -> Stubber:
    """The Price List API, for the instance types in `answers` (in the order asked)."""
    stub = Stubber(session.client("pricing", prices.PRICING_REGION, quick=True))
    for _, price in answers.items():
        stub.add_response(
            "get_products",
            _price_list(price),
            {
                "ServiceCode": "AmazonEC2",
                "Filters": ANY,
                "FormatVersion": "aws_v1",
                "MaxResults": 10,
            },
        )
    stub.activate()
    return stub


def _price_list(price: float | None) -> dict[str, Any]:
    if price is None:
        return {"PriceList": [], "FormatVersion": "aws_v1"}
    product = {
        "product": {"attributes": {"instanceType": "g4dn.xlarge"}},
        "terms": {
            "OnDemand": {
                "SKU.TERM": {
                    "priceDimensions": {
                        "SKU.TERM.DIM": {"unit": "Hrs", "pricePerUnit": {"USD": f"{price:.10f}"}}
                    }
                }
            }
        },
    }
    return {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"}


# -- the record of regions ---------------------------------------------------------------


def test_regions_used_are_recorded_once_user_only(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HOME": str(tmp_path)}
    assert record.regions_used("aws", environ=env) == []
    for region in ("us-west-2", "us-east-1", "us-west-2"):
        record.note_region("aws", region, environ=env)
    record.note_region("gcp", "europe-west4", environ=env)
    assert record.regions_used("aws", environ=env) == ["us-east-1", "us-west-2"]
    assert record.regions_used("gcp", environ=env) == ["europe-west4"]
    path = record.regions_path(env)
    assert path.parent == tmp_path / "cfg" / "vmrun"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".regions.json.")] == [
        ".regions.json.lock"
    ]  # no temporary file left


def test_an_unreadable_region_record_is_an_error_not_empty(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    path = record.regions_path(env)
    path.parent.mkdir(parents=True)
    for text in ("{not json", '{"aws": "us-east-1"}'):
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            record.regions_used("aws", environ=env)
        assert info.value.code == "bad-config" and str(path) in info.value.message
        with pytest.raises(ConfigError):
            record.note_region("aws", "us-east-1", environ=env)
        assert path.read_text() == text  # left for the user to fix


# -- prices -----------------------------------------------------------------------------


def test_on_demand_price_from_the_price_list_and_cached(aws_env: dict[str, str]) -> None:
    session = Session(None)
    stub = _stub_pricing(session, {"g4dn.xlarge": 0.526})
    first = prices.Prices(session)
    assert first.on_demand("g4dn.xlarge", "us-east-1") == pytest.approx(0.526)
    assert first.on_demand("g4dn.xlarge", "us-east-1") == pytest.approx(0.526)  # asked once
    stub.assert_no_pending_responses()
    first.save()
    assert prices.cache_path().is_file()
    # a second listing, within the day, asks nothing (the stub has no answer left)
    assert prices.Prices(session).on_demand("g4dn.xlarge", "us-east-1") == pytest.approx(0.526)
    # past the day, it asks again: the empty stub fails, and a failure is only "unknown"
    later = prices.Prices(session, clock=lambda: 2e10)
    assert later.on_demand("g4dn.xlarge", "us-east-1") is None


def test_the_price_list_filters_name_the_product_vmrun_launches() -> None:
    filters = {f["Field"]: f["Value"] for f in prices.on_demand_filters("p3.2xlarge", "eu-west-1")}
    assert filters == {
        "instanceType": "p3.2xlarge",
        "regionCode": "eu-west-1",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    assert prices.parse_on_demand(_price_list(3.06)["PriceList"]) == pytest.approx(3.06)
    assert prices.parse_on_demand([]) is None


@pytest.mark.parametrize("code", ["AccessDeniedException", "ThrottlingException"])
def test_a_price_list_refusal_is_no_price_never_an_error(
    aws_env: dict[str, str], code: str
) -> None:
    session = Session(None)
    pricing = session.client("pricing", prices.PRICING_REGION, quick=True)
    asked: list[str] = []
    pricing.meta.events.register(
        "before-parameter-build.pricing.GetProducts", lambda **kw: asked.append("?")
    )
    stub = Stubber(pricing)
    stub.add_client_error("get_products", service_error_code=code, http_status_code=400)
    stub.activate()
    found = prices.Prices(session)
    assert found.on_demand("g4dn.xlarge", "us-east-1") is None
    assert found.on_demand("p3.2xlarge", "us-east-1") is None
    assert found.volume("gp3", 500, "us-east-1") is None
    assert len(asked) == 1  # refused once: not asked again in this listing
    found.save()
    assert not prices.cache_path().exists()  # a failure is not remembered


def test_a_volume_left_behind_is_priced_by_its_size(aws_env: dict[str, str]) -> None:
    session = Session(None)
    stub = Stubber(session.client("pricing", prices.PRICING_REGION, quick=True))
    per_gb = {
        "terms": {
            "OnDemand": {
                "T": {
                    "priceDimensions": {
                        "D": {"unit": "GB-Mo", "pricePerUnit": {"USD": "0.0800000000"}}
                    }
                }
            }
        }
    }
    stub.add_response(
        "get_products",
        {"PriceList": [json.dumps(per_gb)], "FormatVersion": "aws_v1"},
        {
            "ServiceCode": "AmazonEC2",
            "Filters": prices.volume_filters("gp3", "us-east-1"),
            "FormatVersion": "aws_v1",
            "MaxResults": 10,
        },
    )
    stub.activate()
    found = prices.Prices(session)
    assert found.volume("gp3", 500, "us-east-1") == pytest.approx(0.08 * 500 / 730)
    assert found.volume("gp3", 100, "us-east-1") == pytest.approx(0.08 * 100 / 730)  # cached
    stub.assert_no_pending_responses()


def test_spot_price_is_the_zones_latest(aws_env: dict[str, str]) -> None:
    session = Session(None)
    stub = Stubber(session.client("ec2", "us-west-2", quick=True))
    now = datetime.now(timezone.utc)
    history = [
        {
            "AvailabilityZone": "us-west-2b",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.9000",
            "Timestamp": now - timedelta(hours=1),
            "ProductDescription": "Linux/UNIX",
        },
        {
            "AvailabilityZone": "us-west-2a",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.4000",
            "Timestamp": now - timedelta(hours=2),
            "ProductDescription": "Linux/UNIX",
        },
        {
            "AvailabilityZone": "us-west-2a",
            "InstanceType": "g5.xlarge",
            "SpotPrice": "0.4100",
            "Timestamp": now - timedelta(minutes=5),
            "ProductDescription": "Linux/UNIX",
        },
    ]
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": history},
        {
            "InstanceTypes": ["g5.xlarge"],
            "AvailabilityZone": "us-west-2a",
            "ProductDescriptions": ANY,
            "StartTime": ANY,
            "MaxResults": 20,
        },
    )
    stub.activate()
    found = prices.Prices(session)
    assert found.hourly("g5.xlarge", "us-west-2", "us-west-2a", spot=True) == pytest.approx(0.41)
    stub.assert_no_pending_responses()


# -- the listing ----------------------------------------------------------------------------


def test_placement_groups_are_listed_by_tag(aws_env: dict[str, str]) -> None:
    session = Session(None)
    ec2 = session.client("ec2", "us-east-1")
    stub = Stubber(ec2)
    group = {
        "GroupName": "vmrun-w251",
        "GroupId": "pg-0123",
        "State": "available",
        "Strategy": "cluster",
        "Tags": [
            {"Key": TAG_CLUSTER, "Value": "w251"},
            {"Key": TAG_CREATED, "Value": "2026-01-02T03:04:05Z"},
        ],
    }
    stub.add_response(
        "describe_placement_groups",
        {"PlacementGroups": [group]},
        {"Filters": [{"Name": "tag-key", "Values": [TAG_CLUSTER]}]},
    )
    with stub:
        [found] = listing._placement_groups(ec2, "us-east-1")
    assert (found.kind, found.id, found.cluster, found.state) == (
        "placement-group",
        "vmrun-w251",
        "w251",
        "available",
    )
    assert found.created == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def test_every_tagged_resource_is_listed_sorted(ec2_mock: None) -> None:
    import boto3

    kept = _launch("us-east-1", "w251")
    spot = _launch("us-east-1", "w251", spot=True)
    _launch("us-east-1", None)  # not vmrun's
    gone = _launch("us-east-1", "old")
    boto3.client("ec2", region_name="us-east-1").terminate_instances(InstanceIds=[gone])
    west = _launch("us-west-2", "aaa")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    group = ec2.create_security_group(
        GroupName="vmrun-w251",
        Description="vmrun",
        TagSpecifications=_tags("security-group", "w251"),
    )["GroupId"]
    ec2.create_security_group(GroupName="other", Description="not vmrun's")
    volume = ec2.create_volume(
        Size=500,
        AvailabilityZone="us-east-1a",
        VolumeType="gp3",
        TagSpecifications=_tags("volume", "w251"),
    )["VolumeId"]
    session = Session(None)
    for region in ("us-east-1", "us-west-2"):
        _no_placement_groups(session, region)
    found = listing.resources(session, ["us-west-2", "us-east-1"])
    assert [(r.cluster, r.kind, r.id) for r in found] == [
        ("aaa", "instance", west),
        *(("w251", "instance", i) for i in sorted([kept, spot])),
        ("w251", "volume", volume),
        ("w251", "security-group", group),
    ]
    by_id = {r.id: r for r in found}
    assert by_id[spot].spot and not by_id[kept].spot
    assert by_id[kept].state == "running" and by_id[kept].instance_type == "g4dn.xlarge"
    assert by_id[kept].zone.startswith("us-east-1") and by_id[kept].created is not None
    assert (by_id[volume].instance_type, by_id[volume].size_gb) == ("gp3", 500)
    assert by_id[west].region == "us-west-2"


def test_a_kind_that_cannot_be_listed_is_a_gap_not_nothing(ec2_mock: None) -> None:
    """moto's own answer to DescribePlacementGroups in server mode is an HTML page: a
    region where one kind fails still lists the others, and says what it could not."""
    from botocore.parsers import ResponseParserError

    instance = _launch("us-east-1", "w251")
    session = Session(None)

    def broken(**kwargs: Any) -> Any:
        raise ResponseParserError("Unable to parse response (not XML)")

    session.client("ec2", "us-east-1").meta.events.register(
        "before-call.ec2.DescribePlacementGroups", broken
    )
    found = listing.survey(session, ["us-east-1"])
    assert [r.id for r in found.resources] == [instance]
    [gap] = found.gaps
    assert (gap.region, gap.kind) == ("us-east-1", "placement-group")
    assert isinstance(gap.error, CloudError) and gap.error.code == "cloud-failed"
    with pytest.raises(CloudError):
        listing.resources(session, ["us-east-1"])


def test_no_credentials_is_one_error_not_a_gap_per_question(
    aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with mock_aws(config={"core": {"mock_credentials": False}}), pytest.raises(CloudError) as info:
        listing.survey(Session(None), ["us-east-1", "eu-west-1"])
    assert info.value.code == "cloud-credentials"


def test_list_clusters_marks_what_no_vmrun_toml_names(
    ec2_mock: None, tmp_path: Path, aws_env: dict[str, str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "vmrun.toml").write_text(
        '[[clouds]]\nname = "w251"\ncloud = "aws"\ntype = "g4dn.xlarge"\nregion = "us-west-2"\n\n'
        '[[hosts]]\naddress = "ubuntu@203.0.113.9"\ngroups = ["homework"]\n'
    )
    settings = load_settings({}, cwd=project, environ=aws_env)
    assert recorded_clusters(settings.project_data) == {"w251", "homework"}
    record.note_region("aws", "eu-west-1", environ=aws_env)
    w251 = [_launch("us-west-2", "w251"), _launch("us-west-2", "w251")]
    homework = _launch("eu-west-1", "homework", kind="p3.2xlarge")
    by_hand = _launch("us-east-1", "by-hand", kind="p3.2xlarge")  # the profile's region
    import boto3

    boto3.client("ec2", region_name="us-east-1").stop_instances(InstanceIds=[by_hand])
    _launch("ap-south-1", "elsewhere")  # in no region vmrun used: not asked
    session = Session(None)
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        _no_placement_groups(session, region)
    # asked in region order: eu-west-1 (p3), us-east-1 (p3, from the cache), us-west-2 (g4dn)
    stub = _stub_pricing(session, {"p3.2xlarge": 3.06, "g4dn.xlarge": 0.526})
    found = list_clusters(settings, session=session, environ=aws_env)
    assert found.regions == ["eu-west-1", "us-east-1", "us-west-2"]
    assert found.forgotten == ["by-hand"]
    assert found.clusters == ["by-hand", "homework", "w251"]
    assert {r.id for r in found.resources} == {*w251, homework, by_hand}
    stub.assert_no_pending_responses()
    # running: 2 x g4dn.xlarge + 1 p3.2xlarge; the stopped one costs no instance hours
    assert found.per_hour == pytest.approx(2 * 0.526 + 3.06)
    assert found.unpriced == 0 and found.exit_code == 0
    only = list_clusters(settings, session=session, regions=["us-west-2"], environ=aws_env)
    assert only.regions == ["us-west-2"] and only.forgotten == []
    assert {r.id for r in only.resources} == set(w251)
    assert only.per_hour == pytest.approx(2 * 0.526)  # from the cache: the stub is empty


def test_all_regions_asks_the_account(
    ec2_mock: None, aws_env: dict[str, str], tmp_path: Path
) -> None:
    settings = load_settings({}, cwd=tmp_path, environ=aws_env)
    session = Session(None)
    far = _launch("ap-south-1", "far")
    regions = ["ap-south-1", "eu-west-1", "us-east-1"]  # the account's, as describe_regions says

    def three(**_: object) -> object:  # moto lists all ~30: each costs a backend here
        from botocore.awsrequest import AWSResponse

        answer = {"Regions": [{"RegionName": r} for r in regions]}
        return AWSResponse("https://ec2", 200, {}, None), answer

    session.client("ec2", "us-east-1").meta.events.register(
        "before-call.ec2.DescribeRegions", three
    )
    for region in regions:
        _no_placement_groups(session, region)
    Stubber(
        session.client("pricing", prices.PRICING_REGION, quick=True)
    ).activate()  # no answer: no price
    found = list_clusters(settings, session=session, all_regions=True, environ=aws_env)
    assert "ap-south-1" in found.regions and len(found.regions) == len(regions)
    assert [r.id for r in found.resources] == [far] and found.forgotten == ["far"]
    assert found.per_hour == 0 and found.unpriced == 1


# -- rendering (a canned Listing: the CLI in a child process cannot share mock_aws) ------

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _canned(gaps: list[Gap] | None = None) -> Listing:
    res = [
        Resource(
            "instance",
            "i-1",
            "w251",
            "us-east-1",
            "running",
            "g4dn.2xlarge",
            NOW - timedelta(hours=3, minutes=12),
            price=0.752,
            zone="us-east-1a",
        ),
        Resource(
            "instance",
            "i-2",
            "w251",
            "us-east-1",
            "running",
            "g4dn.2xlarge",
            NOW - timedelta(days=2, hours=1),
            spot=True,
            zone="us-east-1a",
        ),
        Resource("security-group", "sg-1", "w251", "us-east-1"),
        Resource(
            "volume",
            "vol-9",
            "zombie",
            "eu-west-1",
            "available",
            "gp3",
            NOW - timedelta(minutes=7),
            zone="eu-west-1b",
            size_gb=500,
            price=0.0548,
        ),
    ]
    return Listing(
        ["eu-west-1", "us-east-1"], res, ["zombie"], gaps or [], per_hour=0.8068, unpriced=1
    )


def test_the_table_marks_forgotten_clusters_and_says_how_to_remove(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vmrun.cli.cloud_cmd import FORGOTTEN, HEADERS, render

    assert render(_canned(), as_json=False, now=NOW) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [h for h in HEADERS]
    rows = {line.split()[2 if FORGOTTEN not in line else 3]: line for line in out[1:5]}
    assert FORGOTTEN in rows["vol-9"] and FORGOTTEN not in rows["i-1"]
    assert "3h12m" in rows["i-1"] and "0.752" in rows["i-1"]
    assert "gp3 500G" in rows["vol-9"] and "7m" in rows["vol-9"]
    assert "2d1h" in rows["i-2"] and "spot" in rows["i-2"] and rows["i-2"].endswith("-")
    assert "zombie" in out[-1] and "vmrun down NAME" in out[-1]
    assert "$0.81/h" in out[-2] and "1 without a price" in out[-2]


def test_json_carries_the_same_facts_and_the_gaps(capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.cloud_cmd import render

    gap = Gap("eu-west-1", "placement-group", CloudError("listing placement-groups: no"))
    assert render(_canned([gap]), as_json=True, now=NOW) == 15
    data = json.loads(capsys.readouterr().out)
    assert data["forgotten"] == ["zombie"] and data["per_hour"] == 0.8068
    assert data["resources"][-1]["size_gb"] == 500
    first = data["resources"][0]
    assert (first["id"], first["price_per_hour"], first["age_s"], first["forgotten"]) == (
        "i-1",
        0.752,
        3 * 3600 + 12 * 60,
        False,
    )
    assert [r["forgotten"] for r in data["resources"]] == [False, False, False, True]
    [error] = data["errors"]
    assert (error["region"], error["kind"], error["code"]) == (
        "eu-west-1",
        "placement-group",
        "cloud-failed",
    )


def test_a_gap_is_an_error_line_and_exit_15(capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.cloud_cmd import render

    gap = Gap("eu-west-1", "volume", CloudError("listing volumes in eu-west-1: timed out"))
    assert render(_canned([gap]), as_json=False, now=NOW) == 15
    [(code, line)] = errors_in(capsys.readouterr().err)
    assert code == "cloud-failed" and "eu-west-1" in line


def test_nothing_found_says_where_it_looked(capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.cloud_cmd import render

    assert render(Listing(["us-east-1"], []), as_json=False, now=NOW) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "us-east-1" in captured.err


# -- [[clouds]] in vmrun.toml ------------------------------------------------------------


def test_clouds_tables_are_checked(tmp_path: Path) -> None:
    good = (
        '[[clouds]]\nname = "w251"\ncloud = "aws"\ntype = "g4dn.2xlarge"\ncount = 2\n'
        'region = "us-east-1"\nzone = "us-east-1a"\nspot = true\nspot_fallback = false\n'
        'disk = 500\nimage = "dlami"\nuser = "ubuntu"\nautostop = "30m"\n'
        'autostop_terminate = true\nssh_from = "203.0.113.7/32"\nprofile = "school"\n'
        "placement = true\n"
    )
    (tmp_path / "vmrun.toml").write_text(good)
    data = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)}).project_data
    assert data["clouds"][0]["count"] == 2
    for bad, line, key in (
        ('[[clouds]]\nname = "a"\ncloud = "gcp"\n', 3, "cloud"),
        ('[[clouds]]\nname = "a"\ncount = 0\n', 3, "count"),
        ('[[clouds]]\nname = "a"\nspot = "yes"\n', 3, "spot"),
        (
            '[[clouds]]\nname = "a"\n\n[[clouds]]\nname = "b"\nssh_from = "everyone"\n',
            6,
            "ssh_from",
        ),
        ('[[clouds]]\nname = "a"\nautostop = "soon"\n', 3, "autostop"),
        ('[[clouds]]\nname = "a"\ngpus = 8\n', 3, "gpus"),
        ('clouds = ["w251"]\n', 1, "clouds"),
    ):
        (tmp_path / "vmrun.toml").write_text(bad)
        with pytest.raises(ConfigError) as info:
            load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
        assert info.value.code == "bad-config", bad
        assert f"line {line}:" in info.value.message and key in info.value.message, (
            bad,
            info.value.message,
        )


# -- the command in a child process (the netns tier: the `client` fixture) ------------------


def _aws_client_env(client: Client, **more: str) -> dict[str, str]:
    return {
        "AWS_CONFIG_FILE": str(client.home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(client.home / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
        **more,
    }


def test_region_and_all_regions_are_refused_together(client: Client) -> None:
    done = client.vmrun("cloud", "--region", "us-east-1", "--all-regions")
    assert done.returncode == 2, done.stderr
    assert errors_in(done.stderr)[0][0] == "usage"


def test_no_credentials_is_one_line_exit_15(client: Client) -> None:
    done = client.vmrun("cloud", env=_aws_client_env(client), offline=True)
    assert done.returncode == 15, done.stderr
    [(code, _)] = errors_in(done.stderr)
    assert code == "cloud-credentials"


@pytest.fixture
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_a_cluster_made_by_hand_is_listed_as_forgotten(client: Client, moto_server: str) -> None:
    """Against moto's server (a real HTTP endpoint on loopback): its answer to
    DescribePlacementGroups is no EC2 answer, so that one question is an error line (exit
    15), and everything else is still listed."""
    import boto3

    env = _aws_client_env(
        client,
        AWS_ENDPOINT_URL=moto_server,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        XDG_CACHE_HOME=str(client.home / "cache"),
    )
    ec2 = boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=moto_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    made = ec2.run_instances(
        ImageId=AMI,
        MinCount=1,
        MaxCount=1,
        InstanceType="g4dn.xlarge",
        TagSpecifications=_tags("instance", "by-hand"),
    )["Instances"][0]["InstanceId"]
    (client.cwd / "vmrun.toml").write_text('[[clouds]]\nname = "w251"\ncloud = "aws"\n')
    done = client.vmrun("cloud", "--json", env=env)
    data = json.loads(done.stdout)
    assert [(r["id"], r["forgotten"]) for r in data["resources"]] == [(made, True)]
    assert data["regions"] == ["us-east-1"] and data["forgotten"] == ["by-hand"]
    assert [(e["kind"], e["code"]) for e in data["errors"]] == [("placement-group", "cloud-failed")]
    assert done.returncode == 15
    table = client.vmrun("cloud", env=env)
    assert table.returncode == 15
    assert made in table.stdout and "vmrun down NAME" in table.stdout
    assert [code for code, _ in errors_in(table.stderr)] == ["cloud-failed"]
