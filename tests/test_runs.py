"""runs: detached runs on a real sshd test host survive disconnects and stop completely."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from conftest import Client, wait_for
from testbed import NetnsBed, TestHost

from vmrun.backends.hosts import records as runs
from vmrun.errors import UsageError
from vmrun.reporting import QUIET, Recorder
from vmrun.results.record import Launch, RunRecord
from vmrun.ssh.connection import Connection


def run_members(host: TestHost, run_id: str) -> list[int]:
    """Live processes of the host user whose environment carries the run's id."""
    members = []
    for pid in host.user_pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"VMRUN_RUN_ID={run_id}".encode() in environ:
            members.append(pid)
    return members


@pytest.fixture
def h1(bed: NetnsBed) -> TestHost:
    return bed["h1"]


def test_a_run_finishes_and_records_its_exit_code(bed_client: Client, h1: TestHost) -> None:
    with Connection("h1", bed_client.settings()) as conn:
        runs.start(
            conn,
            "ok-1",
            ".",
            ["sh", "-c", "echo one; echo two; echo epoch 2/2"],
            RunRecord(launch=Launch(name="ok")),
        )
        shown = Recorder()
        runs.follow(conn, "ok-1", shown)
        runs.start(conn, "bad-1", ".", ["sh", "-c", "echo oops >&2; exit 7"], RunRecord())
        runs.follow(conn, "bad-1", QUIET)
        records = {r.id: r for r in runs.list_runs(conn)}
    assert shown.data == b"one\ntwo\nepoch 2/2\n"
    assert records["ok-1"].state == "done" and records["ok-1"].exit_code == 0
    assert records["ok-1"].progress == "epoch 2/2"
    assert records["bad-1"].state == "failed" and records["bad-1"].exit_code == 7
    assert (h1.home / ".vmrun" / "runs" / "bad-1" / "log").read_text() == "oops\n"


def test_a_run_survives_its_connection_and_the_log_has_every_line(
    bed_client: Client, h1: TestHost
) -> None:
    script = 'i=0; while [ $i -lt 120 ]; do echo "line $i"; i=$((i+1)); sleep 0.02; done'
    conn = Connection("h1", bed_client.settings())
    runs.start(conn, "survivor-1", ".", ["sh", "-c", script], RunRecord())
    wait_for(
        lambda: (h1.home / ".vmrun/runs/survivor-1/log").stat().st_size > 0,
        10,
        "the first log line",
    )
    conn.close()  # the client goes away mid-run
    with Connection("h1", bed_client.settings()) as again:
        shown = Recorder()
        runs.follow(again, "survivor-1", shown)
        (record,) = runs.list_runs(again, ["survivor-1"])
    assert shown.data == b"".join(f"line {i}\n".encode() for i in range(120))
    assert record.state == "done"


def test_stop_kills_torchrun_and_its_workers_in_their_own_sessions(
    bed_client: Client, h1: TestHost, host_python: Path
) -> None:
    worker = h1.home / "sleepy.py"
    worker.write_text(
        "import os, time\nprint('worker', os.environ['LOCAL_RANK'], flush=True)\ntime.sleep(600)\n"
    )
    argv = [
        str(host_python),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(worker),
    ]
    with Connection("h1", bed_client.settings()) as conn:
        runs.start(conn, "sleepy-1", ".", argv, RunRecord(), env={"OMP_NUM_THREADS": "1"})
        # torchrun + 2 workers (each in a session of its own); the run's agent, in a session
        # apart from its command's, carries no run id (it outlives a stop for its last pass)
        wait_for(lambda: len(run_members(h1, "sleepy-1")) >= 3, 60, "torchrun's two workers")
        sessions = {
            Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[3]
            for p in run_members(h1, "sleepy-1")
        }
        assert len(sessions) >= 3  # so a process-group kill alone would miss workers
        outcome = runs.stop(conn, "sleepy-1", grace=5)
        (record,) = runs.list_runs(conn, ["sleepy-1"])
    assert outcome.left == ()
    assert len(outcome.signalled) >= 3
    assert run_members(h1, "sleepy-1") == []
    assert record.state == "stopped" and record.exit_code == 143


