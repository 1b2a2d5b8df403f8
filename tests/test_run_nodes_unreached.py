"""A run's recorded node that does not answer is named, and the exit status says the work
is incomplete: `stop`, `logs` and `fetch` on a two-node run whose second host is down (a
fake host group, in process: no sshd)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_group import FakeGroup, run_on_two_nodes_one_down

from vmrun.backends.hosts import records
from vmrun.cli.main import run as cli
from vmrun.errors import ExitCode
from vmrun.ssh.connection import Connection

NODES = ["accA", "accB"]


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGroup:
    return run_on_two_nodes_one_down(tmp_path, monkeypatch)


def test_find_run_names_the_recorded_node_that_did_not_answer(group: FakeGroup) -> None:
    rid, found, unreached = records.find_run(group, "r1")
    assert rid == "r1" and [rec.host for _, rec in found] == ["accA"]
    assert list(unreached) == ["accB"]


def test_stop_names_the_unreached_node_and_does_not_exit_0(
    group: FakeGroup, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped = []

    def stop(conn: Connection, run_id: str, **kwargs: Any) -> records.StopResult:
        stopped.append(conn.label)
        return records.StopResult(conn.label, run_id, (11, 12), (), ())

    monkeypatch.setattr(records, "stop", stop)
    code = cli(["stop", "r1"])
    err = capsys.readouterr()
    assert stopped == ["accA"]
    assert "accA: stopped run r1" in err.out
    assert code == ExitCode.UNREACHABLE
    assert "accB" in err.err and "not stopped" in err.err


def test_logs_names_the_unreached_node_and_does_not_exit_0(
    group: FakeGroup, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(records, "log_times", lambda conn, rid: [(1, 5.0)])
    monkeypatch.setattr(records, "read_log", lambda conn, rid, out, **k: out.output(b"hi\n"))
    code = cli(["logs", "r1"])
    err = capsys.readouterr()
    assert "hi" in err.out
    assert code == ExitCode.UNREACHABLE
    assert "accB" in err.err and "no log" in err.err


def test_fetch_names_the_unreached_node_and_does_not_exit_0(
    group: FakeGroup, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import vmrun.runs.outputs
    import vmrun.transfer.download
    from vmrun.transfer.types import Report

    fetched = []

    def download(conn: Connection, specs: Any, dest: Path, *a: Any) -> Report:
        fetched.append(conn.label)
        return Report(conn.label)

    monkeypatch.setattr(vmrun.runs.outputs, "specs_for", lambda *a, **k: [])
    monkeypatch.setattr(vmrun.transfer.download, "download", download)
    code = cli(["fetch", "metrics", "--run", "r1"])
    err = capsys.readouterr().err
    assert fetched == ["accA"]
    assert code == ExitCode.UNREACHABLE
    assert "accB" in err and "no files fetched" in err


def test_fetch_of_an_unknown_run_is_a_usage_error_like_logs_and_stop(group: FakeGroup) -> None:
    group.down.clear()  # every host answers, none has the run
    for argv in (["fetch", "--run", "r9"], ["logs", "r9"], ["stop", "r9"]):
        assert cli(argv) == ExitCode.USAGE, argv


def test_the_backends_stop_raises_naming_the_unreached_node(
    group: FakeGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `sweep` calls on Ctrl-C: the reachable node is stopped, the other one named."""
    from vmrun.backends.api import stopped_everywhere
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.errors import HostsFailed

    stopped = []

    def stop(conn: Connection, run_id: str, **kwargs: Any) -> records.StopResult:
        stopped.append(conn.label)
        return records.StopResult(conn.label, run_id, (11,), (), ())

    monkeypatch.setattr(records, "stop", stop)
    backend = HostsBackend(group)  # type: ignore[arg-type]
    ref = backend.find("r1")
    with pytest.raises(HostsFailed) as failed:
        stopped_everywhere(ref, backend.stop(ref))
    assert stopped == ["accA"] and list(failed.value.failures) == ["accB"]
    assert failed.value.exit_code == ExitCode.UNREACHABLE
