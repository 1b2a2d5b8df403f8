"""A run's bucket copy as vmrun decides about it (quick tier, fakes): where the copy stands
as `status` shows it, the flags refused with --store, `fetch --store`'s choice and
placement of a run's objects (the record beside the outputs, the newest checkpoints), each
object checked on arrival and one that is not what the bucket says refused, and the run's
record read back (moto's S3 in this process)."""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from vmrun import hostside
from vmrun.errors import UsageError
from vmrun.operations import refusals
from vmrun.results.record import RunRecord
from vmrun.runs.store_fetch import _wanted, fetch_run
from vmrun.runs.store_runs import run_record
from vmrun.store_url import parse_store
from vmrun.stores.bucket import Object, newest_run
from vmrun.stores.sync import StoreState
from vmrun.transfer.types import Progress


def test_where_the_copy_stands_is_read_and_said() -> None:
    failing = StoreState.parse(
        '{"to": "s3://bkt/r/x", "state": "failing", "at": 100, "synced": 40, "failing_since": 60,'
        ' "files": 3, "bytes": 50331648, "error": "connection refused"}'
    )
    assert failing is not None and failing.behind(now=100) == 60
    said = failing.describe(now=100)
    assert "3 file(s) (48.0 MiB) behind for 40 s" in said and "connection refused" in said
    assert failing.as_json(now=100)["behind_s"] == 60
    ok = StoreState.parse('{"to": "s3://bkt/r/x", "state": "ok", "at": 5, "synced": 5}')
    assert ok is not None and ok.behind(now=500) == 0.0
    assert StoreState.parse("not json") is None and StoreState.parse('{"x": 1}') is None


def test_the_status_table_says_how_far_behind() -> None:
    from vmrun.cli.status_cmd import _bucket

    @dataclass
    class Row:
        store: StoreState | None
        host_now: float = 100.0

    failing = StoreState("s3://bkt/x", "failing", 100.0, synced=70.0, failing_since=80.0)
    assert _bucket(Row(failing)) == "30 s behind"
    assert _bucket(Row(StoreState("s3://bkt/x", "done", 1.0, synced=1.0))) == "all there"
    assert _bucket(Row(None)) == "-"
    # every state the copier writes (store_sync.sh's `state WORD`) is said in words
    code = re.sub(r"(^|\s)#.*", "", hostside.source("store_sync.sh"), flags=re.MULTILINE)
    written = set(re.findall(r"\bstate '?([a-z-]+)'?", code))
    assert written >= {"syncing", "ok", "done", "failing", "gave-up", "replaced", "waiting"}
    for word in written:
        shown = _bucket(Row(StoreState("s3://bkt/x", word, 100.0, synced=1.0)))
        assert shown != word and shown != "-", word
    assert _bucket(Row(StoreState("s3://bkt/x", "waiting", 1.0))) == "waits for its master"


@pytest.mark.parametrize("where", ["--local", "-C"])
def test_store_is_refused_where_it_cannot_copy(where: str) -> None:
    with pytest.raises(UsageError) as caught:
        refusals.check("train", {"--store": "s3://bkt/p", where: "c" if where == "-C" else True})
    assert caught.value.code == "flags-conflict" and "--store" in str(caught.value)