def test_stop_kills_a_child_that_cleared_its_environment(bed_client: Client, h1: TestHost) -> None:
    """A process without the run's id in its environment is still in the command's session
    (REC/session: the agent starts its command in a session of its own)."""
    log = h1.home / ".vmrun/runs/bare-1/log"
    child = None
    try:
        with Connection("h1", bed_client.settings()) as conn:
            runs.start(
                conn, "bare-1", ".", ["sh", "-c", "env -i sleep 600 & echo $!; wait"], RunRecord()
            )
            wait_for(lambda: log.read_text().strip().isdigit(), 10, "the child's pid")
            child = int(log.read_text())
            leader = int((h1.home / ".vmrun/runs/bare-1/session").read_text().split()[0])
            assert b"VMRUN_RUN_ID" not in Path(f"/proc/{child}/environ").read_bytes()
            session = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[3]
            assert session == str(leader)
            outcome = runs.stop(conn, "bare-1", grace=5)
        assert child in outcome.signalled and outcome.left == ()
        wait_for(lambda: not Path(f"/proc/{child}").exists(), 10, "the child to be gone")
    finally:  # whatever failed above, nothing of the run stays on the shared host
        for pid in run_members(h1, "bare-1") + ([child] if child else []):
            with contextlib.suppress(OSError):  # gone already; the pid check avoids reuse
                if pid != child or Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00":
                    os.kill(pid, signal.SIGKILL)


def test_stop_escalates_to_sigkill(bed_client: Client, h1: TestHost) -> None:
    with Connection("h1", bed_client.settings()) as conn:
        runs.start(
            conn,
            "stubborn-1",
            ".",
            ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"],
            RunRecord(),
        )
        wait_for(
            lambda: b"ready" in (h1.home / ".vmrun/runs/stubborn-1/log").read_bytes(),
            10,
            "the run to start",
        )
        outcome = runs.stop(conn, "stubborn-1", grace=1)
    assert outcome.killed and outcome.left == ()
    assert run_members(h1, "stubborn-1") == []


def test_unknown_run_and_bad_ids(bed_client: Client) -> None:
    with Connection("h1", bed_client.settings()) as conn:
        with pytest.raises(UsageError) as unknown:
            runs.stop(conn, "nope-1")
        assert unknown.value.code == "run-not-found" and "nope-1" in unknown.value.message
        with pytest.raises(UsageError, match="bad run id"):
            runs.list_runs(conn, ["../etc"])


@pytest.fixture(autouse=True)
def _clean_runs(bed: NetnsBed):
    yield
    import shutil

    shutil.rmtree(bed["h1"].home / ".vmrun" / "runs", ignore_errors=True)
    (bed["h1"].home / "sleepy.py").unlink(missing_ok=True)


def test_every_run_is_listed_however_many_and_durations_use_the_hosts_clock(
    bed_client: Client, h1: TestHost
) -> None:
    """200 records of 2 KiB each: more than any output tail keeps."""
    import json
    import os
    import shutil

    base = h1.home / ".vmrun" / "runs"
    ids = [f"bulk-{i:03d}" for i in range(200)]
    try:
        for rid in ids:
            (base / rid).mkdir(parents=True)
            (base / rid / "run.json").write_text(json.dumps({"started": 1.0, "pad": "x" * 2048}))
            (base / rid / "exit_code").write_text("0\n")
            (base / rid / "pid").write_text("1\n")
            os.utime(base / rid / "pid", (1_700_000_000, 1_700_000_000))
            os.utime(base / rid / "exit_code", (1_700_000_090, 1_700_000_090))
        with Connection("h1", bed_client.settings()) as conn:
            listed = [r for r in runs.list_runs(conn) if r.id.startswith("bulk-")]
        assert [r.id for r in listed] == ids
        assert {r.duration for r in listed} == {90.0}  # pid to exit_code, both host times
        assert all(r.state == "done" for r in listed)
    finally:
        for rid in ids:
            shutil.rmtree(base / rid, ignore_errors=True)
