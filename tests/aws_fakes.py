"""What moto lacks, answered in-process for the quick tier's `mock_aws` tests."""

from __future__ import annotations

import os
from typing import Any

import pytest

# Test credentials, no ~/.aws, no endpoint override, no instance metadata; moto's catalog of
# 2017 AMIs is not loaded (4 s each time, and unused: the tests seed their own images).
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
}


def use_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's AWS environment: TEST_ENV and nothing else of AWS's."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)


def placement_groups_on(
    ec2: Any, groups: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """moto has no placement groups: the three calls answered here, from a dict (the
    Stubber tests below check the requests vmrun sends)."""
    from botocore.awsrequest import AWSResponse

    groups = {} if groups is None else groups
    ok = AWSResponse("https://ec2", 200, {}, None)

    def create(params: dict[str, Any], **_: Any) -> Any:
        name = params["body"]["GroupName"]
        groups[name] = {"GroupName": name, "State": "available", "Tags": []}
        return ok, {}

    def describe(**_: Any) -> Any:
        return ok, {"PlacementGroups": list(groups.values())}

    def delete(params: dict[str, Any], **_: Any) -> Any:
        groups.pop(params["body"]["GroupName"], None)
        return ok, {}

    events = ec2.meta.events
    events.register("before-call.ec2.CreatePlacementGroup", create)
    events.register("before-call.ec2.DescribePlacementGroups", describe)
    events.register("before-call.ec2.DeletePlacementGroup", delete)
    return groups


@pytest.fixture(scope="module")
def moto_module() -> Any:
    """moto's in-process AWS for a whole module, emptied before each test that asks for it
    (`fresh_moto`): starting it costs ~0.25 s a test more than emptying it."""
    moto = pytest.importorskip("moto")
    mock = moto.mock_aws()
    mock.start()
    yield mock
    mock.stop()


@pytest.fixture
def fresh_moto(moto_module: Any) -> Any:
    moto_module.reset()
    return moto_module
