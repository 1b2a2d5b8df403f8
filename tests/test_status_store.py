"""`vmrun status --store`: the runs a bucket keeps, as their copies there say (quick tier:
moto's S3 in this process, fakes for the hosts): each run's state from its record's
objects, one listing and only the small record objects read, an end an earlier attempt
left not taken for this one's, a copy long quiet with no end lost (never running), a run
the hosts list too shown once as they see it, a bucket out of reach a place that did
not answer, by its code; an unchanged object not read again, --last read only the newest,
an object gone since the listing absent, and the dashboard's bucket listed once a minute
with its credentials found once (without boto3, a note)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vmrun.backends.select import Listed
from vmrun.errors import RemoteError
from vmrun.results.record import RunRecord
from vmrun.runs.state import RunState
from vmrun.runs.store_runs import QUIET_S, BucketRun, _run, list_runs
from vmrun.store_url import parse_store
from vmrun.stores.bucket import Object

T0 = 1_700_000_000.0
STORE = parse_store("s3://bkt/runs")


class Counting:
    """An S3 client that counts what it is asked (a listing's pages, each object read)."""

    def __init__(self, s3: Any) -> None:
        self.s3, self.listings, self.read = s3, 0, []

    def get_paginator(self, name: str) -> Any:
        self.listings += 1
        return self.s3.get_paginator(name)

    def get_object(self, **kw: Any) -> Any:
        self.read.append(kw["Key"])
        return self.s3.get_object(**kw)


def _meta(rid: str, **more: Any) -> bytes:
    keys = {"run_id": rid, "started": T0, "template": True, "args": ["10"], "host": "h1"}
    return json.dumps({**keys, "hosts": ["h1"], "store": f"s3://bkt/runs/{rid}", **more}).encode()


def test_a_buckets_runs_are_listed_from_their_records_in_one_listing() -> None:
    moto = pytest.importorskip("moto")
    import boto3

    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")
        objects = {
            "r1/.vmrun/run.json": _meta("r1", price_per_hour=2.0, currency="EUR"),
            "r1/.vmrun/attempt": b"1\n",
            "r1/.vmrun/exit_code": b"0\n",
            "r1/.vmrun/log": b"epoch 1/10\n" * 1000,
            "r1/.vmrun/versions.json": b'{"python": "3.11.2", "torch": "2.13.0"}\n',
            "r1/metrics.jsonl": b"".join(b'{"epoch": %d}\n' % e for e in range(1, 11)),
            "r1/snapshot.pt": b"x" * 100000,
            "r2/.vmrun/run.json": _meta("r2"),
            "r2/.vmrun/exit_code": b"3\n",
            "r2/.vmrun/failure.json": b'{"node": "h1", "rank": 1, "exit": 3}\n',
            "r3/.vmrun/run.json": _meta("r3"),
            "r3/.vmrun/stopped": b"user\n",
            "r4/.vmrun/run.json": _meta("r4"),
            "r4/metrics.jsonl": b'{"epoch": 4}\n',
            "r5/.vmrun/started": b"1700000000\n",  # its first copy not there yet
        }
        for key, body in objects.items():
            s3.put_object(Bucket="bkt", Key=f"runs/{key}", Body=body)
        counted = Counting(s3)
        found = {r.id: r for r in list_runs(counted, STORE)}
    assert sorted(found) == ["r1", "r2", "r3", "r4"]
    assert counted.listings == 1  # one listing; then the record objects alone
    assert not [k for k in counted.read if k.endswith(("snapshot.pt", "/log", "/started"))]
    r1, r2, r3, r4 = (found[r] for r in ("r1", "r2", "r3", "r4"))
    assert isinstance(r1.record, RunRecord) and r1.record.store == "s3://bkt/runs/r1"
    assert (r1.state, r1.exit_code, r1.progress) == (RunState.DONE, 0, "epoch 10/10")
    assert r1.versions == {"python": "3.11.2", "torch": "2.13.0"} and r1.host == "s3://bkt/runs"
    assert r1.ended is not None and r1.duration == r1.ended - T0
    assert r2.state == RunState.FAILED and r2.failure is not None and r2.failure.rank == 1
    assert r3.state == RunState.STOPPED and r3.stopped_by == "user"
    # no end in its copy, the copy just made: running, as the copy says
    assert r4.state == RunState.RUNNING and "as its bucket copy said" in r4.reason
    assert r4.progress == "epoch 4/10" and r4.exit_code is None

    from vmrun.operations.status_runs import run_objects

    objs = {o["run"]: o for o in run_objects(list(found.values()))}
    one = objs["r1"]
    assert (one["hosts"], one["cluster"], one["bucket"]) == (None, None, "s3://bkt/runs/r1")
    assert (one["state"], one["exit"], one["epochs_done"], one["epochs_asked"]) == (
        "done",
        0,
        10,
        10,
    )
    assert one["cost"]["currency"] == "EUR" and one["cost"]["amount"] > 0
    assert one["store"]["state"] == "copied" and one["store"]["behind_s"] is None
    assert one["record"]["run_id"] == "r1" and one["versions"]["torch"] == "2.13.0"
    assert objs["r2"]["error"]["code"] == "run-failed" and objs["r2"]["exit"] == 3
    assert objs["r3"]["error"]["code"] == "run-stopped"


def _obj(key: str, at: float) -> Object:
    return Object(key, 2, "", at)


def test_an_earlier_attempts_end_and_a_quiet_copy_are_not_this_runs_end() -> None:
    meta = _meta("r1").decode()
    resumed = {  # attempt 2 began at T0+600; attempt 1's exit code stays in the bucket
        ".vmrun/run.json": _obj(".vmrun/run.json", T0 + 600),
        ".vmrun/attempt": _obj(".vmrun/attempt", T0 + 600),
        ".vmrun/exit_code": _obj(".vmrun/exit_code", T0 + 100),
        ".vmrun/failure.json": _obj(".vmrun/failure.json", T0 + 100),
        ".vmrun/log": _obj(".vmrun/log", T0 + 900),
    }
    failure = '{"node": "h1", "rank": 1, "exit": 3}'
    texts = {"run.json": meta, "attempt": "2\n", "exit_code": "75\n", "failure.json": failure}
    run = _run("r1", resumed, texts, STORE, "s3://bkt/runs", now=T0 + 930)
    assert (run.state, run.exit_code, run.attempts) == (RunState.RUNNING, None, 2)
    assert run.failure is None  # attempt 1's
    assert run.duration == 930.0  # so far, from its record's start
    quiet = _run("r1", resumed, texts, STORE, "s3://bkt/runs", now=T0 + 900 + QUIET_S + 1)
    assert quiet.state == RunState.LOST and quiet.duration is None
    assert quiet.reason == "no end in its bucket copy, quiet for 30 min"
    ended = {**resumed, ".vmrun/exit_code": _obj(".vmrun/exit_code", T0 + 1000)}
    done = _run("r1", ended, {**texts, "exit_code": "0\n"}, STORE, "", now=T0 + 99999)
    assert (done.state, done.ended, done.reason) == (RunState.DONE, T0 + 1000, "")


def _bucket_run(rid: str, exit_code: int | None) -> BucketRun:
    record = RunRecord.from_json(json.loads(_meta(rid)))
    return BucketRun(
        rid, "s3://bkt/runs", STORE.join(rid), record, T0 + 50, T0 + 60, exit_code, T0 + 50
    )


def _host_run(rid: str) -> Any:
    from vmrun.backends.hosts.records import RunRecord as HostRun
    from vmrun.stores.sync import StoreState

    record = RunRecord.from_json(json.loads(_meta(rid)))
    state = StoreState(f"s3://bkt/runs/{rid}", "ok", T0 + 30, synced=T0 + 30)
    return HostRun(rid, "h1", record, alive=True, began=T0, host_now=T0 + 40, store=state)


def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project here whose store is s3://bkt/runs and whose one host is h1."""
    (tmp_path / "vmrun.toml").write_text('store = "s3://bkt/runs"\n\n[[hosts]]\naddress = "h1"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VMRUN_HOSTS", raising=False)


@pytest.fixture
def places(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """The hosts (one running run, r1) and the bucket (r1 and r0, both done), faked; what
    each was asked."""
    import vmrun.backends.select as select
    import vmrun.runs.store_runs as store_runs
    import vmrun.stores.access as access
    import vmrun.stores.bucket as bucket

    asked: dict[str, Any] = {"hosts": 0, "bucket": None, "fail": None}

    def hosts(target: Any, settings: Any, watchdog: bool = True) -> Listed:
        asked["hosts"] += 1
        return Listed([_host_run("r1")], [], {})

    def in_bucket(s3: Any, store: Any, shown: str = "", **kw: Any) -> list[BucketRun]:
        asked["bucket"] = str(store)
        if asked["fail"] is not None:
            raise asked["fail"]
        return [_bucket_run("r0", 0), _bucket_run("r1", 0)]

    monkeypatch.setattr(select, "list_runs_on", hosts)
    monkeypatch.setattr(store_runs, "list_runs", in_bucket)
    monkeypatch.setattr(bucket, "client", lambda access: object())
    monkeypatch.setattr(access, "resolve", lambda mode="auto": None)
    _project(tmp_path, monkeypatch)
    return asked


def test_a_run_on_the_hosts_and_in_the_bucket_is_shown_once_as_the_hosts_see_it(
    places: dict[str, Any],
) -> None:
    from vmrun.config import load_settings
    from vmrun.operations.status import gather

    settings = load_settings({})
    found = gather(settings, store="")  # the project's hosts and vmrun.toml's store
    assert places["hosts"] == 1 and places["bucket"] == "s3://bkt/runs"
    runs = {r["run"]: r for r in found.runs()}
    assert sorted(runs) == ["r0", "r1"] and not found.errors
    live = runs["r1"]  # the host's live view; the bucket's copy state, where it is kept
    assert (live["state"], live["hosts"], live["bucket"]) == ("running", ["h1"], "s3://bkt/runs/r1")
    assert live["store"]["state"] == "ok"
    gone = runs["r0"]
    assert (gone["state"], gone["hosts"], gone["bucket"]) == ("done", None, "s3://bkt/runs/r0")

    alone = gather(settings, store="s3://bkt/other", places=False)  # the hosts not asked
    assert places["hosts"] == 1 and places["bucket"] == "s3://bkt/other"
    assert [r["run"] for r in alone.runs()] == ["r0", "r1"]
    assert {r["state"] for r in alone.runs()} == {"done"}


def test_a_bucket_that_does_not_answer_is_a_place_with_its_code(
    places: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from vmrun.cli.main import run
    from vmrun.errors import exit_code_for

    places["fail"] = RemoteError("s3://bkt/runs: refused", code="store-denied")
    code = run(["status", "--json", "--from-store"])
    assert places["hosts"] == 0  # --from-store alone: the bucket's runs
    assert code == exit_code_for(places["fail"]) != 0
    (obj,) = json.loads(capsys.readouterr().out)
    assert obj["run"] is None and obj["bucket"] == "s3://bkt/runs"
    assert obj["error"]["code"] == "store-denied"


def test_a_bucket_out_of_reach_is_said_by_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on port 1 here: boto3's own failure, as vmrun says it."""
    pytest.importorskip("boto3")
    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for key, value in {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    code = run(["status", "--json", "--store", "s3://bkt/runs"])
    out, err = capsys.readouterr()
    (obj,) = json.loads(out)
    assert obj["bucket"] == "s3://bkt/runs" and obj["error"]["code"] == "store-unreachable"
    assert code == obj["error"]["exit_status"] != 0 and "store-unreachable" in err


def test_the_dashboard_lists_the_store_and_says_a_bucket_only_run_needs_its_hosts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import vmrun.operations.status as status
    import vmrun.runs.store_runs as store_runs
    import vmrun.stores.access as access
    import vmrun.stores.bucket as bucket
    from vmrun.config import load_settings
    from vmrun.dashboard.views import Views
    from vmrun.errors import UsageError
    from vmrun.operations.status import Status
    from vmrun.reporting import Recorder

    (tmp_path / "vmrun.toml").write_text('store = "s3://bkt/runs"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    asked: list[Any] = []

    def gather(settings: Any, **kw: Any) -> Status:
        asked.append(kw["store"])
        return Status([_bucket_run("r0", 0)])

    monkeypatch.setattr(status, "gather", gather)
    views = Views(load_settings({}))
    (run,) = views.runs()["runs"]
    assert asked == ["s3://bkt/runs"] and run["bucket"] == "s3://bkt/runs/r0"
    for act in (views.stop, views.stacks):
        with pytest.raises(UsageError) as caught:
            act("r0")
        said = f"{caught.value} {caught.value.hint}"
        assert "only in its bucket" in said
        assert "fetch results --store s3://bkt/runs --run r0" in said
    fetched: list[Any] = []
    monkeypatch.setattr(views, "_fetch_metrics", lambda rid, place: fetched.append(place))
    views.metrics("r0")  # from the bucket, never the hosts
    assert fetched == [{"store": "s3://bkt/runs"}]
    monkeypatch.setattr(bucket, "client", lambda access: object())
    monkeypatch.setattr(access, "resolve", lambda mode="auto": None)
    monkeypatch.setattr(store_runs, "read_log", lambda s3, place: b"epoch 1/10\n")
    out = Recorder()
    assert "as its bucket copy holds it" in views.follow("r0")(out)
    assert out.data == b"epoch 1/10\n"


def test_a_buckets_run_in_the_table_names_its_store_copy_and_cost() -> None:
    from vmrun.cli.status_cmd import _rows

    record = RunRecord.from_json(json.loads(_meta("r0", master="h1", price_per_hour=3.6)))
    run = BucketRun("r0", "s3://bkt/runs", STORE.join("r0"), record, T0 + 50, T0 + 60, 0, T0 + 50)
    quiet = BucketRun("r9", "s3://bkt/runs", STORE.join("r9"), record, T0, T0 + QUIET_S * 4)
    (row, lost) = _rows([run, quiet], {}, stores=True, costs=True)
    assert row[:3] == ("r0", "s3://bkt/runs", "done") and row[-2:] == ("in the bucket", "$0.05")
    assert lost[2] == "lost (no end in its bucket copy, quiet for 2 h)" and lost[5] == "-"


def test_a_bucket_only_runs_page_in_a_browser(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runs page names the run's place in its bucket; its page names how to fetch its
    files, and its stacks button says it needs the hosts."""
    pytest.importorskip("aiohttp")
    import asyncio

    from aiohttp.test_utils import TestServer
    from browser import chromium

    import vmrun.operations.status as status
    from vmrun.config import load_settings
    from vmrun.dashboard.access import Access
    from vmrun.dashboard.app import make_app
    from vmrun.dashboard.views import Views
    from vmrun.operations.status import Status

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(status, "gather", lambda settings, **kw: Status([_bucket_run("r0", 0)]))
    views = Views(load_settings({}), store="s3://bkt/runs")
    monkeypatch.setattr(views, "follow", lambda rid: lambda out: "ended")
    monkeypatch.setattr(views, "metrics", lambda rid: {"run": rid, "metrics": {}, "note": None})

    async def main() -> None:
        access = Access()
        server = TestServer(make_app(views, access), host="127.0.0.1")
        await server.start_server()
        try:
            async with chromium(tmp_path) as page:
                await page.call("Page.navigate", url=f"{server.make_url('/')}?token={access.token}")
                cell = "document.querySelector(`tr[data-run='r0']`)"
                got = await page.until(
                    f"{cell} && [...{cell}.children].map((c) => c.textContent)", 20, "the row"
                )
                assert got[1:3] == ["s3://bkt/runs/r0", "done"], got
                await page.value("location.hash = '#/run/r0'")
                files = await page.until(
                    "[...document.querySelectorAll('#provenance dd')].map((d) => d.textContent)"
                    ".find((t) => t.startsWith('vmrun fetch'))",
                    20,
                    "how to fetch its files",
                )
                assert files == "vmrun fetch results --store s3://bkt/runs --run r0"
                await page.value("document.getElementById('stacks-button').click()")
                note = await page.until(
                    "(() => { const t = document.getElementById('action-note').textContent;"
                    " return t.includes('only in its bucket') && t; })()",
                    20,
                    "the stacks button's answer",
                )
                assert note.startswith("stacks: run r0 is only in its bucket"), note
        finally:
            await server.close()

    asyncio.run(main())


def _bucket(s3: Any, runs: int, shards: int) -> None:
    """`runs` runs, each started a minute after the one before, ended, with its metrics and
    `shards` checkpoint objects."""
    s3.create_bucket(Bucket="bkt")
    for i in range(runs):
        rid = f"r{i:02d}"
        with moto_time(T0 + 60 * i):
            for key, body in {
                ".vmrun/started": b"1\n",
                ".vmrun/run.json": _meta(rid, started=T0 + 60 * i),
                ".vmrun/attempt": b"1\n",
                ".vmrun/exit_code": b"0\n",
                ".vmrun/log": b"epoch 1/10\n",
                "metrics.jsonl": b'{"epoch": 10}\n',
                **{f"checkpoints/epoch_{n}/shard_{n}.pt": b"x" for n in range(shards)},
            }.items():
                s3.put_object(Bucket="bkt", Key=f"runs/{rid}/{key}", Body=body)


def moto_time(at: float) -> Any:
    """moto stamps an object's LastModified with the clock: this one."""
    import datetime as dt
    from unittest import mock

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return dt.datetime.fromtimestamp(at, tz)

        @classmethod
        def utcnow(cls) -> Any:
            return dt.datetime.fromtimestamp(at, dt.timezone.utc).replace(tzinfo=None)

    import moto.s3.models as models

    return mock.patch.object(models.datetime, "datetime", Clock)


def test_an_unchanged_run_is_not_read_again_and_last_reads_only_the_newest() -> None:
    moto = pytest.importorskip("moto")
    import boto3

    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        _bucket(s3, runs=12, shards=30)
        counted, bodies = Counting(s3), {}  # type: ignore[var-annotated]
        first = list_runs(counted, STORE, bodies=bodies)
        assert len(first) == 12 and len(counted.read) == 12 * 4  # run.json, attempt, end, metrics
        counted.read.clear()
        again = list_runs(counted, STORE, bodies=bodies)
        assert counted.read == []  # nothing changed: nothing read
        assert [(r.id, r.state, r.progress) for r in again] == [
            (r.id, r.state, r.progress) for r in first
        ]
        s3.put_object(Bucket="bkt", Key="runs/r03/metrics.jsonl", Body=b'{"epoch": 11}\n')
        list_runs(counted, STORE, bodies=bodies)
        assert counted.read == ["runs/r03/metrics.jsonl"]  # what changed, alone
        counted.read.clear()
        older: list[str] = []
        newest = list_runs(counted, STORE, last=3, left_out=older)
    assert [r.id for r in newest] == ["r09", "r10", "r11"]
    assert sorted(older) == [f"r{i:02d}" for i in range(9)]
    assert {k.split("/")[1] for k in counted.read} == {"r09", "r10", "r11"}


def test_an_object_gone_between_the_listing_and_its_reading_is_absent() -> None:
    moto = pytest.importorskip("moto")
    import boto3

    class Vanishing(Counting):
        gone = ("runs/r2/.vmrun/failure.json", "runs/r3/.vmrun/run.json")

        def get_object(self, **kw: Any) -> Any:
            if kw["Key"] in self.gone:
                self.s3.delete_object(Bucket=kw["Bucket"], Key=kw["Key"])
            return super().get_object(**kw)

    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")
        for key, body in {
            "r1/.vmrun/run.json": _meta("r1"),
            "r1/.vmrun/exit_code": b"0\n",
            "r2/.vmrun/run.json": _meta("r2"),
            "r2/.vmrun/exit_code": b"3\n",
            "r2/.vmrun/failure.json": b'{"node": "h1", "rank": 1, "exit": 3}\n',
            "r3/.vmrun/run.json": _meta("r3"),
        }.items():
            s3.put_object(Bucket="bkt", Key=f"runs/{key}", Body=body)
        found = {r.id: r for r in list_runs(Vanishing(s3), STORE)}
    assert sorted(found) == ["r1", "r2"]  # r3's record went: it is not there
    assert found["r1"].state == RunState.DONE
    assert found["r2"].state == RunState.FAILED and found["r2"].failure is None


def test_a_client_is_of_its_own_session_never_boto3s_shared_one() -> None:
    pytest.importorskip("boto3")
    import boto3

    from vmrun.stores.access import Access
    from vmrun.stores.bucket import client

    boto3.DEFAULT_SESSION = None
    client(Access("k", "s"))
    assert boto3.DEFAULT_SESSION is None  # the shared session, not thread-safe, not made


def _hosts_with_no_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """The project's store and one host, faked, with no runs: how often it was asked."""
    import vmrun.backends.select as select

    asked: list[int] = []
    monkeypatch.setattr(
        select, "list_runs_on", lambda *a, **kw: asked.append(1) or Listed([], [], {})
    )
    _project(tmp_path, monkeypatch)
    return asked


def test_the_dashboard_lists_its_bucket_once_a_minute_with_one_credentials_lookup(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    moto = pytest.importorskip("moto")
    import boto3

    import vmrun.dashboard.views as views_module
    import vmrun.stores.access as access
    from vmrun.config import load_settings
    from vmrun.dashboard.views import Views

    hosts = _hosts_with_no_runs(monkeypatch, tmp_path)
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}.items():
        monkeypatch.setenv(key, value)
    resolved: list[str] = []
    real = access.resolve
    monkeypatch.setattr(access, "resolve", lambda mode="auto": resolved.append(mode) or real(mode))
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        _bucket(s3, runs=2, shards=1)
        views = Views(load_settings({}))
        first = views.runs()
        assert [r["run"] for r in first["runs"]] == ["r00", "r01"] and not first["unreached"]
        s3.put_object(Bucket="bkt", Key="runs/r02/.vmrun/run.json", Body=_meta("r02"))
        assert [r["run"] for r in views.runs()["runs"]] == ["r00", "r01"]  # the minute's
        assert views._bucket is not None
        views._bucket._at -= 30
        shown = views.runs()
        assert any("as listed 30 s ago" in n for n in shown["notes"]), shown["notes"]
        views._bucket._at -= views_module.BUCKET_EVERY_S
        assert sorted(r["run"] for r in views.runs()["runs"]) == ["r00", "r01", "r02"]
    assert resolved == ["auto"]  # the credentials found once for the dashboard's life
    assert len(hosts) == 4  # the hosts, each time


def test_without_boto3_the_projects_store_is_a_note_and_an_asked_store_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from vmrun.cli.main import run
    from vmrun.config import load_settings
    from vmrun.dashboard.views import Views

    _hosts_with_no_runs(monkeypatch, tmp_path)
    monkeypatch.setitem(sys.modules, "boto3", None)  # the `aws` extra not installed
    shown = Views(load_settings({})).runs()
    assert shown["runs"] == [] and shown["unreached"] == []
    assert shown["notes"] == [
        "s3://bkt/runs: its runs are not read without pip install 'vmrun[aws]'"
    ]
    code = run(["status", "--json", "--store", "s3://bkt/runs"])
    (obj,) = json.loads(capsys.readouterr().out)
    assert code != 0 and obj["bucket"] == "s3://bkt/runs" and obj["error"]["code"] == "bad-store"
    views = Views(load_settings({}), store="s3://bkt/runs")  # asked for: as the CLI says it
    assert views.runs()["unreached"][0]["error"]["code"] == "bad-store"
