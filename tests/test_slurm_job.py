"""The Slurm pieces that need no cluster: flag checks, the batch script, squeue's states,
the run listing and the job's output stream (the real cluster: test_cli_slurm*.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vmrun.backends.slurm.job import Batch, JobPaths, JobSpec, batch_script, check_spec, gpu_option
from vmrun.backends.slurm.queue import JobState
from vmrun.backends.slurm.records import parse_listing, parse_listings
from vmrun.backends.slurm.stream import JobStream
from vmrun.errors import ConfigError, UsageError
from vmrun.hostside import HERE, source
from vmrun.reporting import Recorder
from vmrun.runs.launch_spec import Budget, Hang, LaunchSpec, Notify, Watchers
from vmrun.runs.state import RunState

PATHS = JobPaths("/w/.vmrun/runs/r1", "/w/vmrun/p-abc123", "/w/vmrun/p-abc123/results/r1")


@pytest.mark.parametrize(
    ("spec", "launcher", "message"),
    [
        (JobSpec(nodes=0), "torchrun", "--nodes must be >= 1"),
        (JobSpec(time="1h"), "torchrun", "--time '1h'"),
        (JobSpec(time="25:61:00:00"), "torchrun", "--time"),
        (JobSpec(mem="lots"), "torchrun", "--mem 'lots'"),
        (JobSpec(nodes=2), "python", "--launcher python starts one process on one node"),
        (JobSpec(sbatch_args=("exclusive",)), "torchrun", "--sbatch-arg 'exclusive'"),
        (JobSpec(max_requeues=-1), "env", "--max-requeues must be >= 0"),
        (JobSpec(partition="gpu\n#SBATCH --qos=high"), "env", "--partition 'gpu\\n#SBATCH"),
        (JobSpec(account="a b"), "env", "--account 'a b': holds a space"),
        (JobSpec(qos=""), "env", "--qos '': is empty"),
        (JobSpec(constraint="a100 --x"), "env", "--constraint 'a100 --x'"),
        (JobSpec(time="01:00:00\n"), "env", "--time '01:00:00\\n'"),
        (JobSpec(sbatch_args=("--exclusive --x",)), "env", "--sbatch-arg '--exclusive --x'"),
    ],
)
def test_bad_job_specs_are_refused_in_one_line(spec: JobSpec, launcher: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_spec(spec, launcher)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("time", ["30", "30:00", "01:00:00", "0-03:00", "2-00:00:00", "1-12"])
def test_slurm_time_forms_are_accepted(time: str) -> None:
    check_spec(JobSpec(time=time), "torchrun")


def test_gpu_option_follows_the_slurm_version() -> None:
    assert gpu_option(2, "slurm 22.05.8") == "--gpus-per-node=2"
    assert gpu_option(4, "slurm 18.08.9") == "--gres=gpu:4"


def _script(spec: JobSpec, launcher: str, command: list[str]) -> str:
    batch = Batch("r1", launcher, "/envs/p/bin/python", command, modules=["anaconda3/2021.5"])
    return batch_script(check_spec(spec, launcher), batch, PATHS, "slurm 22.05.8", job_name="r1")


def test_torchrun_is_one_task_per_node_and_asks_for_the_warning_signal() -> None:
    text = _script(JobSpec(nodes=2, gpus_per_node=2, time="01:00:00"), "torchrun", ["t.py"])
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2" in header and "#SBATCH --ntasks-per-node=1" in header
    assert "#SBATCH --gpus-per-node=2" in header and "#SBATCH --requeue" in header
    assert "#SBATCH --signal=B:USR2@90" in header and "#SBATCH --open-mode=append" in header
    assert "VMRUN_NPROC=2" in text and "VMRUN_MODULES=(anaconda3/2021.5)" in text
    # the rank variables are read in the task, on each node, never in the batch shell
    assert '--node-rank="$SLURM_NODEID"' in text and "srun " in text


def test_env_is_one_task_per_gpu_and_user_sbatch_args_come_last() -> None:
    spec = JobSpec(nodes=2, gpus_per_node=2, sbatch_args=("--signal=USR2@30",))
    text = _script(spec, "env", ["train.py", "it's"])
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --ntasks-per-node=2" in header
    assert header[-1] == "#SBATCH --signal=USR2@30"  # sbatch takes the last one
    assert "VMRUN_COMMAND=(train.py 'it'\"'\"'s')" in text


def test_the_batch_script_is_valid_bash() -> None:
    text = _script(JobSpec(nodes=2), "torchrun", ["a b.py", "$HOME", "`x`"])
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def _flight_recorder(torch: str, own_env: tuple[str, ...] = ()) -> dict[str, str]:
    """The job's flight-recorder settings, as bash reads the batch script's array."""
    batch = Batch("r1", "torchrun", "python3", ["t.py"], torch=torch, own_env=own_env)
    text = batch_script(JobSpec(), batch, PATHS, "23.02", job_name="r1")
    [line] = [x for x in text.splitlines() if x.startswith("VMRUN_FLIGHT_RECORDER=(")]
    show = f'{line}\nprintf "%s\\n" "${{VMRUN_FLIGHT_RECORDER[@]}}"'
    shown = subprocess.run(["bash", "-c", show], capture_output=True, text=True, check=True)
    return dict(word.split("=", 1) for word in shown.stdout.splitlines())


def test_the_jobs_flight_recorder_is_named_for_its_torch() -> None:
    """torch 2.8+ (or a torch setup did not record): the TORCH_FR_* names only (the old
    ones warn on every rank); an older torch recorded by setup: the old names as well."""
    dump = f"{PATHS.record}/nccl/fr_rank_"
    for torch in ("2.13.0", ""):
        new = _flight_recorder(torch)
        assert new == {
            "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_FR_DUMP_TEMP_FILE": dump,
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        }
    old = _flight_recorder("2.6.0+cu124")
    assert old["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert old["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == dump
    own = _flight_recorder("2.13.0", ("TORCH_FR_DUMP_TEMP_FILE",))  # the run's own wins
    assert "TORCH_FR_DUMP_TEMP_FILE" not in own and "TORCH_FR_BUFFER_SIZE" in own


def _agent(text: str) -> tuple[LaunchSpec, dict[str, str]]:
    """The batch script's launch spec and agent files, as bash reads them."""
    header = text.split("\n# shellcheck shell=bash", 1)[0]  # the variables, before the body
    show = header + '\nprintf "%s\\0" "$VMRUN_LAUNCH" "${VMRUN_AGENT[@]}"'
    shown = subprocess.run(["bash", "-c", show], capture_output=True, text=True, check=True)
    spec, *files = shown.stdout.split("\0")[:-1]
    return LaunchSpec.from_json(spec), dict(zip(files[::2], files[1::2], strict=True))


