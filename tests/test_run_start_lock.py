"""Two starts at once on one host (quick tier): the busy check and the start hold one lock on
the host (vmrun/hostside/run_start.sh), so of two `vmrun train`s that both passed the
preflight, exactly one starts and the other gets the preflight's refusal. The host script
runs here by sh against a home of its own, driven by `records.start` through a stand-in
connection that runs each command locally instead of over SSH."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import install_hostlib, local_argv, wait_for

from vmrun.backends.hosts import records
from vmrun.backends.hosts.preflight import check_not_busy
from vmrun.errors import UsageError, exit_code_for
from vmrun.results.record import RunRecord
from vmrun.ssh.result import CommandResult

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


class LocalHost:
    """STAND-IN for a Connection: runs the argv here, as the host's user, in `home`; a barrier
    lets several starts begin at the same moment."""

    def __init__(self, home: Path, barrier: threading.Barrier | None = None) -> None:
        self.label = "local"
        self.home = home
        self.barrier = barrier

    def run(
        self, argv: Sequence[str], *, env: dict[str, str] | None = None, what: str | None = None
    ) -> CommandResult:
        if self.barrier is not None:
            self.barrier.wait(10)
        environ = {"HOME": str(self.home), "PATH": "/usr/bin:/bin", **(env or {})}
        started = time.monotonic()
        done = subprocess.run(
            local_argv(argv, self.home),
            env=environ,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return CommandResult(
            self.label,
            tuple(argv),
            done.returncode,
            done.stdout,
            done.stderr,
            time.monotonic() - started,
        )

    def capture(
        self, command: str, *, stdin: bytes = b"", what: str = ""
    ) -> tuple[int, bytes, str]:
        environ = {"HOME": str(self.home), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            ["sh", "-c", command],
            env=environ,
            cwd=self.home,
            input=stdin,
            capture_output=True,
            timeout=60,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr.decode()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A home whose runs are all stopped afterwards (each run's pid leads its own session)."""
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    install_hostlib(home)
    yield home
    for pid_file in home.glob(".vmrun/runs/*/pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def _ended(pid_file: Path) -> bool:
    """The pid names no process, or a zombie (its state letter after the command's name)."""
    try:
        stat = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _start_at_once(home: Path, ids: list[str], alone: bool) -> dict[str, object]:
    barrier = threading.Barrier(len(ids))
    got: dict[str, object] = {}

    def start(rid: str) -> None:
        conn = LocalHost(home, barrier)
        try:
            got[rid] = records.start(conn, rid, "work", ["sleep", "60"], RunRecord(), alone=alone)  # type: ignore[arg-type]
        except UsageError as exc:
            got[rid] = exc

    threads = [threading.Thread(target=start, args=(rid,)) for rid in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return got


def test_of_two_starts_at_once_exactly_one_starts_the_other_gets_the_preflights_refusal(
    home: Path,
) -> None:
    ids = ["a-20260101-000000-0001", "b-20260101-000000-0002", "c-20260101-000000-0003"]
    got = _start_at_once(home, ids, alone=True)
    started = [rid for rid, value in got.items() if isinstance(value, records.Started)]
    refused = {rid: value for rid, value in got.items() if isinstance(value, UsageError)}
    assert len(started) == 1 and len(refused) == len(ids) - 1, got
    (winner,) = started
    listed = records.list_runs(LocalHost(home))  # type: ignore[arg-type]
    assert [r.id for r in listed if r.state == records.RunState.RUNNING] == [winner]
    with pytest.raises(UsageError) as preflight:
        check_not_busy(LocalHost(home), allow_concurrent=False, listed=listed)  # type: ignore[arg-type]
    assert preflight.value.code == "host-busy" and winner in preflight.value.message
    for error in refused.values():  # the start's own refusal says the same, with the same code
        assert (error.message, error.hint) == (preflight.value.message, preflight.value.hint)
        assert error.code == "host-busy" and exit_code_for(error) == 2
    # nothing of a refused run is left on the host
    assert sorted(p.name for p in (home / ".vmrun/runs").iterdir() if p.is_dir()) == [winner]


def test_allow_concurrent_starts_both_and_a_resumed_run_does_not_refuse_itself(
    home: Path,
) -> None:
    ids = ["a-20260101-000000-0001", "b-20260101-000000-0002"]
    got = _start_at_once(home, ids, alone=False)
    assert all(isinstance(value, records.Started) for value in got.values()), got
    with pytest.raises(UsageError):  # a third, alone, while both run
        records.start(
            LocalHost(home), "c-20260101-000000-0003", "work", ["true"], RunRecord(), alone=True
        )  # type: ignore[arg-type]
    for pid_file in home.glob(".vmrun/runs/b-*/pid"):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    # a SIGKILL is delivered, not yet done, when kill returns: a loaded machine may take a
    # while to schedule the death (the host's rule counts a zombie as ended)
    wait_for(lambda: all(_ended(p) for p in home.glob(".vmrun/runs/b-*/pid")), 30, "b's end")
    first = int((home / ".vmrun" / "runs" / ids[0] / "pid").read_text())
    try:
        again = records.start(
            LocalHost(home),
            ids[0],
            "work",
            ["sleep", "60"],
            RunRecord(),  # type: ignore[arg-type]
            resume=True,
            alone=True,
        )
        assert isinstance(again, records.Started)
    finally:  # the first attempt's session: its pid file is the resumed attempt's now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first, signal.SIGKILL)


def test_a_run_whose_exit_code_is_written_does_not_refuse_the_next(home: Path) -> None:
    """Between a run's shell writing its exit code and exiting, the preflight already sees
    it ended: the start's own check agrees (a sweep's next size is not refused)."""
    first = "a-20260101-000000-0001"
    records.start(LocalHost(home), first, "work", ["sleep", "60"], RunRecord(), alone=True)  # type: ignore[arg-type]
    (home / ".vmrun/runs" / first / "exit_code").write_text("0\n")  # its shell still lives
    nxt = records.start(
        LocalHost(home),
        "b-20260101-000000-0002",
        "work",
        ["true"],
        RunRecord(),  # type: ignore[arg-type]
        alone=True,
    )
    assert isinstance(nxt, records.Started)
