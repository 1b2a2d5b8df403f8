"""Setup's reboot counts only once the host answers from a new boot (its boot_id changed):
a status query that times out on a loaded host is no proof. Quick tier: a fake connection
that answers as the host would."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from vmrun.errors import CommandFailed, ConnectionLostError, ExitCode, RemoteError
from vmrun.reporting import HostSteps
from vmrun.setup import reboot as reboot_mod
from vmrun.setup.hostlog import HostLog
from vmrun.ssh.result import CommandResult

OLD, NEW = "0b1e5f3c-old", "7a2d9c41-new"


class _Host:
    """Answers the reboot's launch with its boot_id, then each status query from `answers`:
    a boot_id, or an exception (a query that timed out, a dropped connection)."""

    label = "acc1"

    def __init__(self, answers: Iterator[str | BaseException]):
        self.answers = answers
        self.closed = 0

    def run(self, argv: list[str], **kw: object) -> CommandResult:
        if argv[1].endswith("/setup_reboot_launch.sh"):
            return CommandResult(self.label, tuple(argv), 0, f"{OLD}\n", "", 0.0)
        answer = next(self.answers)
        if isinstance(answer, BaseException):
            raise answer
        return CommandResult(self.label, tuple(argv), 0, f"{answer}\n", "", 0.0)

    def close(self) -> None:
        self.closed += 1

    def open(self) -> _Host:
        return self


def _slow_status() -> CommandFailed:
    return CommandFailed("'sh' timed out", host="acc1", exit_status=ExitCode.TIMEOUT)


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    real_sleep = time.sleep
    monkeypatch.setattr(reboot_mod.time, "sleep", lambda s: real_sleep(0.01))  # no back-off


class _Heard(HostSteps):
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def event(self, host: str, text: str) -> None:
        self.events.append(text)


def _forever(first: list[str | BaseException], then: str) -> Iterator[str | BaseException]:
    yield from first
    while True:
        yield then


def test_a_slow_status_on_the_old_boot_is_not_a_reboot() -> None:
    """A loaded host: the first status query times out, then the host answers, from the
    same boot, until the reboot wait is over: setup stops there, saying so in one line."""
    host = _Host(_forever([_slow_status()], OLD))
    events: list[str] = []
    log = HostLog("acc1", None, _Heard(events))
    with pytest.raises(RemoteError) as info:
        reboot_mod.reboot(host, {}, log, timeout=1.5)  # type: ignore[arg-type]
    assert info.value.exit_code == ExitCode.REMOTE and info.value.code == "reboot-failed"
    assert "1.5 s" in info.value.message and OLD in info.value.message
    assert not any(e.startswith("back after") for e in events), events


def test_the_reboot_counts_once_the_host_answers_from_a_new_boot() -> None:
    lost = ConnectionLostError("connection lost", host="acc1")
    host = _Host(_forever([OLD, _slow_status(), lost, OLD, NEW], NEW))
    events: list[str] = []
    log = HostLog("acc1", None, _Heard(events))
    reboot_mod.reboot(host, {}, log, timeout=30)  # type: ignore[arg-type]
    assert events[-1].startswith("back after"), events
    assert next(host.answers) == NEW  # it asked until the new boot answered, no further
    assert host.closed >= 2  # each silence: the connection is opened anew