def test_a_store_in_vmrun_toml_is_checked_as_it_is_read(tmp_path: Path) -> None:
    from vmrun.config import load_settings
    from vmrun.errors import ConfigError

    (tmp_path / "vmrun.toml").write_text('store = "s3://bkt/runs"\n')
    assert load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)}).store == "s3://bkt/runs"
    (tmp_path / "vmrun.toml").write_text('store = "gs://bkt/runs"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert "store" in str(caught.value) and "s3://BUCKET/PREFIX" in str(caught.value)


def test_a_store_prefix_with_a_quote_is_refused() -> None:
    with pytest.raises(UsageError) as caught:
        parse_store('s3://bucket/a"b')
    assert caught.value.code == "bad-store"


def test_fetch_from_the_store_refuses_hosts_and_needs_a_place(tmp_path: Path) -> None:
    from vmrun.config import load_settings
    from vmrun.operations.fetch import FetchJob, check

    settings = load_settings({})
    with pytest.raises(UsageError) as caught:
        check(FetchJob(["results"], settings, store="s3://bkt/p", hosts=["h1"]))
    assert caught.value.code == "flags-conflict"
    with pytest.raises(UsageError) as caught:
        check(FetchJob(["results"], settings, store=""))  # --from-store, no store configured
    assert caught.value.code == "bad-store"


def _obj(key: str, size: int = 1, at: float = 0.0) -> Object:
    return Object(key, size, "", at)


def test_a_runs_objects_land_as_a_fetch_from_its_hosts_lays_them_out() -> None:
    found = [
        _obj("snapshot_e10.pt", at=1),
        _obj("snapshot_e20.pt", at=2),
        _obj("metrics.jsonl"),
        _obj("sub/events.out.tfevents.1"),
        _obj(".vmrun/log"),
        _obj(".vmrun/run.json"),
        _obj(".vmrun/started"),
        _obj(".vmrun/workers/x.log"),
    ]
    local = {o.key: path for o, path in _wanted(found, "r1", ["results"], 1, (), ())}
    assert local == {
        "snapshot_e20.pt": "results/r1/snapshot_e20.pt",  # --latest 1
        "metrics.jsonl": "results/r1/metrics.jsonl",
        "sub/events.out.tfevents.1": "results/r1/sub/events.out.tfevents.1",
        ".vmrun/log": "results/r1/log",  # the record beside the outputs
        ".vmrun/run.json": "results/r1/run.json",
    }
    logs = {o.key for o, _ in _wanted(found, "r1", ["logs"], None, (), ())}
    assert logs == {".vmrun/log", ".vmrun/run.json"}
    some = {o.key for o, _ in _wanted(found, "r1", ["sub"], None, (), ())}
    assert some == {"sub/events.out.tfevents.1"}


class FakeS3:
    """list_objects_v2's pages and get_object's bodies from a dict; one object's ETag may
    be another content's (what arrives is not what the bucket says it holds)."""

    def __init__(self, objects: dict[str, bytes], lying: str = "") -> None:
        self.objects, self.lying = objects, lying

    def get_paginator(self, name: str) -> Any:
        fake = self

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                when = datetime(2026, 11, 1, tzinfo=timezone.utc)
                listed = []
                for key, body in fake.objects.items():
                    told = body + b"x" if fake.lying and key.endswith(fake.lying) else body
                    etag = f'"{hashlib.md5(told).hexdigest()}"'
                    if key.startswith(Prefix):
                        listed.append(
                            {"Key": key, "Size": len(body), "LastModified": when, "ETag": etag}
                        )
                return [{"Contents": listed}]

        return Pages()

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.objects[Key])}


def test_each_object_is_checked_on_arrival_and_a_second_fetch_moves_nothing(
    tmp_path: Path,
) -> None:
    s3 = FakeS3(
        {
            "runs/r1/snapshot.pt": b"s" * 5000,
            "runs/r1/.vmrun/log": b"epoch 1\n",
            "runs/r1/metrics.jsonl": b'{"epoch": 1}\n',
        },
        lying="metrics.jsonl",
    )
    place = parse_store("s3://bkt/runs/r1")
    got = fetch_run(s3, place, ["results"], tmp_path, Progress())
    assert sorted(got.fetched) == ["results/r1/log", "results/r1/snapshot.pt"]
    assert got.mismatched == ["results/r1/metrics.jsonl"], got.failed
    assert not (tmp_path / "results" / "r1" / "metrics.jsonl").exists()  # nothing half-true
    assert not list((tmp_path / "results" / "r1").glob(".*"))  # no temporary file left
    again = fetch_run(s3, place, ["results"], tmp_path, Progress())
    assert again.fetched == [] and again.unchanged == 2


def test_a_runs_record_and_the_newest_run_are_read_from_the_bucket() -> None:
    moto = pytest.importorskip("moto")
    import boto3

    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")
        for rid in ("r1", "r2"):
            s3.put_object(Bucket="bkt", Key=f"runs/{rid}/.vmrun/started", Body=b"1")
        body = json.dumps({"run_id": "r1", "store": "s3://bkt/runs/r1"})
        s3.put_object(Bucket="bkt", Key="runs/r1/.vmrun/run.json", Body=body)
        record = run_record(s3, parse_store("s3://bkt/runs/r1"))
        assert (record.run_id, record.store) == ("r1", "s3://bkt/runs/r1")
        with pytest.raises(UsageError) as caught:
            run_record(s3, parse_store("s3://bkt/runs/nope"))
        assert caught.value.code == "run-not-found" and "s3://bkt/runs" in str(caught.value)
        assert newest_run(s3, parse_store("s3://bkt/runs")) == "r2"


# -- `vmrun fetch` of a run whose files its hosts lack: from its bucket copy ---------------

BUCKET_RUN = {"runs/r1/snapshot.pt": b"s" * 100, "runs/r1/.vmrun/run.json": b"{}"}


