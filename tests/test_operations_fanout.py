"""exec, autostop and watch-gpus called as a library user would: vmrun.operations' functions
on a fake host group where a host is down, with a Recorder. Each returns every host's result
and the hosts that failed as values, with the exit code the CLI would give."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fake_group import FakeGroup

from vmrun.autostop import watchdog
from vmrun.autostop.status import AutostopStatus
from vmrun.config import Settings, load_settings
from vmrun.errors import ExitCode, UnreachableError, UsageError, code_of
from vmrun.reporting import Recorder
from vmrun.ssh.connection import Connection
from vmrun.ssh.result import CommandResult

NODES = ["accA", "accB", "accC"]  # accC refuses connections


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGroup:
    import vmrun.ssh.group
    import vmrun.ssh.inventory

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VMRUN_HOSTS", raising=False)
    monkeypatch.chdir(tmp_path)
    fake = FakeGroup(NODES, tmp_path, down={"accC"})
    monkeypatch.setattr(vmrun.ssh.group, "Group", lambda entries, settings: fake)
    monkeypatch.setattr(vmrun.ssh.inventory, "select_hosts", lambda *a, **k: fake.entries)
    return fake


def _settings(tmp_path: Path, **flags: Any) -> Settings:
    return load_settings(flags, cwd=tmp_path, environ={"HOME": str(tmp_path)})


# -- exec ---------------------------------------------------------------------------------


def test_exec_returns_the_hosts_that_failed_and_the_worst_code(
    group: FakeGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.exec import run

    def fake_run(self: Connection, argv: Any, *, on_output: Any, **kwargs: Any) -> CommandResult:
        on_output("out", f"hi from {self.label}\n".encode())
        status = 3 if self.label == "accB" else 0
        return CommandResult(self.label, tuple(argv), status, "", "", 0.0)

    monkeypatch.setattr(Connection, "run", fake_run)
    said = Recorder()
    ran = run(["hostname"], _settings(tmp_path), NODES, out=said)
    failed = [(f.host, f.exit_status, type(f.error)) for f in ran.failures]
    assert failed == [("accB", 3, type(None)), ("accC", None, UnreachableError)]
    assert ran.exit_code == ExitCode.UNREACHABLE  # the worst: 12 beats accB's 3
    assert said.data.splitlines() == [b"hi from accA", b"hi from accB"]


def test_exec_hands_each_line_to_the_callers_writer_with_its_host(
    group: FakeGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.exec import run

    def fake_run(self: Connection, argv: Any, *, on_output: Any, **kwargs: Any) -> CommandResult:
        on_output("err", b"warning\n")
        return CommandResult(self.label, tuple(argv), 0, "", "", 0.0)

    monkeypatch.setattr(Connection, "run", fake_run)
    group.down.clear()
    lines: list[tuple[str, str, bytes]] = []
    ran = run(["true"], _settings(tmp_path), NODES, on_output=lambda *line: lines.append(line))
    assert ran.failures == [] and ran.exit_code == 0
    assert lines == [(host, "err", b"warning\n") for host in NODES]


# -- autostop -----------------------------------------------------------------------------


def test_autostop_status_has_a_value_per_host_and_the_unreachable_one_as_an_error(
    group: FakeGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.autostop import status

    def read(conn: Connection) -> AutostopStatus:
        return AutostopStatus(conn.label, installed=True, alive=True, period=1800.0)

    monkeypatch.setattr(watchdog, "read_status", read)
    found = status(_settings(tmp_path), NODES)
    assert [(o.host, o.value and o.value.period) for o in found.outcomes if o.ok] == [
        ("accA", 1800.0),
        ("accB", 1800.0),
    ]
    (down,) = [o for o in found.outcomes if not o.ok]
    assert down.host == "accC" and code_of(down.error) == "host-unreachable"
    assert found.exit_code == ExitCode.UNREACHABLE


def test_autostop_install_touches_no_host_when_one_fails_its_check(
    group: FakeGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.autostop import install

    installed: list[str] = []
    monkeypatch.setattr(watchdog, "check", lambda conn, cfg: "ok")
    monkeypatch.setattr(watchdog, "install", lambda conn, cfg: installed.append(conn.label))
    applied = install(_settings(tmp_path, autostop="30m"), NODES, required=True)
    assert applied.refused and applied.outcomes == [] and installed == []
    assert [o.host for o in applied.checked if not o.ok] == ["accC"]
    assert applied.exit_code == ExitCode.UNREACHABLE


def test_autostop_install_returns_what_each_host_got(
    group: FakeGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.autostop import install

    group.down.clear()
    monkeypatch.setattr(watchdog, "check", lambda conn, cfg: "ok")

    def done(conn: Connection, cfg: Any) -> watchdog.Installed:
        return watchdog.Installed(conn.label, "new", "new", "cron added", 7, "started")

    monkeypatch.setattr(watchdog, "install", done)
    applied = install(_settings(tmp_path, autostop="30m"), NODES, required=True)
    assert not applied.refused and applied.exit_code == 0
    assert [(o.host, o.value and o.value.pid) for o in applied.outcomes] == [(h, 7) for h in NODES]
    assert {label: cfg.period for label, cfg in applied.configs.items()} == dict.fromkeys(
        NODES, 1800.0
    )


def test_autostop_install_without_a_period_is_refused_before_any_connection(
    group: FakeGroup, tmp_path: Path
) -> None:
    from vmrun.operations.autostop import install

    with pytest.raises(UsageError) as raised:
        install(_settings(tmp_path), NODES, required=True)
    assert "accA" in raised.value.message
    assert group.calls == []
    assert install(_settings(tmp_path), NODES, required=False).configs == {}  # setup's way


def test_autostop_cancel_says_per_host_what_it_removed(
    group: FakeGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.autostop import cancel

    def gone(conn: Connection) -> watchdog.Cancelled:
        return watchdog.Cancelled(conn.label, ("its files",), (42,))

    monkeypatch.setattr(watchdog, "cancel", gone)
    cancelled = cancel(_settings(tmp_path), NODES)
    assert [o.value.killed for o in cancelled.outcomes if o.value] == [(42,), (42,)]
    assert [o.host for o in cancelled.outcomes if not o.ok] == ["accC"]
    assert cancelled.exit_code == ExitCode.UNREACHABLE


# -- watch-gpus ---------------------------------------------------------------------------


def test_a_gpu_snapshot_of_unreachable_hosts_says_so_per_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.gpus.fleet import HostState
    from vmrun.operations.gpus import watch
    from vmrun.ssh.hosts import HostSpec
    from vmrun.ssh.inventory import HostEntry

    def refuse(self: Connection) -> None:
        raise UnreachableError("connection refused", host=self.label)

    monkeypatch.setattr(Connection, "open", refuse)
    entries = [HostEntry(HostSpec(label)) for label in NODES[:2]]
    with watch(_settings(tmp_path), entries, once=True) as fleet_watch:
        assert fleet_watch is not None
        while not fleet_watch.finished:
            fleet_watch.drain(0.1)
        statuses = fleet_watch.fleet.statuses()
        assert [(s.sample.host, s.sample.state, s.sample.code) for s in statuses] == [
            (label, HostState.UNREACHABLE, "host-unreachable") for label in NODES[:2]
        ]
        assert fleet_watch.fleet.exit_code() == ExitCode.UNREACHABLE


def test_a_cluster_with_no_running_job_has_no_gpu_to_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vmrun.backends.slurm.gpus
    import vmrun.backends.slurm.session
    from vmrun.operations.gpus import watch

    @contextmanager
    def backend(settings: Settings, name: str) -> Iterator[object]:
        yield object()

    monkeypatch.setattr(vmrun.backends.slurm.session, "cluster_backend", backend)
    monkeypatch.setattr(vmrun.backends.slurm.gpus, "running_nodes", lambda *a: [])
    said = Recorder()
    with watch(_settings(tmp_path), cluster="hpc", run="r7", out=said) as fleet_watch:
        assert fleet_watch is None
    assert "no running run r7 on cluster hpc" in said.lines[0]


@pytest.mark.parametrize(
    ("given", "fact"),
    [
        ({"interval": 0.05}, "--interval"),
        ({"idle_threshold": 101}, "--idle-threshold"),
        ({"idle_window": -1}, "--idle-window"),
        ({"run": "r7"}, "add -C NAME"),
        ({"cluster": "hpc", "run": "r7", "job": "12"}, "use one"),
    ],
)
def test_watch_refuses_bad_input_before_any_connection(
    tmp_path: Path, given: dict[str, Any], fact: str
) -> None:
    from vmrun.operations.gpus import watch

    with pytest.raises(UsageError) as refused, watch(_settings(tmp_path), ["nowhere"], **given):
        pass
    assert fact in refused.value.message
