"""vmrun.providers.ucloud's calls and readings, driven by a fake transport (quick tier): the
token's refresh on UCloud's 403, an API token sent as it is, the project header, UCloud's
error body as one line, the SSH line of a VM's job, a product's price an hour."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from vmrun.errors import CloudError
from vmrun.providers.ucloud.jobs import price_of, ssh_at
from vmrun.providers.ucloud.session import Session, find_token


class Fake:
    """UCloud's answers by path; every request kept (method, path, headers, body)."""

    def __init__(self, answers: Mapping[str, list[tuple[int, Any]]]):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.seen: list[tuple[str, str, dict[str, str], Any]] = []

    def __call__(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        path = url.split("example.test", 1)[1].split("?", 1)[0]
        self.seen.append(
            (
                method,
                url.split("example.test", 1)[1],
                dict(headers),
                json.loads(body) if body else None,
            )
        )
        queue = self.answers[path]
        status, answer = queue.pop(0) if len(queue) > 1 else queue[0]
        return status, json.dumps(answer).encode()


def test_an_expired_access_token_is_refreshed_once_and_the_call_made_again() -> None:
    fake = Fake(
        {
            "/auth/refresh": [
                (200, {"accessToken": "a1", "csrfToken": "c"}),
                (200, {"accessToken": "a2", "csrfToken": "c"}),
            ],
            "/api/jobs/retrieve": [
                (200, {"id": "1"}),
                (403, {"statusCode": 403, "why": "Forbidden"}),
                (200, {"id": "1"}),
            ],
        }
    )
    s = Session("refresh-jwt.x.y", url="https://example.test", project="p1", transport=fake)
    query = {"id": 1, "includeUpdates": True}
    assert s.call("GET", "/api/jobs/retrieve", query=query) == {"id": "1"}
    assert s.call("GET", "/api/jobs/retrieve", query={"id": 1}) == {"id": "1"}
    assert s.refreshes == 2
    paths = [(m, p) for m, p, _, _ in fake.seen]
    assert paths[0] == ("POST", "/auth/refresh")
    assert paths[1] == ("GET", "/api/jobs/retrieve?id=1&includeUpdates=true")
    assert fake.seen[0][2]["Authorization"] == "Bearer refresh-jwt.x.y"  # the refresh token
    assert fake.seen[1][2]["Authorization"] == "Bearer a1" and fake.seen[1][2]["Project"] == "p1"
    assert fake.seen[-1][2]["Authorization"] == "Bearer a2"


def test_an_api_token_is_the_bearer_and_ucloud_s_refusal_is_one_line() -> None:
    fake = Fake(
        {
            "/api/jobs": [
                (400, {"statusCode": 400, "why": "unknown application requested", "errorCode": ""})
            ]
        }
    )
    s = Session("uc12ab-secret", url="https://example.test", project="p1", transport=fake)
    with pytest.raises(CloudError) as refused:
        s.call("POST", "/api/jobs", {"items": []}, what="creating the VM")
    assert refused.value.code == "cloud-failed"
    assert refused.value.one_line().startswith(
        "UCloud refused creating the VM: 400 unknown application requested"
    )
    assert "\n" not in refused.value.one_line() and "secret" not in refused.value.one_line()
    (seen,) = fake.seen  # no refresh for an API token, no project header (its own)
    assert seen[2]["Authorization"] == "Bearer uc12ab-secret" and "Project" not in seen[2]


def test_a_refresh_token_ucloud_refuses_is_cloud_credentials() -> None:
    fake = Fake({"/auth/refresh": [(401, {"statusCode": 401, "why": "Unauthorized"})]})
    s = Session("old.jwt.token", url="https://example.test", transport=fake)
    with pytest.raises(CloudError) as refused:
        s.call("GET", "/api/jobs/browse")
    assert refused.value.code == "cloud-credentials" and "401 Unauthorized" in str(refused.value)


def test_the_token_file_must_be_the_user_s_alone(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert find_token(env) == ""
    path = tmp_path / ".config" / "vmrun" / "ucloud-token"
    path.parent.mkdir(parents=True)
    path.write_text("uc1-abc\n")
    path.chmod(0o644)
    with pytest.raises(CloudError) as loose:
        find_token(env)
    assert loose.value.code == "cloud-credentials" and "chmod 600" in loose.value.hint
    path.chmod(0o600)
    assert find_token(env) == "uc1-abc"
    assert find_token({**env, "VMRUN_UCLOUD_TOKEN": "uc2-x"}) == "uc2-x"


def test_the_newest_ssh_line_of_a_job_is_its_login() -> None:
    job = {
        "updates": [
            {"state": "IN_QUEUE", "status": "Your job is queued"},
            {"status": "SSH: Connected! Available at: ssh ucloud@130.225.1.2 -p 41231"},
            {"state": "SUSPENDED", "status": "suspended"},
            {
                "status": "SSH: ready\n"
                "SSH: Connected! Available at: ssh ucloud@ssh.cloud.sdu.dk -p 2202"
            },
        ]
    }
    at = ssh_at(job)
    assert at is not None and (at.user, at.host, at.port) == ("ucloud", "ssh.cloud.sdu.dk", 2202)
    old = ssh_at({"updates": [{"status": "SSH Access: ssh ucloud@10.0.0.7"}]})
    assert old is not None and (old.host, old.port) == ("10.0.0.7", 22)
    assert ssh_at({"updates": [{"status": "Your job is now running!"}]}) is None


def test_a_product_s_price_an_hour() -> None:
    def product(price: int, freq: str, money: bool = True, free: bool = False) -> dict[str, Any]:
        return {
            "price": price,
            "category": {
                "accountingUnit": {"name": "DKK", "floatingPoint": money},
                "accountingFrequency": freq,
                "freeToUse": free,
            },
        }

    minute = price_of(product(105_000, "PERIODIC_MINUTE"))  # 0.105 DKK a minute
    assert minute is not None and (minute.per_hour, minute.unit) == (6.3, "DKK")
    hour = price_of(product(2_500_000, "PERIODIC_HOUR"))
    assert hour is not None and hour.per_hour == 2.5
    assert price_of(product(4, "PERIODIC_MINUTE", money=False)) is None  # core-hours
    free = price_of(product(0, "PERIODIC_MINUTE", free=True))
    assert free is not None and free.per_hour == 0
