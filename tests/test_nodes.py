"""The merged log of a multi-node run: lines cut and prefixed per node; the failure rule's stops."""

from __future__ import annotations

import threading
import time

import pytest

from vmrun.backends.hosts import nodes, records
from vmrun.backends.hosts.nodes import Prefixer
from vmrun.errors import CommandFailed, ConnectionLostError, ExitCode, RemoteError
from vmrun.reporting import Recorder
from vmrun.ssh.result import CommandResult


def test_rank_prefixes_become_host_and_rank_and_partial_lines_wait() -> None:
    out = Recorder()
    p = Prefixer("gpu2", out)
    p.feed(b"[rank3]:epoch 1/5 loss 0.5\n[rank2]:hal")
    assert out.outputs == [b"[gpu2 rank3] epoch 1/5 loss 0.5\n"]
    p.feed(b"f a line\nW1123 torchrun says something\n")
    p.feed(b"no newline at the end")
    p.flush()
    assert out.outputs[1:] == [
        b"[gpu2 rank2] half a line\n",
        b"[gpu2] W1123 torchrun says something\n",
        b"[gpu2] no newline at the end\n",
    ]


# -- stops have a deadline: a host that never answers is named, not waited for ---------


class _Host:
    """A fake connection: answers a stop at once, or (`silent`) never answers at all,
    deadline or not (a channel that never opens)."""

    def __init__(self, label: str, *, silent: bool = False, honours_timeout: bool = True):
        self.label, self.silent, self.honours_timeout = label, silent, honours_timeout
        self.timeouts: list[float | None] = []
        self.argvs: list[object] = []

    def run(self, argv: object, *, timeout: float | None = None, **kw: object) -> CommandResult:
        self.timeouts.append(timeout)
        self.argvs.append(argv)
        if self.silent:
            if not self.honours_timeout:
                threading.Event().wait(3)  # the test's bound on "forever"
                raise ConnectionLostError("gave up at last", host=self.label)
            if timeout is None:
                threading.Event().wait(3)
                raise AssertionError(f"{self.label}: waited with no deadline")
            threading.Event().wait(timeout)  # as vmrun.ssh.channel does at its deadline
            raise CommandFailed("'sh' timed out", host=self.label, exit_status=ExitCode.TIMEOUT)
        out = "TERM 101\nLEFT \n"
        return CommandResult(self.label, ("sh",), 0, out, "", 0.01)

    def capture(self, command: str, **kw: object) -> tuple[int, bytes, str]:
        return 0, b"", ""


@pytest.fixture
def quick_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "STOP_KILL_S", 0.0, raising=False)
    monkeypatch.setattr(records, "STOP_MARGIN_S", 0.3, raising=False)
    monkeypatch.setattr(nodes, "STOP_SLACK_S", 0.2, raising=False)


def test_a_stop_the_host_never_confirms_fails_at_its_deadline(quick_stops: None) -> None:
    host = _Host("accB", silent=True)
    started = time.monotonic()
    with pytest.raises(CommandFailed) as info:
        records.stop(host, "r1", grace=0.1)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2
    assert host.timeouts == [pytest.approx(0.4)]  # grace + the KILL loop + the margin
    assert info.value.exit_status == ExitCode.TIMEOUT and info.value.host == "accB"
    assert info.value.code == "stop-unconfirmed" and "0.4 s" in info.value.message


def test_the_failure_rule_names_a_node_that_never_confirms_its_stop(quick_stops: None) -> None:
    """The first node failed; of the others, accB stops its part and accC answers nothing
    at all (not even within its deadline): the rule still ends, naming accC in one line."""
    hosts = [_Host("accA"), _Host("accB"), _Host("accC", silent=True, honours_timeout=False)]
    first = nodes._Event("accA", error=RemoteError("boom", host="accA"))
    said = Recorder()
    started = time.monotonic()
    with pytest.raises(CommandFailed) as info:
        nodes._fail(hosts, "r1", first, "boom", [], said, 0.1)  # type: ignore[arg-type]
    assert time.monotonic() - started < 2.5  # the 3 s "forever" is not waited out
    assert info.value.code == "run-failed" and "node accA" in info.value.message
    (summary,) = [n for n in said.lines if "accC" in n]
    assert "accB stopped 1 process(es)" in summary
    assert "accC did not confirm the stop within 0.6 s" in summary, summary


def test_a_lost_master_is_not_said_to_have_failed_before_its_first_epoch(
    quick_stops: None,
) -> None:
    """The master (whose rank 0 reports the epochs) stopped answering: the worker's record
    shows no epoch, which says nothing of the master's. The hint says what is known, and
    the worker's stop is recorded as vmrun's own (`failure`), not the user's."""
    hosts = [_Host("accA"), _Host("accB")]
    first = nodes._Event("accA", error=ConnectionLostError("silent", host="accA"))
    with pytest.raises(CommandFailed) as info:
        nodes._fail(hosts, "r1", first, "its host stopped answering", [], Recorder(), 0.1)  # type: ignore[arg-type]
    assert "before its first epoch" not in (info.value.hint or "")
    assert "--resume r1" in (info.value.hint or "") and "accA" in (info.value.hint or "")
    (stop, *_) = hosts[1].argvs
    assert list(stop)[-1] == "failure"  # type: ignore[call-overload]
    assert hosts[0].argvs == []  # nothing asked of the lost node
