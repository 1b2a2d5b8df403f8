"""Run records across attempts and under load, on real sshd test hosts: what `status` shows
as progress comes from the latest attempt only; a resumed multi-node run is followed from
its new attempt (a separator first, never the old attempt's lines); `stop` keeps its grace
by the clock on a host with many processes."""

from __future__ import annotations

import shutil
import time

import pytest
from conftest import Client, wait_for
from testbed import NetnsBed, TestHost

from vmrun.backends.hosts import records
from vmrun.backends.hosts.nodes import follow_nodes
from vmrun.reporting import QUIET, Recorder
from vmrun.results.record import RunRecord
from vmrun.ssh.connection import Connection

EPOCHS = 'i=$1; while [ "$i" -le "$2" ]; do echo "epoch $i/$3 loss 0.1"; i=$((i+1)); done'


@pytest.fixture(autouse=True)
def _clean_runs(bed: NetnsBed):
    yield
    for name in ("h1", "h2"):
        shutil.rmtree(bed[name].home / ".vmrun" / "runs", ignore_errors=True)
        shutil.rmtree(bed[name].home / "out", ignore_errors=True)


def _start(
    conn: Connection,
    rid: str,
    script: str,
    *args: str,
    resume: bool = False,
    banner: str = "",
    meta: dict | None = None,
) -> records.Started:
    argv = ["sh", "-c", script, "x", *args]
    return records.start(
        conn, rid, ".", argv, RunRecord.from_json(meta or {}), resume=resume, banner=banner
    )


def _progress(conn: Connection, rid: str) -> str:
    (record,) = records.list_runs(conn, [rid])
    return record.progress


def test_progress_is_the_latest_attempts_own(bed_client: Client) -> None:
    """A resumed attempt that trains nothing shows no progress (not the last attempt's
    `epoch 40/40`); one that trains shows its own last epoch line."""
    with Connection("h1", bed_client.settings()) as conn:
        _start(conn, "p-1", EPOCHS, "1", "40", "40")
        records.follow(conn, "p-1", QUIET)
        assert _progress(conn, "p-1") == "epoch 40/40"
        _start(
            conn,
            "p-1",
            "echo 'resumed from snapshot at epoch 41'; echo nothing to train",
            resume=True,
        )
        records.follow(conn, "p-1", QUIET, skip=40)
        assert _progress(conn, "p-1") == ""
        _start(conn, "p-1", EPOCHS, "21", "25", "200", resume=True)
        records.follow(conn, "p-1", QUIET)
        (record,) = records.list_runs(conn, ["p-1"])
    assert record.progress == "epoch 25/200" and record.attempt == 3


def test_progress_comes_from_the_attempts_metrics_before_its_log(
    bed_client: Client, bed: NetnsBed
) -> None:
    """metrics.jsonl in the run's output folder, written during this attempt, wins over log
    lines (which a script may word as it likes); the template's total comes from its args."""
    write = 'for e in 1 2 3 4 5 6 7; do echo "{\\"epoch\\": $e}" >> out/metrics.jsonl; done'
    meta = {"out_dir": "out", "template": True, "args": ["200", "10"]}
    with Connection("h1", bed_client.settings()) as conn:
        _start(conn, "m-1", f"mkdir -p out; echo 'epoch 2/9 of a sub-task'; {write}", meta=meta)
        records.follow(conn, "m-1", QUIET)
        assert _progress(conn, "m-1") == "epoch 7/200"


def test_a_resumed_multi_node_run_is_followed_from_its_new_attempt(
    bed_client: Client, bed: NetnsBed
) -> None:
    """The earlier attempt's lines are skipped on every node (they were once replayed as
    live output), and the new attempt opens with its separator line."""
    old = 'i=0; while [ $i -lt 8 ]; do echo "old line $i"; i=$((i+1)); done; echo boom >&2; exit 3'
    new = "echo new line 1; echo new line 2"
    banner = "--- attempt 2, resumed from epoch 21 (snapshot.pt) ---"
    conns = [Connection(h, bed_client.settings()) for h in ("h1", "h2")]
    try:
        for conn in conns:
            _start(conn, "r-1", old)
            records.follow(conn, "r-1", QUIET)
        skip = {c.label: _start(c, "r-1", new, resume=True, banner=banner).log_lines for c in conns}
        assert set(skip.values()) == {9}
        shown = Recorder()
        follow_nodes(conns, "r-1", shown, skip=skip)
    finally:
        for conn in conns:
            conn.close()
    text = shown.data.decode()
    assert "old line" not in text and "boom" not in text
    for host in ("h1", "h2"):
        assert f"[{host}] {banner}\n" in text
        assert f"[{host}] new line 1\n[{host}] new line 2\n" in text or (
            f"[{host}] new line 1" in text and f"[{host}] new line 2" in text
        )
    log = (bed["h1"].home / ".vmrun/runs/r-1/log").read_text()
    assert log.index("old line 7") < log.index(banner) < log.index("new line 1")


def test_stop_keeps_its_grace_by_the_clock_among_many_processes(
    bed_client: Client, bed: NetnsBed
) -> None:
    """600 other processes of the host's user: stop reads the whole process table three
    times, not once per tick of its wait (which made a 3 s grace last a minute)."""
    h1: TestHost = bed["h1"]
    crowd = "i=0; while [ $i -lt 600 ]; do sleep 600 & i=$((i+1)); done; echo up; wait"
    stubborn = "trap '' TERM; echo ready; while :; do sleep 0.1; done"
    with Connection("h1", bed_client.settings()) as conn:
        _start(conn, "crowd-1", crowd)
        try:
            wait_for(lambda: len(h1.user_pids()) >= 600, 120, "600 sleeping processes")
            _start(conn, "stubborn-2", stubborn)
            log = h1.home / ".vmrun/runs/stubborn-2/log"
            wait_for(lambda: b"ready" in log.read_bytes(), 30, "the stubborn run to start")
            began = time.monotonic()
            outcome = records.stop(conn, "stubborn-2", grace=3)
            took = time.monotonic() - began
        finally:
            records.stop(conn, "crowd-1", grace=1)
    assert outcome.killed and outcome.left == ()
    # The grace is 3 s of wall-clock time; the bound is grace + 2 s. The margin here
    # is 4 s (one round trip, three table reads and the KILL's wait on a loaded 2-core
    # machine); before, each 0.1 s tick re-read 600 environments with two processes each.
    assert 3.0 <= took < 3.0 + 4.0, took
