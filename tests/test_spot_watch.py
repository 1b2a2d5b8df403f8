"""The spot watcher (vmrun/hostside/spot_watch.py) against the STAND-IN metadata service
(tests/standins/imds.py: IMDS exists only on EC2) on loopback, quick: a rebalance
recommendation gets the ranks SIGUSR1 and the watch goes on; an interruption notice is
recorded, said in the run's log and gets the ranks SIGUSR2; torchrun's agent is never
signalled; a host with no metadata service ends the watch at once, saying nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

ROOT = Path(__file__).resolve().parents[1]
WATCH = ROOT / "vmrun" / "hostside" / "spot_watch.py"
IMDS = ROOT / "tests" / "standins" / "imds.py"

# a "rank": notes the signals it gets; an "agent" above it that a SIGUSR1/2 would end
RANK = """
import signal, sys, time
out = open(sys.argv[1], "a", buffering=1)
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, lambda n, _f: out.write(signal.Signals(n).name + "\\n"))
while True:
    time.sleep(0.05)
"""
AGENT = """
import os, subprocess, sys, time
env = {**os.environ, "LOCAL_RANK": "0"}
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env, start_new_session=True)
while True:
    time.sleep(0.05)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes], Path]]:
    """A run's record with a supervising shell (sh) over an agent over one rank; yields
    the record, the shell, and the file the rank notes its signals in."""
    rec, got = tmp_path / "rec", tmp_path / "signals"
    rec.mkdir()
    (rec / "log").write_text("")
    script = f'exec {sys.executable} -c "$0" "$1" "$2"'
    shell = subprocess.Popen(
        ["sh", "-c", f"{script} & wait", AGENT, RANK, str(got)], start_new_session=True
    )
    stat = Path(f"/proc/{shell.pid}/stat").read_text().rsplit(")", 1)[1].split()
    (rec / "pid_start").write_text(stat[19] + "\n")
    try:
        wait_for(lambda: len(_below(shell.pid)) == 2, 10, "the agent and its rank")
        yield rec, shell, got
    finally:
        for pid in _below(shell.pid):
            os.kill(pid, signal.SIGKILL)
        shell.kill()
        shell.wait()


def _below(top: int) -> list[int]:
    found, todo = [], [top]
    while todo:
        parent = todo.pop()
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError):
                    continue
                if ppid == parent:
                    found.append(int(p.name))
                    todo.append(int(p.name))
    return found


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    port = _port()
    state, log = tmp_path / "imds.json", tmp_path / "imds.log"
    state.write_text("{}")
    server = subprocess.Popen(
        [sys.executable, str(IMDS), "127.0.0.1", str(port), str(state), str(log)],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"listening\n"
        yield f"http://127.0.0.1:{port}", state, log
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def _watch(rec: Path, pid: int, url: str) -> Iterator[subprocess.Popen[bytes]]:
    """The watcher on the run; killed by PID on the way out if it has not ended."""
    env = {**os.environ, "VMRUN_IMDS": url, "VMRUN_SPOT_EVERY": "0.1"}
    watcher = subprocess.Popen([sys.executable, str(WATCH), str(rec), str(pid)], env=env)
    try:
        yield watcher
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()


def test_a_rebalance_asks_a_snapshot_and_a_notice_stops_the_ranks_never_the_agent(
    run: tuple[Path, subprocess.Popen[bytes], Path], metadata: tuple[str, Path, Path]
) -> None:
    rec, shell, got = run
    url, state, requests = metadata
    with _watch(rec, shell.pid, url) as watcher:
        state.write_text(json.dumps({"rebalance": {"noticeTime": "2026-11-29T10:00:00Z"}}))
        wait_for(lambda: got.is_file() and "SIGUSR1" in got.read_text(), 10, "SIGUSR1")
        assert watcher.poll() is None  # it goes on watching
        action = {"action": "terminate", "time": "2026-11-29T10:02:00Z"}
        state.write_text(json.dumps({"instance-action": action}))
        assert watcher.wait(timeout=10) == 0  # the notice is its last word
    wait_for(lambda: "SIGUSR2" in got.read_text(), 10, "SIGUSR2")
    assert got.read_text().splitlines() == ["SIGUSR1", "SIGUSR2"]  # each once
    assert len(_below(shell.pid)) == 2  # the agent lives: it was never signalled
    notice = json.loads((rec / "notice").read_text())
    assert notice["action"] == "terminate" and notice["kind"] == "interruption"
    said = (rec / "log").read_text()
    assert said.count("vmrun: spot rebalance recommendation") == 1
    assert "vmrun: spot interruption notice (terminate at 2026-11-29T10:02:00Z)" in said
    assert "SIGUSR2 to 1 rank(s)" in said
    assert requests.read_text().splitlines()[0].startswith("PUT /latest/api/token ok")


def test_no_metadata_service_ends_the_watch_at_once_saying_nothing(
    run: tuple[Path, subprocess.Popen[bytes], Path],
) -> None:
    rec, shell, _ = run
    started = time.monotonic()
    with _watch(rec, shell.pid, f"http://127.0.0.1:{_port()}") as watcher:  # nothing listens
        assert watcher.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert (rec / "log").read_text() == "" and not (rec / "notice").exists()


def test_the_watch_ends_with_the_run(
    run: tuple[Path, subprocess.Popen[bytes], Path], metadata: tuple[str, Path, Path]
) -> None:
    rec, shell, _ = run
    url, _, requests = metadata
    with _watch(rec, shell.pid, url) as watcher:
        wait_for(
            lambda: requests.is_file() and "instance-action" in requests.read_text(),
            10,
            "the watch",
        )
        (rec / "exit_code").write_text("0\n")
        assert watcher.wait(timeout=10) == 0
