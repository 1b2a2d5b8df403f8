"""Following a Slurm job (vmrun/hostside/slurm_follow.sh through
vmrun.backends.slurm.following), run
here with a fake `squeue`/`sacct` on PATH that answer from a plan, one step per call: the
scheduler's hiccups, its answers, the job's end (the real cluster: test_cli_slurm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import install_hostlib, local_argv

from vmrun.backends.api import NodeRecord, RunRef
from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster
from vmrun.errors import CommandFailed, ExitCode, OutcomeUnknown, exit_code_for
from vmrun.reporting import Recorder
from vmrun.results.record import RunRecord
from vmrun.runs.state import RunState

# Each call takes the plan's next step (the last one repeats): `fail` (no controller),
# `invalid` (older Slurm's answer for a purged job), `gone` (no longer listed: the job
# ended, and wrote its last line and exit record just before), or a state such as RUNNING.
SQUEUE = """#!/bin/sh
plan=$FAKE/plan
step=$(head -n 1 "$plan")
if [ "$(wc -l < "$plan")" -gt 1 ]; then sed -i 1d "$plan"; fi
echo "$step" >> "$FAKE/calls"
case $step in
  fail) echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  gone|invalid)
    if [ ! -e "$REC/exit" ]; then
      echo "0: the last line" >> "$REC/job.log"; echo "1 $CODE 1700000000" >> "$REC/exit"
    fi
    if [ "$step" = invalid ]; then
      echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
    fi ;;
  *@*) echo "${step%@*}|None|${step#*@}" ;;  # STATE@NODE: where it runs (%B asked)
  *) echo "$step|None" ;;
esac
"""
SACCT = """#!/bin/sh
if [ -e "$FAKE/sacct" ]; then cat "$FAKE/sacct"; exit 0; fi
echo "sacct: error: Slurm accounting storage is disabled" >&2
exit 1
"""


@dataclass
class Result:
    exit_status: int


class LocalConn:
    """Runs the follower's argv here, with the fake scheduler first on PATH."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.stderr = b""
        self.home = Path(env["HOME"])
        install_hostlib(self.home)

    def run(self, argv: list[str], *, on_output: Any = None, **_: Any) -> Result:
        proc = subprocess.Popen(
            local_argv(argv, self.home),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            cwd=self.home,
        )
        assert proc.stdout is not None and proc.stderr is not None
        try:
            for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[union-attr]
                on_output("stdout", chunk)
        finally:  # a reader that raised: its process group goes, as a closed channel's does
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        self.stderr = proc.stderr.read()
        return Result(proc.wait(timeout=30))


class Fake:
    def __init__(
        self,
        tmp_path: Path,
        plan: list[str],
        *,
        code: int = 0,
        sacct: str | None = None,
        log: str = "0: epoch 1\\n",
    ):
        self.dir, self.rec = tmp_path / "fake", tmp_path / "rec"
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(parents=True)
        self.rec.mkdir()
        for name, text in (("squeue", SQUEUE), ("sacct", SACCT)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        (self.dir / "plan").write_text("".join(f"{step}\n" for step in plan))
        if sacct is not None:
            (self.dir / "sacct").write_text(sacct + "\n")
        (self.rec / "job.log").write_text(log.replace("\\n", "\n"))
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE": str(self.dir),
            "REC": str(self.rec),
            "CODE": str(code),
            "HOME": str(tmp_path / "home"),
        }
        self.conn = LocalConn(env)
        self.out = Recorder()

    def follow(self, *, last: int = 0, limit: float = 60, notify: Any = None) -> int:
        backend = SlurmBackend(
            self.conn,
            Cluster("bed", "login"),
            poll=0.01,  # type: ignore[arg-type]
            unanswered_limit=limit,
        )
        backend.notify = notify
        meta = {
            "record_dir": str(self.rec),
            "job_id": "7",
            "launcher": "python",
            "tasks_per_node": 1,
            "submitted": 0,
        }
        ref = RunRef(
            "r1",
            ("bed",),
            {"bed": NodeRecord("bed", RunState.PENDING, None, RunRecord.from_json(meta))},
        )
        return backend.follow(ref, self.out, last=last)

    @property
    def calls(self) -> list[str]:
        return (self.dir / "calls").read_text().split()

    @property
    def notes(self) -> list[str]:
        return self.out.lines

    @property
    def text(self) -> str:
        return self.out.data.decode()