@pytest.fixture
def two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """r1 ran on accA (which copies it to s3://bkt/runs/r1) and accB, both answering; each
    node's download is `downloads[node]` (a Report); the bucket is a FakeS3 of BUCKET_RUN."""
    from fake_group import run_on_two_nodes_one_down

    import vmrun.stores.bucket
    import vmrun.transfer.download
    from vmrun.backends.hosts import records
    from vmrun.transfer.types import Report

    group = run_on_two_nodes_one_down(tmp_path, monkeypatch)
    group.down.clear()
    meta = {
        "nodes": ["accA", "accB"],
        "master": "accA",
        "workdir": "w",
        "template": True,
        "store": "s3://bkt/runs/r1",
        "store_node": "accA",
    }
    monkeypatch.setattr(
        records,
        "list_runs",
        lambda conn, ids=(): [
            records.RunRecord("r1", conn.label, record=RunRecord.from_json(meta))
            for r in ids or ["r1"]
            if r == "r1"
        ],
    )
    group.downloads = {n: Report(n, fetched=[f"results/r1/{n}/log"]) for n in ("accA", "accB")}
    monkeypatch.setattr(
        vmrun.transfer.download,
        "download",
        lambda conn, specs, dest, *a, **k: group.downloads[conn.label],
    )
    monkeypatch.setattr(vmrun.transfer.download, "listed", lambda conn, specs, dest, *a: {})
    group.bucket = FakeS3(dict(BUCKET_RUN))
    monkeypatch.setattr(vmrun.stores.bucket, "client", lambda access: group.bucket)
    return group


def _fetch(tmp_path: Path, **settings: Any) -> tuple[Any, Any]:
    from vmrun.config import load_settings
    from vmrun.operations.fetch import FetchJob, fetch
    from vmrun.reporting import Recorder

    said = Recorder()
    job = FetchJob(
        ["results"],
        load_settings(settings, cwd=tmp_path, environ={"HOME": str(tmp_path)}),
        run="r1",
        to=str(tmp_path),
    )
    return fetch(job, said), said


def test_a_run_its_copying_node_lacks_comes_from_the_bucket_its_record_names(
    two_nodes: Any, tmp_path: Path
) -> None:
    from vmrun.transfer.types import Report

    two_nodes.downloads["accA"] = Report("accA", missing=["results of run r1"])
    fetched, said = _fetch(tmp_path)
    assert [o.host for o in fetched.outcomes] == ["accB", "s3://bkt/runs/r1"]  # accA's place
    assert fetched.exit_code == 0
    assert (tmp_path / "results" / "r1" / "snapshot.pt").read_bytes() == b"s" * 100
    ((kind, text),) = said.said
    assert kind == "info" and "not found on accA" in text and "from the bucket" in text


def test_a_run_whose_hosts_do_not_answer_comes_from_the_bucket_its_fetched_record_names(
    two_nodes: Any, tmp_path: Path
) -> None:
    two_nodes.down.update({"accA", "accB"})
    (tmp_path / "results" / "r1").mkdir(parents=True)
    (tmp_path / "results" / "r1" / "run.json").write_text('{"store": "s3://bkt/runs/r1"}')
    fetched, _ = _fetch(tmp_path)
    assert [o.host for o in fetched.outcomes] == ["s3://bkt/runs/r1"]
    assert fetched.exit_code == 0 and (tmp_path / "results" / "r1" / "snapshot.pt").is_file()


def test_with_no_record_anywhere_the_projects_store_is_where_the_run_is_looked_for(
    two_nodes: Any, tmp_path: Path
) -> None:
    from vmrun.errors import ExitCode

    two_nodes.down.update({"accA", "accB"})
    two_nodes.bucket.objects = {"other/r1/snapshot.pt": b"x"}
    fetched, _ = _fetch(tmp_path, store="s3://bkt/runs")
    (bucket,) = fetched.outcomes  # asked of the bucket, which does not have it
    assert bucket.host == "s3://bkt/runs/r1" and bucket.value.missing == ["results of run r1"]
    assert fetched.exit_code == ExitCode.REMOTE


def test_a_run_not_copied_to_a_bucket_is_not_looked_for_there(
    two_nodes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vmrun.stores.bucket
    from vmrun.backends.hosts import records
    from vmrun.errors import ExitCode, HostsFailed
    from vmrun.transfer.types import Report

    def no_bucket(access: Any) -> Any:
        raise AssertionError("the bucket was asked")

    monkeypatch.setattr(vmrun.stores.bucket, "client", no_bucket)
    meta = {"nodes": ["accA"], "master": "accA", "workdir": "w", "template": True}
    monkeypatch.setattr(
        records,
        "list_runs",
        lambda conn, ids=(): (
            [records.RunRecord("r1", conn.label, record=RunRecord.from_json(meta))]
            if conn.label == "accA"
            else []
        ),
    )
    two_nodes.downloads["accA"] = Report("accA", missing=["results of run r1"])
    fetched, said = _fetch(tmp_path, store="s3://bkt/runs")  # its record names no store
    assert [o.host for o in fetched.outcomes] == ["accA"] and said.said == []
    assert fetched.exit_code == ExitCode.REMOTE
    two_nodes.down.add("accA")  # no record reached, no copy known: the hosts' failure
    with pytest.raises(HostsFailed):
        _fetch(tmp_path)