def test_the_job_hands_its_agent_one_launch_spec_and_the_files_it_runs() -> None:
    """The watchers' settings in one versioned spec (no secret: the webhooks are the
    record's notify.json), and only the host-side files the agent runs for them."""
    batch = Batch(
        "r1", "torchrun", "/envs/p/bin/python", ["t.py", "3"], notifier=True, hang="60 stop 1"
    )
    text = batch_script(JobSpec(), batch, PATHS, "23.02", job_name="r1")
    spec, files = _agent(text)
    assert (spec.rec, spec.run_id, spec.argv) == (PATHS.record, "r1", ("t.py", "3"))
    assert spec.watchers == Watchers(
        hang=Hang(60.0, "stop", True, "/envs/p/bin/python"), notify=Notify()
    )
    assert files == {
        name: source(name)
        for name in (
            "run_agent.py",
            "hang_watch.py",
            "spot_watch.py",
            "stacks.py",
            "run_failure.py",
            "notify_send.py",
        )
    }
    for gone in (
        "VMRUN_HANG",
        "VMRUN_SPOT_WATCH",
        "VMRUN_STACKS",
        "VMRUN_FAILURE",
        "VMRUN_NOTIFIER",
    ):
        assert f"{gone}=" not in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    plain = batch_script(
        JobSpec(), Batch("r1", "python", "python3", ["t.py"]), PATHS, "23.02", job_name="r1"
    )
    spec, files = _agent(plain)
    assert spec.watchers == Watchers() and files == {}  # nothing for the agent to do
    failures = batch_script(
        JobSpec(), Batch("r1", "torchrun", "python3", ["t.py"]), PATHS, "23.02", job_name="r1"
    )
    assert set(_agent(failures)[1]) == {"run_agent.py", "run_failure.py"}


