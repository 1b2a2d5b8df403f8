"""A run's own exit code: torchrun exits 1 whenever a worker fails, and its summary names the
worker that failed first (hostside/run_failure.py reads it; the fixtures are torch 2.13's
own output: rank 1 exiting 3, rank 1 killed by SIGKILL). And the one rule every reader of a
hosts run's record keeps: once exit_code is written the run has ended, though its shell
may still be telling the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vmrun import hostside
from vmrun.backends.hosts.records import RunRecord, parse_listing
from vmrun.backends.slurm.queue import JobState
from vmrun.backends.slurm.records import SlurmRun
from vmrun.operations.status_runs import run_objects
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord as Record
from vmrun.runs.state import RunState

SCRIPT = hostside.HERE / "run_failure.py"
FIXTURES = Path(__file__).parent / "fixtures" / "torchrun"


def _parse(tmp_path: Path, log: Path, rc: str = "1", *skip: str) -> tuple[str, dict | None]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), str(log), rc, *skip],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    found = tmp_path / "failure.json"
    return done.stdout.strip(), json.loads(found.read_text()) if found.exists() else None


def test_a_worker_s_exit_code_rank_and_host_from_torchrun_s_summary(tmp_path: Path) -> None:
    code, failure = _parse(tmp_path, FIXTURES / "exit3.log")
    assert code == "3"
    assert failure is not None
    assert (failure["rank"], failure["local_rank"], failure["exit"]) == (1, 1, 3)
    assert (failure["host"], failure["signal"], failure["launcher_exit"]) == ("localhost", None, 1)


def test_a_worker_killed_by_a_signal_is_128_plus_it(tmp_path: Path) -> None:
    code, failure = _parse(tmp_path, FIXTURES / "sigkill.log")
    assert code == "137"
    assert failure is not None and failure["signal"] == "SIGKILL" and failure["rank"] == 1


def test_only_this_attempt_counts(tmp_path: Path) -> None:
    """A resumed run's log holds an earlier attempt's summary: past log_start it is not read,
    and an earlier failure.json goes; torchrun's own code stays."""
    log = tmp_path / "log"
    earlier = (FIXTURES / "exit3.log").read_text()
    log.write_text(earlier + "resumed\nTraceback: torchrun could not start\n")
    (tmp_path / "failure.json").write_text("{}")
    code, failure = _parse(tmp_path, log, "1", str(len(earlier.splitlines())))
    assert (code, failure) == ("1", None)


def test_a_slurm_log_labelled_by_srun_takes_the_last_attempt_s_earliest_failure(
    tmp_path: Path,
) -> None:
    """srun --label puts `N: ` before each line; two nodes each print a summary; an earlier
    attempt (before the last \\035vmrun attempt mark) is not read."""

    def labelled(text: str, task: int, when: str, rank: int, code: int) -> str:
        text = text.replace("2026-11-28_21:27:02", when)
        text = text.replace("rank      : 1 (", f"rank      : {rank} (")
        text = text.replace("exitcode  : 3 (pid", f"exitcode  : {code} (pid")
        return "".join(f"{task}: {line}\n" for line in text.splitlines())

    one = (FIXTURES / "exit3.log").read_text()
    log = tmp_path / "job.log"
    log.write_text(
        "\035vmrun attempt 1 job 7\n"
        + labelled(one, 0, "2026-11-28_20:00:00", 1, 9)
        + "\035vmrun attempt 2 job 7\n"
        + labelled(one, 1, "2026-11-28_21:27:05", 3, 1)
        + labelled(one, 0, "2026-11-28_21:27:02", 1, 3)
    )
    code, failure = _parse(tmp_path, log, "137")
    assert code == "3"
    assert failure is not None and failure["rank"] == 1 and failure["launcher_exit"] == 137


@pytest.mark.parametrize("rc", ["0", "2"])
def test_no_summary_leaves_the_code_as_it_is(tmp_path: Path, rc: str) -> None:
    log = tmp_path / "log"
    log.write_text("Traceback (most recent call last):\nValueError: x\n")
    assert _parse(tmp_path, log, rc) == (rc, None)


def test_a_recorded_exit_code_ends_the_run_while_its_shell_still_tells_it() -> None:
    """The race: exit_code written, the supervising shell alive (sending the notification).
    The run has ended, with the recorded code, for the follower, status and resume alike."""
    telling = RunRecord("r1", "h1", exit_code=3, alive=True)
    assert telling.state == RunState.FAILED and not telling.running
    assert RunRecord("r1", "h1", exit_code=0, alive=True).state == RunState.DONE
    assert RunRecord("r1", "h1", alive=True).state == RunState.RUNNING
    stopping = RunRecord("r1", "h1", alive=True, stopped=True)
    assert stopping.state == RunState.RUNNING  # the stop has not finished yet
    assert RunRecord("r1", "h1", alive=True, stopped=True, exit_code=143).state == RunState.STOPPED


def test_the_listing_carries_the_failure_into_status_json() -> None:
    failure = {
        "exit": 3,
        "rank": 5,
        "local_rank": 1,
        "host": "gpu-7",
        "signal": None,
        "launcher_exit": 1,
        "pid": 9,
    }
    listing = "\n".join(
        [
            "NOW 1000",
            "RUN r1",
            "META " + __import__("base64").b64encode(b'{"id": "r1"}').decode(),
            "EXIT 3",
            "ENDED 990",
            "FAILURE " + json.dumps(failure),
            "ALIVE 1",
        ]
    )
    (rec,) = parse_listing(listing, "h2")
    assert rec.state == RunState.FAILED and rec.failure == WorkerFailure.of(failure)
    (obj,) = run_objects([rec])
    assert obj["exit"] == 3 and obj["failure"]["rank"] == 5 and obj["failure"]["node"] == "h2"
    assert (
        obj["error"]["message"] == "run r1 exited with 3: rank 5 (local rank 1) on h2 exited with 3"
    )


def test_worker_failure_words() -> None:
    killed = WorkerFailure(137, rank=0, local_rank=0, host="n1", signal="SIGKILL")
    assert killed.describe() == "rank 0 on n1 was killed by SIGKILL"
    assert (
        WorkerFailure(3, rank=3, local_rank=1).describe("h2")
        == "rank 3 (local rank 1) on h2 exited with 3"
    )
    assert WorkerFailure.parse("not json") is None and WorkerFailure.parse('{"rank": 1}') is None


def test_a_slurm_job_still_listed_reads_its_recorded_end() -> None:
    """The batch shell has written `exit` and is still telling the end: squeue says RUNNING,
    the record says failed with 3; a requeued attempt's old end does not count."""
    run = SlurmRun(
        "r1",
        "bed",
        Record(),
        job=JobState("RUNNING"),
        starts=[["1", "100"]],
        exits=[["1", "3", "200"]],
    )
    assert run.state_and_code() == (RunState.FAILED, 3)
    starts = [["1", "100"], ["2", "300"]]
    again = SlurmRun(
        "r1",
        "bed",
        Record(),
        job=JobState("RUNNING"),
        starts=starts,
        exits=[["1", "requeue", "200"]],
    )
    assert again.state_and_code() == (RunState.RUNNING, None)