def test_squeue_failures_keep_the_state_until_the_job_is_gone_and_sacct_says_completed(
    tmp_path: Path,
) -> None:
    plan = ["fail", "fail", "fail", "RUNNING", "fail", "fail", "RUNNING", "gone"]
    fake = Fake(tmp_path, plan, sacct="COMPLETED")
    assert fake.follow() == 0
    assert fake.calls == plan, "followed through every failure to the job's end"
    assert fake.text.splitlines() == ["epoch 1", "the last line"]
    unreachable = [n for n in fake.notes if "cannot reach the controller" in n]
    assert len(unreachable) == 2 and "(RUNNING)" in unreachable[1], fake.notes
    assert sum("answers again" in n for n in fake.notes) == 2
    assert fake.conn.stderr == b"", "no `cannot open .../exit` or other noise"


def test_no_accounting_and_an_invalid_job_id_end_with_the_exit_record(tmp_path: Path) -> None:
    fake = Fake(tmp_path, ["RUNNING", "invalid"], code=3)
    with pytest.raises(CommandFailed) as failed:
        fake.follow()
    assert exit_code_for(failed.value) == 3 and failed.value.code == "run-failed"
    assert fake.calls == ["RUNNING", "invalid"] and fake.conn.stderr == b""


def test_a_controller_silent_past_the_limit_is_said_in_one_line_never_an_end(
    tmp_path: Path,
) -> None:
    fake = Fake(tmp_path, ["RUNNING", "fail"])
    with pytest.raises(OutcomeUnknown) as unknown:
        fake.follow(limit=0)
    message = unknown.value.one_line()
    assert "\n" not in message
    assert unknown.value.code == "outcome-unknown"
    assert exit_code_for(unknown.value) == ExitCode.REMOTE
    assert "ended" not in message and "failed" not in message


def test_follow_with_lines_starts_at_the_last_n_lines(tmp_path: Path) -> None:
    log = "".join(f"0: line {i}\\n" for i in range(1, 11))
    fake = Fake(tmp_path, ["COMPLETED"], log=log)
    assert fake.follow(last=3) == 0
    assert fake.text.splitlines() == ["line 8", "line 9", "line 10"]


def test_a_queued_size_whose_end_is_unknown_is_followed_again_never_resubmitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster every size is queued at once; one whose end nobody can confirm is LOST
    (it may still run), the others are followed on, and `--resume` follows it again rather
    than queueing it a second time."""
    import contextlib

    from vmrun.operations import sweep_run
    from vmrun.runs.sweep import Sweep, load, plan_sizes

    sweep = Sweep("sweep-20260101-000000-abcd", {"cluster": "bed"}, {}, plan_sizes([1, 2], [1]))
    started: list[str] = []
    unknown = {"r1"}

    class Backend:
        def start(self, plan: Any, *_: Any) -> Any:
            started.append(plan.name)
            return RunRef(f"r{len(started)}", ("bed",))

        def find(self, rid: str) -> Any:
            return RunRef(rid, ("bed",))

        def follow(self, ref: Any, *_: Any, **__: Any) -> int:
            if ref.run_id in unknown:
                raise OutcomeUnknown(f"job of {ref.run_id} may still be running", host="bed")
            return 0

    monkeypatch.setattr(
        sweep_run, "_cluster_backend", lambda job, size: contextlib.nullcontext(Backend())
    )
    monkeypatch.setattr(sweep_run, "_fetch_results", lambda *a: None)
    monkeypatch.setattr(sweep_run, "_require_metrics", lambda *a: None)
    monkeypatch.setattr(sweep_run, "_finish", lambda job: None)
    plan = type("P", (), {"name": "t"})()
    job = sweep_run.SweepJob(sweep, plan, tmp_path, None, cluster="bed")  # type: ignore[arg-type]
    monkeypatch.setattr(sweep_run, "_size_plan", lambda job, size: plan)
    sweep_run.run_sweep(job)
    assert len(started) == 2
    assert [s.state for s in load(tmp_path, sweep.id).sizes] == [RunState.LOST, RunState.DONE]
    unknown.clear()  # the scheduler answers again
    resumed = sweep_run.SweepJob(
        load(tmp_path, sweep.id),
        plan,
        tmp_path,
        None,  # type: ignore[arg-type]
        cluster="bed",
    )
    sweep_run.run_sweep(resumed)
    assert len(started) == 2  # followed again, not queued again
    assert [s.state for s in load(tmp_path, sweep.id).sizes] == [RunState.DONE, RunState.DONE]


def test_a_requeue_seen_while_following_is_told(tmp_path: Path, monkeypatch: Any) -> None:
    """The follower tells a requeue it sees (the job's node may have claimed it first: the
    record decides), beside the log's lines, and waits for it before it returns."""
    import vmrun.notify.tell
    from vmrun.notify.send import Notify
    from vmrun.notify.targets import parse

    told: list[dict[str, Any]] = []
    monkeypatch.setattr(vmrun.notify.tell, "tell_end", lambda *a, **k: told.append(k))
    log = "0: epoch 1\\n\x1dvmrun requeue attempt 1 saved its state; requeueing job 7\\n"
    fake = Fake(tmp_path, ["RUNNING", "gone"], log=log)
    assert fake.follow(notify=Notify((parse("json://127.0.0.1:9/x"),), ("all",))) == 0
    assert [(k["event"], k["run_id"]) for k in told] == [("requeue", "r1")]
    assert "attempt 1 saved its state; requeueing job 7" in fake.notes


