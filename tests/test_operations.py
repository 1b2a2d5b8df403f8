"""What the CLI does, called as a library user would: vmrun.operations' functions on a fake
host group (accA answers, accB is down), with a Recorder for what they say. Each returns a
value: what was done, and the nodes that did not answer, without printing anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_group import FakeGroup, run_on_two_nodes_one_down

from vmrun.backends.hosts import records
from vmrun.config import Settings, load_settings
from vmrun.errors import ExitCode, UnreachableError, UsageError
from vmrun.reporting import Recorder
from vmrun.ssh.connection import Connection

NODES = ["accA", "accB"]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGroup:
    return run_on_two_nodes_one_down(tmp_path, monkeypatch)


def test_stop_returns_what_it_stopped_and_the_node_it_could_not(
    group: FakeGroup, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.stop import stop

    def stop_one(conn: Connection, run_id: str, **kwargs: Any) -> records.StopResult:
        return records.StopResult(conn.label, run_id, (11, 12), (12,), ())

    monkeypatch.setattr(records, "stop", stop_one)
    said = Recorder()
    stopped = stop(settings, "r1", grace=0.0, out=said)
    assert stopped.run_id == "r1"
    assert [(o.host, o.value and o.value.killed) for o in stopped.outcomes] == [("accA", 1)]
    assert list(stopped.ref.unreached) == ["accB"]
    assert stopped.exit_code == ExitCode.UNREACHABLE
    assert said.said == [] and not said.data  # the value says it all


def test_status_gather_returns_rows_and_the_host_that_failed(
    group: FakeGroup, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.status import gather

    monkeypatch.setattr(Connection, "open", lambda self: None)  # the fake's hosts never dial
    found = gather(settings, hosts=NODES, watchdog=False, out=Recorder())
    assert [(r.id, r.host) for r in found.records] == [("r1", "accA")]
    assert [(type(f.error), f.host) for f in found.errors] == [(UnreachableError, "accB")]
    assert found.autostop == {}


def test_fetch_returns_each_nodes_report_and_the_node_not_fetched_from(
    group: FakeGroup, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import vmrun.runs.outputs
    import vmrun.transfer.download
    from vmrun.operations.fetch import FetchJob, fetch
    from vmrun.transfer.types import Report

    def download(conn: Connection, specs: Any, dest: Path, *a: Any) -> Report:
        return Report(conn.label, fetched=["results/r1/metrics.jsonl"])

    monkeypatch.setattr(vmrun.runs.outputs, "specs_for", lambda *a, **k: [])
    monkeypatch.setattr(vmrun.transfer.download, "download", download)
    fetched = fetch(FetchJob(["metrics"], settings, run="r1", to=str(tmp_path)), Recorder())
    assert fetched.ref is not None and fetched.ref.run_id == "r1"
    assert [r.host for r in fetched.reports] == ["accA"]
    assert group.calls[-1] == ("accA",)  # the download: only the run's nodes that answered
    assert list(fetched.ref.unreached) == ["accB"]
    assert fetched.exit_code == ExitCode.UNREACHABLE


def test_fetch_of_an_unknown_run_raises_run_not_found(group: FakeGroup, settings: Settings) -> None:
    from vmrun.operations.fetch import FetchJob, fetch

    group.down.clear()
    with pytest.raises(UsageError) as refused:
        fetch(FetchJob(["metrics"], settings, run="r9"))
    assert refused.value.code == "run-not-found"


def test_a_runs_log_goes_to_the_reporters_output(
    group: FakeGroup, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.logs import run_log

    monkeypatch.setattr(records, "log_times", lambda conn, rid: [(1, 5.0)])
    monkeypatch.setattr(records, "read_log", lambda conn, rid, out, **k: out.output(b"hi\n"))
    said = Recorder()
    with run_log(settings, "r1") as log:
        log.read(said)
    assert b"hi" in said.data
    assert log.ref.nodes == ("accA",) and list(log.ref.unreached) == ["accB"]


def test_a_run_that_cannot_be_fetched_is_warned_of_and_left_out(
    tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.histories import gather

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VMRUN_HOSTS", raising=False)
    said = Recorder()
    with pytest.raises(UsageError):
        gather(["nope-1"], settings=lambda: settings, verb="report", out=said)
    ((kind, text),) = said.said
    assert kind == "warn" and "nope-1" in text and "no hosts, clusters or store" in text


def test_no_runs_here_says_that_runs_on_hosts_come_with_fetch(
    tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.histories import gather

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as refused:
        gather(None, settings=lambda: settings, verb="plot")
    assert refused.value.code == "run-not-found"
    assert "vmrun fetch" in str(refused.value.hint) and "vmrun plot RUN" in str(refused.value.hint)


def test_tensorboard_is_placed_on_a_node_of_the_run_that_answered(
    group: FakeGroup, settings: Settings
) -> None:
    from vmrun.operations.tensorboard import place

    with place(settings, "r1") as found:
        assert found.run_id == "r1" and found.conn.label == "accA"
        assert "accA" in found.fix  # how to install it there names that node


def test_a_bad_logdir_is_refused_before_any_connection() -> None:
    from vmrun.operations.tensorboard import check

    with pytest.raises(UsageError):
        check(["~other/logs"])