def test_the_jobs_agent_gives_a_failed_workers_code_and_tells_nothing_unasked(
    tmp_path: Path,
) -> None:
    """run_agent.py's Slurm modes: `failure` reads torchrun's summary in job.log (the
    worker's own code, failure.json); `tell` without the spec's notify part sends nothing."""
    rec = tmp_path / "rec"
    rec.mkdir()
    log = Path(__file__).parent / "fixtures" / "torchrun" / "exit3.log"
    (rec / "job.log").write_text(log.read_text())
    (rec / "notify.json").write_text('{"webhooks": [{"url": "http://127.0.0.1:9/x"}]}')
    spec = LaunchSpec(rec=str(rec), workdir=str(tmp_path), run_id="r1", argv=("t.py",))
    agent = [sys.executable, str(HERE / "run_agent.py")]

    def mode(*args: str) -> str:
        done = subprocess.run(
            [*agent, *args],
            input=spec.to_json(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    assert mode("failure", "1") == "3"
    assert json.loads((rec / "failure.json").read_text())["exit"] == 3
    (rec / "job.log").write_text("no summary\n")
    assert mode("failure", "7") == "7" and not (rec / "failure.json").exists()
    assert mode("tell", "", "0") == "" and not list(rec.glob("notified.*"))


def test_recover_puts_its_functions_and_limit_into_the_batch_script_only_when_asked() -> None:
    plain = _script(JobSpec(), "torchrun", ["t.py"])
    assert "recover_start()" not in plain and "VMRUN_MAX_RECOVERIES=0" in plain
    batch = Batch(
        run_id="r1", launcher="torchrun", python="python3", command=["t.py"], max_recoveries=4
    )
    text = batch_script(JobSpec(), batch, PATHS, "23.02", job_name="r1")
    assert "VMRUN_MAX_RECOVERIES=4" in text and text.index("recover_start()") < text.index(
        "recover_start; fi"
    )
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_the_jobs_own_recoveries_are_counted_and_a_give_up_shown() -> None:
    meta = {"run_id": "a", "submitted": 5}
    listing = "\n".join(
        [
            "==> a/run.json <==",
            json.dumps(meta),
            "==> a/jobid <==",
            "11",
            "==> a/starts <==",
            "1 100",
            "2 200",
            "3 300",
            "==> a/exit <==",
            "1 requeue 150",
            "2 requeue 250",
            "3 5 350",
            "==> a/recoveries <==",
            "recovery\t200\tattempt 1 failed (exit 5)\t{}",
            "recovery\t300\tattempt 2 failed (node(s) c2 lost)\t{}",
            "gave-up\t350\tgave up: attempt 3 failed (exit 5)\t{}",
        ]
    )
    (a,) = parse_listing(listing, "bed")
    assert (a.state, a.exit_code, a.recoveries, a.gave_up) == (RunState.FAILED, 5, 2, True)
    assert a.recovery == "attempt 2 failed (node(s) c2 lost)"


def test_squeue_states_map_to_run_states() -> None:
    pending = JobState.parse("PENDING|Resources")
    assert pending and pending.run_state is RunState.PENDING and not pending.never_starts
    assert pending.describe() == "PENDING (Resources)"
    never = JobState.parse("PENDING|PartitionNodeLimit")
    assert never and never.never_starts
    for text, state in (
        ("RUNNING|None", RunState.RUNNING),
        ("COMPLETED|None", RunState.DONE),
        ("TIMEOUT|TimeLimit", RunState.FAILED),
        ("CANCELLED|None", RunState.STOPPED),
        ("REQUEUED|None", RunState.RUNNING),
    ):
        parsed = JobState.parse(text)
        assert parsed and parsed.run_state is state, text


def test_listing_gives_state_from_squeue_then_the_exit_record() -> None:
    meta = {"run_id": "a", "epochs": 10, "metrics": "/w/out/a/metrics.jsonl", "submitted": 5}
    listing = "\n".join(
        [
            "==> squeue <==",
            "12|PENDING|Priority|N/A|0:00|",
            "==> a/run.json <==",
            json.dumps(meta),
            "==> a/jobid <==",
            "11",
            "==> a/starts <==",
            "1 100",
            "2 200",
            "==> a/exit <==",
            "1 requeue 150",
            "2 0 300",
            "==> b/run.json <==",
            json.dumps({"run_id": "b", "submitted": 70}),
            "==> b/jobid <==",
            "12",
            "==> sacct <==",
            "==> /w/out/a/metrics.jsonl <==",
            json.dumps({"epoch": 10, "loss": 0.1}),
        ]
    )
    a, b = parse_listing(listing, "bed")
    assert (a.id, a.state, a.exit_code, a.attempts, a.progress) == (
        "a",
        RunState.DONE,
        0,
        2,
        "epoch 10/10",
    )
    assert a.duration == 200
    assert (b.state, b.reason) == (RunState.PENDING, "Priority")


def test_a_job_stopped_at_its_max_cost_is_stopped_whatever_sacct_says() -> None:
    """The batch shell's `budget` end (slurm_job.bash): the job completed as far as Slurm
    knows, and the run was stopped at its cap; the cap is read for `status`."""
    meta = {"run_id": "a", "epochs": 10, "submitted": 5, "max_cost": 6, "currency": "USD"}
    listing = "\n".join(
        [
            "==> squeue <==",
            "==> a/run.json <==",
            json.dumps(meta),
            "==> a/jobid <==",
            "11",
            "==> a/starts <==",
            "1 100",
            "==> a/exit <==",
            "1 budget 160",
            "==> a/stopped <==",
            "160",
            "==> a/budget <==",
            json.dumps({"seen": 159, "cap": "$6.00"}),
            "==> sacct <==",
            "11|COMPLETED|0:0",
        ]
    )
    (a,) = parse_listing(listing, "bed")
    assert (a.state, a.exit_code) == (RunState.STOPPED, None)
    assert a.budget == {"seen": 159, "cap": "$6.00"}


def test_the_batch_script_carries_the_budget_only_when_asked() -> None:
    """--max-cost is the job's agent's: its settings in the launch spec, the files that
    watch it in the job, and no timer of the batch shell's own."""
    paths = JobPaths(record="/w/rec", code="/w/code", out="/w/out")
    batch = Batch(run_id="r1", launcher="torchrun", python="python3", command=["t.py"])
    plain = batch_script(JobSpec(), batch, paths, "22.05", job_name="r1")
    assert _agent(plain)[0].watchers.budget is None
    capped = batch_script(
        JobSpec(),
        Batch(
            run_id="r1",
            launcher="torchrun",
            python="python3",
            command=["t.py"],
            budget=Budget(21600.0, "$6.00"),
        ),
        paths,
        "22.05",
        job_name="r1",
    )
    spec, files = _agent(capped)
    assert spec.watchers == Watchers(budget=Budget(21600.0, "$6.00"))
    assert {"run_agent.py", "budget_watch.py", "hang_watch.py", "spot_watch.py"} <= set(files)
    for text in (plain, capped):
        assert "VMRUN_BUDGET=" not in text and "kill -USR2" not in text
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_the_jobs_agent_keeps_its_cap_from_the_first_attempts_start(tmp_path: Path) -> None:
    """run_agent.py's `budget` (before a step: the cap said, REC/budget when spent already)
    and `step` (beside it: at the cap, REC/budget and SIGUSR2 to the batch shell), the time
    counted from the first attempt's start (REC/starts), as a requeued job's is."""
    rec = tmp_path / "rec"
    rec.mkdir()
    agent = [sys.executable, str(HERE / "run_agent.py")]

    def spec(seconds: float) -> str:
        capped = Watchers(budget=Budget(seconds, "$6.00"))
        return LaunchSpec(
            rec=str(rec), workdir=str(tmp_path), run_id="r1", argv=("t.py",), watchers=capped
        ).to_json()

    def said(*args: str, seconds: float) -> str:
        done = subprocess.run(
            [*agent, *args], input=spec(seconds), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    now = time.time()
    (rec / "starts").write_text(f"1 {now - 100:.0f}\n2 {now:.0f}\n")
    assert said("budget", seconds=200) == "$6.00" and not (rec / "budget").exists()
    assert said("budget", seconds=90) == "$6.00"  # the first attempt's 100 s count
    assert json.loads((rec / "budget").read_text())["cap"] == "$6.00"
    (rec / "budget").unlink()
    plain = LaunchSpec(rec=str(rec), workdir=str(tmp_path), run_id="r1", argv=("t.py",))
    done = subprocess.run([*agent, "budget"], input=plain.to_json().encode(), capture_output=True)
    assert done.stdout == b"" and not (rec / "budget").exists()
    shell = subprocess.Popen(
        ["bash", "-c", f'trap "echo usr2 > {tmp_path}/said; exit 0" USR2; sleep 60 & wait']
    )
    srun = subprocess.Popen(["sleep", "60"])
    try:
        watch = subprocess.Popen(
            [*agent, "step", str(srun.pid), str(shell.pid)], stdin=subprocess.PIPE, text=True
        )
        assert watch.stdin is not None
        watch.stdin.write(spec(102))  # 2 s after this attempt's start
        watch.stdin.close()
        assert shell.wait(timeout=30) == 0 and (tmp_path / "said").read_text() == "usr2\n"
        assert json.loads((rec / "budget").read_text())["cap"] == "$6.00"
        assert watch.poll() is None  # the step's watchers live as long as the step
        srun.kill()
        srun.wait()
        assert watch.wait(timeout=30) == 0
    finally:
        for process in (shell, srun):
            process.kill()
            process.wait()


def test_listings_of_a_cluster_without_a_shared_folder_take_each_run_from_where_it_ran() -> None:
    """Every node lists its own records: a run is read from the node it last started on
    (its starts, exit and metrics), its job id from the login node's record (sbatch ran
    there), the queue from the login node; a run never started is the login node's."""
    meta = {"run_id": "a", "epochs": 4, "metrics": "/w/out/a/metrics.jsonl", "submitted": 5}
    run_b = json.dumps({"run_id": "b", "submitted": 70})
    login = "\n".join(
        [
            "==> squeue <==",
            "12|PENDING|Priority|N/A|0:00|",
            "==> a/run.json <==",
            json.dumps(meta),
            "==> a/jobid <==",
            "11",
            "==> b/run.json <==",
            run_b,
            "==> b/jobid <==",
            "12",
            "==> a/starts <==",
            "1 100",  # the first attempt ran here; its requeue went to n3
            "==> a/exit <==",
            "1 requeue 150",
            "==> /w/out/a/metrics.jsonl <==",
            json.dumps({"epoch": 1}),
        ]
    )
    n2 = "\n".join(
        ["==> squeue <==", "==> a/run.json <==", json.dumps(meta), "==> b/run.json <==", run_b]
    )
    n3 = "\n".join(
        [
            "==> squeue <==",
            "==> a/run.json <==",
            json.dumps(meta),
            "==> a/starts <==",
            "2 200",
            "==> a/exit <==",
            "2 0 300",
            "==> /w/out/a/metrics.jsonl <==",
            json.dumps({"epoch": 4}),
        ]
    )
    a, b = parse_listings([("bed", login), ("n2", n2), ("n3", n3)], "bed")
    assert (a.files_on, a.job_id, a.state, a.exit_code, a.progress) == (
        "n3",
        "11",
        RunState.DONE,
        0,
        "epoch 4/4",
    )
    assert (b.files_on, b.job_id, b.state, b.reason) == ("", "12", RunState.PENDING, "Priority")


def test_stream_prefixes_ranks_by_node_and_reports_events() -> None:
    out = Recorder()
    events: list[tuple[str, str]] = []
    stream = JobStream(out, lambda w, r: events.append((w, r)), launcher="env", tasks_per_node=2)
    stream.feed(b"\x1dvmrun attempt 1 job 7 start 1 nodes c1 c2\n0: hello\n3: wor")
    stream.feed(b"ld\nsrun: error: something\n")
    stream.flush()
    assert out.outputs == [
        b"[c1 rank0] hello\n",
        b"[c2 rank3] world\n",
        b"srun: error: something\n",
    ]
    assert events == [("attempt", "1 job 7 start 1 nodes c1 c2")]


def test_unknown_cluster_keys_name_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vmrun.config import load_settings

    (tmp_path / "vmrun.toml").write_text('[[clusters]]\nname = "a"\nlogin = "x"\nparition = "p"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert "vmrun.toml line 4" in str(caught.value) and "'parition'" in str(caught.value)


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('partition = "gpu\\n#SBATCH --qos=high"', "partition 'gpu\\n#SBATCH --qos=high'"),
        ('account = "a b"', "account 'a b' holds a space"),
        ('qos = ""', "qos '' is empty"),
        ('modules = ["cuda 12"]', "modules[0] 'cuda 12'"),
        ('sbatch_args = ["--exclusive\\n#SBATCH --x"]', "sbatch_args[0]"),
        ('sbatch_args = ["exclusive"]', "sbatch_args[0] 'exclusive' is not an sbatch option"),
        ('env = { "A-B" = "1" }', "env: invalid environment variable name 'A-B'"),
        ('workdir = "~/my runs"', "workdir must be a path without spaces"),
        ('python = "/p/python\\n"', "python must be a path"),
    ],
)
def test_cluster_values_that_would_change_the_batch_script_are_refused(
    tmp_path: Path, toml: str, words: str
) -> None:
    from vmrun.backends.slurm.cluster import project_clusters
    from vmrun.config import load_settings
    from vmrun.errors import exit_code_for

    (tmp_path / "vmrun.toml").write_text(f'[[clusters]]\nname = "a"\nlogin = "x"\n{toml}\n')
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    with pytest.raises(ConfigError) as caught:
        project_clusters(settings)
    message = caught.value.one_line()
    assert words in message and "\n" not in message, message
    assert exit_code_for(caught.value) == 2


@pytest.mark.parametrize(
    ("toml", "flags", "words"),
    [
        ("", ["--partition", "gpu\n#SBATCH --qos=high"], "--partition 'gpu\\n#SBATCH"),
        ("", ["--sbatch-arg", "--exclusive --x"], "--sbatch-arg '--exclusive --x'"),
        ('account = "a b"\n', [], "account 'a b' holds a space"),
    ],
)
def test_train_refuses_such_values_before_connecting(
    tmp_path: Path, toml: str, flags: list[str], words: str
) -> None:
    import os
    import sys

    from conftest import ROOT

    (tmp_path / "vmrun.toml").write_text(
        f'[[clusters]]\nname = "bed"\nlogin = "nosuch.invalid"\n{toml}'
    )
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "vmrun", "train", "-C", "bed", *flags, "--epochs", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


class _ListingConn:
    """The login node as `SlurmBackend.runs` sees it: one listing (slurm_runs.sh's output)."""

    def __init__(self, listing: str):
        self.listing = listing

    def capture(self, command: str, **_: object) -> tuple[int, bytes, str]:
        return 0, self.listing.encode(), ""


def test_a_scripts_outputs_are_what_it_wrote_since_its_job_started_by_the_clusters_clock() -> None:
    import time

    from vmrun.backends.slurm.backend import SlurmBackend
    from vmrun.backends.slurm.cluster import Cluster
    from vmrun.runs.outputs import resolve_what

    submitted = time.time()  # this machine's clock
    start = int(submitted) - 3600  # the cluster's clock is an hour behind it
    meta = {
        "run_id": "a",
        "template": False,
        "submitted": submitted,
        "record_dir": "/w/rec/a",
        "out_dir": "/w/p",
        "metrics": "/w/p/metrics.jsonl",
    }
    listing = "\n".join(
        [
            "==> squeue <==",
            "==> a/run.json <==",
            json.dumps(meta),
            "==> a/jobid <==",
            "11",
            "==> a/starts <==",
            f"1 {start}",
            "==> a/exit <==",
            f"1 0 {start + 60}",
            "==> sacct <==",
        ]
    )
    backend = SlurmBackend(_ListingConn(listing), Cluster("bed", "login"))  # type: ignore[arg-type]
    location = backend.outputs(backend.find("a"))["bed"]
    written = (start + 5) * 10**9  # a file the job wrote 5 s into its run, by the cluster's clock
    specs = [s for s in resolve_what("results", location) if s.remote == "/w/p"]
    assert specs and all(0 < s.newer_than_ns <= written for s in specs)
    assert location.since_ns == start * 10**9


def test_the_listing_finds_each_runs_metrics_by_its_record_an_older_ones_too(
    tmp_path: Path,
) -> None:
    """slurm_runs.sh reads no run.json: a record names its metrics file in metrics.path
    (written with the record); one an older vmrun wrote without it is given its
    metrics.path once by vmrun, which read the path in the typed record, and is listed the
    same, its last metrics line under the file's own path."""
    import fake_slurm
    from conftest import install_hostlib
    from local_connection import LocalConnection

    from vmrun.backends.slurm.backend import SlurmBackend
    from vmrun.backends.slurm.cluster import Cluster
    from vmrun.results.record import CLUSTER, Job, RunRecord

    home = tmp_path / "home"
    install_hostlib(home)
    fake_slurm.install(tmp_path / "slurm", tmp_path / "slurm" / "bin")
    runs = home / ".vmrun" / "runs"
    for rid, epoch, pointed in (("new", 2, True), ("old", 5, False)):
        metrics = tmp_path / "out" / rid / "metrics.jsonl"
        metrics.parent.mkdir(parents=True)
        metrics.write_text(f'{{"epoch": {epoch - 1}}}\n{{"epoch": {epoch}}}\n')
        (runs / rid).mkdir(parents=True)
        record = RunRecord(run_id=rid, where=CLUSTER, job=Job(metrics=str(metrics), submitted=5))
        (runs / rid / "run.json").write_text(json.dumps(record.to_json()))
        if pointed:
            (runs / rid / "metrics.path").write_text(f"{metrics}\n")
    conn = LocalConnection("bed", home, tmp_path / "slurm" / "bin")
    listings: list[str] = []
    capture = conn.capture

    def counted(command: str, **kwargs: object) -> tuple[int, bytes, str]:
        listings.append(command)
        return capture(command, **kwargs)  # type: ignore[arg-type]

    conn.capture = counted  # type: ignore[method-assign]
    backend = SlurmBackend(conn, Cluster("bed", "login"))  # type: ignore[arg-type]
    for _ in range(2):
        found, errors = backend.runs()
        assert not errors
        assert {r.id: (r.last_metrics or {}).get("epoch") for r in found} == {"new": 2, "old": 5}
    assert (runs / "old" / "metrics.path").read_text() == f"{tmp_path}/out/old/metrics.jsonl\n"
    assert len(listings) == 3  # the older record's metrics.path written once
    assert listings[1] != listings[0] == listings[2]  # only the second names the older one


@pytest.mark.parametrize(
    "python3",
    [
        None,  # none on the PATH
        "exit 1",  # too old for the agent (3.6: the version check fails)
        'if [ "$1" = -c ]; then exit 0; fi; exit 1',  # new enough, yet the agent fails
    ],
)
def test_a_capped_job_on_a_node_without_a_python3_for_its_agent_starts_nothing(
    tmp_path: Path, python3: str | None
) -> None:
    """The cap is the agent's, which python3 runs: a node without one that runs it fails
    the job with one line and runs no step, rather than spending past the cap unwatched."""
    import shutil

    rec, out, bin_ = tmp_path / "rec", tmp_path / "out", tmp_path / "bin"
    for d in (rec, out, bin_):
        d.mkdir()
    for tool in ("date", "mkdir", "rm", "head", "hostname", "cat", "mv", "tail", "sleep", "touch"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_ / tool).symlink_to(found)
    (bin_ / "scontrol").write_text("#!/bin/sh\necho node1\n")
    (bin_ / "srun").write_text(f"#!/bin/sh\ntouch {tmp_path}/stepped\n")
    if python3 is not None:
        (bin_ / "python3").write_text(f"#!/bin/sh\n{python3}\n")
    for fake in ("scontrol", "srun", "python3"):
        if (bin_ / fake).exists():
            (bin_ / fake).chmod(0o755)
    batch = Batch("r1", "torchrun", "python3", ["t.py"], budget=Budget(60.0, "$1.00"))
    paths = JobPaths(record=str(rec), code=str(tmp_path), out=str(out))
    text = batch_script(JobSpec(), batch, paths, "22.05", job_name="r1")
    env = {"PATH": str(bin_), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "HOME": "/"}
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "-c", text], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "--max-cost is kept by the job's agent" in done.stdout
    assert not (tmp_path / "stepped").exists()
    assert (rec / "exit").read_text().split()[:2] == ["1", "3"]