def test_a_size_slurm_refuses_is_failed_and_the_others_are_queued_and_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch refuses one point (its partition, its GPUs): that point is FAILED, every other
    is queued and followed all the same; --resume queues only the refused one again."""
    import contextlib

    from vmrun.errors import UsageError
    from vmrun.operations import sweep_run
    from vmrun.runs.sweep import Sweep, load, plan_sizes

    sweep = Sweep("sweep-20260101-000000-abcd", {"cluster": "bed"}, {}, plan_sizes([1, 2], [1]))
    started: list[str] = []
    refuse = {"1x1"}

    class Backend:
        def __init__(self, size: Any) -> None:
            self.size = size

        def start(self, *_: Any) -> Any:
            if self.size.label in refuse:
                raise UsageError("sbatch: invalid partition specified: nosuch", code="job-refused")
            started.append(self.size.label)
            return RunRef(f"r-{self.size.label}", ("bed",))

        def find(self, rid: str) -> Any:
            return RunRef(rid, ("bed",))

        def follow(self, *_: Any, **__: Any) -> int:
            return 0

    monkeypatch.setattr(
        sweep_run, "_cluster_backend", lambda job, size: contextlib.nullcontext(Backend(size))
    )
    for name in ("_fetch_results", "_require_metrics", "_finish"):
        monkeypatch.setattr(sweep_run, name, lambda *a: None)
    monkeypatch.setattr(sweep_run, "_size_plan", lambda job, size: None)
    out = Recorder()
    sweep_run.run_sweep(
        sweep_run.SweepJob(
            sweep,
            None,
            tmp_path,
            None,
            cluster="bed",  # type: ignore[arg-type]
            out=out,
        )
    )
    assert started == ["2x1"]
    sizes = load(tmp_path, sweep.id).sizes
    assert [s.state for s in sizes] == [RunState.FAILED, RunState.DONE]
    assert "invalid partition" in sizes[0].detail
    assert any("1 size(s) in the queue of bed" in line for line in out.lines)
    refuse.clear()
    sweep_run.run_sweep(
        sweep_run.SweepJob(
            load(tmp_path, sweep.id),
            None,
            tmp_path,
            None,  # type: ignore[arg-type]
            cluster="bed",
        )
    )
    assert started == ["2x1", "1x1"]
    assert [s.state for s in load(tmp_path, sweep.id).sizes] == [RunState.DONE, RunState.DONE]


def test_without_a_shared_folder_the_job_is_followed_on_the_node_it_is_placed_on(
    tmp_path: Path,
) -> None:
    """A cluster without a shared folder: the follower waits on the login node while the
    job is queued; once squeue places it on node b it follows there, where its log is (the
    login node's log folder stays empty), and the end is read there."""
    here = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    login = Fake(tmp_path / "login", ["PENDING", "RUNNING@vmt-b"], log="")
    node = Fake(tmp_path / "b", [f"RUNNING@{here}", "gone"], log="0: epoch 1\\n")
    cluster = Cluster("bed", "login", nodes=("login", "b"), shared=False)
    group = SimpleNamespace(connections={"bed": login.conn, "b": node.conn})
    backend = SlurmBackend(login.conn, cluster, poll=0.01, group=group)  # type: ignore[arg-type]
    backend._names = {"vmt-b": "b"}
    meta = {
        "record_dir": "../rec",
        "job_id": "7",
        "launcher": "python",  # each node's own
        "tasks_per_node": 1,
        "submitted": 0,
    }
    ref = RunRef(
        "r1",
        ("bed",),
        {"bed": NodeRecord("bed", RunState.PENDING, None, RunRecord.from_json(meta))},
    )
    assert backend.follow(ref, login.out) == 0
    assert login.calls == ["PENDING", "RUNNING@vmt-b"] and node.calls == [f"RUNNING@{here}", "gone"]
    assert login.text.splitlines() == ["epoch 1", "the last line"]
