"""`vmrun stop` on a real sshd test host: a run that ignores SIGTERM is killed all the same."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

from conftest import Client, run_pids, wait_for
from testbed import NetnsBed

from vmrun.backends.hosts import records
from vmrun.errors import ExitCode
from vmrun.results.record import RunRecord
from vmrun.ssh.connection import Connection

STUBBORN = "trap '' TERM; echo ready; while :; do sleep 0.1; done"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def test_stop_of_a_run_that_ignores_sigterm_needs_sigkill_and_leaves_nothing(
    bed: NetnsBed, bed_client: Client
) -> None:
    h1 = bed["h1"]
    rid = "stubborn-20250101-000000-abcd"
    pids: list[int] = []
    try:
        with Connection("h1", bed_client.settings()) as conn:
            records.start(conn, rid, ".", ["sh", "-c", STUBBORN], RunRecord())
        log = h1.home / ".vmrun/runs" / rid / "log"
        wait_for(lambda: log.exists() and b"ready" in log.read_bytes(), 10, "the run to start")
        pids = run_pids(h1, rid)
        assert pids
        stopped = bed_client.vmrun("stop", rid, "-H", "h1", "--grace", "1")
        assert stopped.returncode == 0, stopped.stderr
        assert f"h1: stopped run {rid}: " in stopped.stdout, stopped.stdout
        assert "needed SIGKILL; none left" in stopped.stdout, stopped.stdout
        assert all(_gone(pid) for pid in pids), [p for p in pids if not _gone(p)]
        assert run_pids(h1, rid) == []
    finally:
        for pid in run_pids(h1, rid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(h1.home / ".vmrun" / "runs", ignore_errors=True)


def test_stop_names_a_node_of_the_run_that_does_not_answer_and_exits_unreachable(
    bed: NetnsBed, bed_client: Client
) -> None:
    """A two-node run whose second host is cut off: the first is stopped, the second is
    named (its processes may still hold its GPUs) and the exit status is not 0."""
    h1, h2 = bed["h1"], bed["h2"]
    rid = "pair-20250101-000000-abcd"
    meta = {"nodes": ["h1", "h2"], "master": "h1"}
    try:
        for name in ("h1", "h2"):
            with Connection(name, bed_client.settings()) as conn:
                records.start(
                    conn, rid, ".", ["sh", "-c", "echo ready; sleep 600"], RunRecord.from_json(meta)
                )
        for host in (h1, h2):
            wait_for(lambda host=host: run_pids(host, rid), 10, f"the run on {host.name}")
        h2.cut_link()
        stopped = bed_client.vmrun(
            "stop", rid, "-H", "h1", "-H", "h2", "--grace", "1", "--connect-timeout", "2"
        )
        assert stopped.returncode == ExitCode.UNREACHABLE, stopped.stderr
        assert f"h1: stopped run {rid}: " in stopped.stdout, stopped.stdout
        assert "h2: did not answer" in stopped.stderr and "not stopped" in stopped.stderr
        assert run_pids(h1, rid) == [] and run_pids(h2, rid)  # h2's goes on, as said
    finally:
        h2.heal_link()
        for host in (h1, h2):
            for pid in run_pids(host, rid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(host.home / ".vmrun" / "runs", ignore_errors=True)
