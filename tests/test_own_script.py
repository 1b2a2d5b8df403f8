"""`vmrun submit`'s own decisions, quick: how a batch script's #SBATCH lines read, what sbatch
is asked, what squeue's answers and the `ended` record mean for a run and its array tasks,
and the login node's follower and reader (vmrun/hostside/slurm_follow_tasks.sh,
slurm_task_files.sh) run here with a fake `squeue` that answers from a plan and writes the
job's files as a job would (the real cluster: test_cli_submit.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_slurm_follow import LocalConn

from vmrun.backends.api import NodeRecord, RunRef
from vmrun.backends.slurm import batchfile, own_script
from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.records import parse_listing
from vmrun.errors import CommandFailed, OutcomeUnknown, UsageError
from vmrun.reporting import Recorder
from vmrun.results.record import RunRecord
from vmrun.runs.state import RunState

PRINCETON = """#!/bin/bash
#SBATCH --job-name=ddp-torch     # create a short name for your job
#SBATCH --nodes=3                # node count
#SBATCH -o out/%x-%j.out
# a comment between options
#SBATCH -p gpu
#SBATCH --time 00:01:00
#SBATCH--bad
# SBATCH --array=0-3

export MASTER_PORT=12340
#SBATCH --nodes=9
"""


def test_header_reads_as_sbatch_reads_it() -> None:
    """Long and short forms, `=` or a space, trailing comments; not `#SBATCH--x` or
    `# SBATCH`; nothing after the first command."""
    opts = batchfile.header(PRINCETON)
    assert opts.get("--job-name") == "ddp-torch"
    assert opts.get("--nodes") == "3"
    assert opts.get("--output") == "out/%x-%j.out"
    assert opts.get("--partition") == "gpu" and opts.get("--time") == "00:01:00"
    assert opts.get("--array") is None and "--bad" not in opts


def test_command_line_overrides_and_defaults_fill_only_silence(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text(PRINCETON)
    words, given = batchfile.command_line({"--time": "5", "--exclusive": None}, ["-J", "mine"])
    assert words == ["--time=5", "--exclusive", "-J", "mine"]
    batch = batchfile.read(tmp_path / "job.sh", tmp_path, given)
    assert (batch.options.get("--time"), batch.job_name) == ("5", "mine")
    assert (batch.relative, batch.output, batch.error) == (
        "job.sh",
        "out/%x-%j.out",
        "out/%x-%j.out",
    )
    defaults = {"--partition": "debug", "--account": "proj", "--qos": None}
    assert batchfile.filled(batch.options, defaults) == ["--account=proj"]
    assert batch.work_dir("/w/code") == "/w/code"
    chdir = batchfile.read(tmp_path / "job.sh", tmp_path, batchfile.parse_words(["-D", "sub"]))
    assert chdir.work_dir("/w/code") == "/w/code/sub"


def test_default_output_names_and_refusals(tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text("#!/bin/sh\n#SBATCH --array=0-1\n#SBATCH -e e-%a.err\necho\n")
    array = batchfile.read(tmp_path / "a.sh", tmp_path, batchfile.Options())
    assert (array.array, array.output, array.error) == ("0-1", "slurm-%A_%a.out", "e-%a.err")
    (tmp_path / "p.sh").write_text("echo no interpreter\n")
    for name, code in (("nosuch.sh", "script-not-found"), ("p.sh", "script-no-interpreter")):
        with pytest.raises(UsageError) as caught:
            batchfile.read(tmp_path / name, tmp_path, batchfile.Options())
        assert caught.value.code == code
    outside = tmp_path / "project"
    outside.mkdir()
    with pytest.raises(UsageError) as caught:
        batchfile.read(tmp_path / "a.sh", outside, batchfile.Options())
    assert caught.value.code == "script-not-synced"


def _listing(meta: dict[str, Any], squeue: list[str], ended: list[str] | None = None) -> str:
    lines = [
        "==> squeue <==",
        *squeue,
        "==> r/run.json <==",
        json.dumps(meta),
        "==> r/jobid <==",
        "40",
        "==> r/since <==",
        "1700000000.5",
    ]
    if ended is not None:
        lines += ["==> r/ended <==", *ended]
    return "\n".join([*lines, "==> sacct <=="])


def test_an_array_run_is_its_tasks() -> None:
    """squeue's line per task (`JobArrayID|STATE|REASON|START|ELAPSED|NODES|ARRAYJOB|TASK|
    EXIT`): running while a task runs; once all ended, the worst ending with its exit code
    (a wait status: 256 is exit 1); after squeue forgets the job, the `ended` record."""
    meta = {"run_id": "r", "batch_script": True, "array": "0-2", "submitted": 1}
    queue = [
        "40_0|COMPLETED|None|x|0:05|c1|40|0|0",
        "40_1|RUNNING|None|x|1:02|c2|40|1|0",
        "40_2|PENDING|JobArrayTaskLimit|N/A|0:00||40|2|0",
        "41|RUNNING|None|x|0:01|c1|41|N/A|0",
    ]
    (run,) = parse_listing(_listing(meta, queue), "bed")
    assert (run.state, run.reason, run.duration, run.started) == (
        RunState.RUNNING,
        "JobArrayTaskLimit",
        62,
        1700000000.5,
    )
    assert run.progress == "on c1,c2"  # where its tasks run: no epochs to tell
    assert [(t.key, t.state) for t in run.tasks] == [
        ("0", RunState.DONE),
        ("1", RunState.RUNNING),
        ("2", RunState.PENDING),
    ]
    ended = [
        "40_0|COMPLETED|None|x|0:05|c1|40|0|0",
        "40_1|FAILED|NonZeroExitCode|x|1:02|c2|40|1|256",
        "40_2|CANCELLED|None|x|0:00||40|2|15",
    ]
    (run,) = parse_listing(_listing(meta, ended), "bed")
    assert (run.state, run.exit_code) == (RunState.FAILED, 1)
    assert [t.exit_code for t in run.tasks] == [0, 1, None]
    # nobody followed it: `status` keeps what squeue shows before squeue forgets it
    assert [ln.split()[:3] + ln.split()[4:] for ln in run.ends_to_record()] == [
        ["0", "COMPLETED", "0", "0:05"],
        ["1", "FAILED", "256", "1:02"],
        ["2", "CANCELLED", "15", "0:00"],
    ]
    (kept,) = parse_listing(_listing(meta, ended, ["0 COMPLETED 0 9 0:05"]), "bed")
    assert kept.ends_to_record() == []
    (run,) = parse_listing(
        _listing(meta, [], ["0 COMPLETED 0 9 0:05", "1 FAILED 512 9 1:02"]), "bed"
    )
    assert (run.state, run.exit_code, [t.elapsed for t in run.tasks]) == (
        RunState.FAILED,
        2,
        [5, 62],
    )
    (run,) = parse_listing(_listing(meta, [], []), "bed")
    assert run.state is RunState.LOST  # neither squeue nor a record: vmrun cannot tell


def test_a_stopped_job_reads_stopped() -> None:
    meta = {"run_id": "r", "batch_script": True, "submitted": 1}
    text = _listing(meta, ["40|CANCELLED|None|x|0:03|c1|40|N/A|15"]) + "\n==> r/stopped <==\n1"
    (run,) = parse_listing(text.replace("==> sacct <==\n", "") + "\n==> sacct <==", "bed")
    assert run.state is RunState.STOPPED


# -- the login node's follower and reader, here ---------------------------------------

SQUEUE = """#!/bin/sh
# each call runs the plan's next step (the last repeats): a shell snippet that may write
# the job's files, then prints squeue's lines
n=$(cat "$FAKE/n" 2>/dev/null || echo 0)
steps=$(ls "$FAKE"/step-* | wc -l)
[ "$n" -lt "$steps" ] || n=$((steps - 1))
echo $((n + 1)) > "$FAKE/n"
cd "$WORK" && . "$FAKE/step-$n"
"""


class Conn(LocalConn):
    def capture(self, command: str, **_: Any) -> tuple[int, bytes, str]:
        import subprocess

        proc = subprocess.run(
            ["sh", "-c", command],
            env={**self.env, "HOME": str(self.home)},
            capture_output=True,
            cwd=self.home,
            timeout=30,
        )
        return proc.returncode, proc.stdout, proc.stderr.decode()


class Fake:
    def __init__(self, tmp_path: Path, steps: list[str], meta: dict[str, Any]):
        self.fake, self.rec, self.work = tmp_path / "fake", tmp_path / "rec", tmp_path / "work"
        for d in (self.fake / "bin", self.rec, self.work):
            d.mkdir(parents=True)
        (self.fake / "bin" / "squeue").write_text(SQUEUE)
        (self.fake / "bin" / "squeue").chmod(0o755)
        (self.fake / "bin" / "sacct").write_text("#!/bin/sh\nexit 1\n")
        (self.fake / "bin" / "sacct").chmod(0o755)
        for i, step in enumerate(steps):
            (self.fake / f"step-{i}").write_text(step)
        (self.rec / "run.json").write_text("{}")
        env = {
            **os.environ,
            "PATH": f"{self.fake / 'bin'}:{os.environ['PATH']}",
            "FAKE": str(self.fake),
            "WORK": str(self.work),
            "HOME": str(tmp_path / "home"),
        }
        self.conn = Conn(env)
        self.out = Recorder()
        meta = {
            "record_dir": str(self.rec),
            "job_id": "40",
            "batch_script": True,
            "work_dir": str(self.work),
            "submitted": 0,
            **meta,
        }
        self.ref = RunRef(
            "r",
            ("bed",),
            {"bed": NodeRecord("bed", RunState.PENDING, None, RunRecord.from_json(meta))},
        )
        self.backend = SlurmBackend(self.conn, Cluster("bed", "login"), poll=0.01)  # type: ignore[arg-type]

    def follow(self) -> int:
        return self.backend.follow(self.ref, self.out)

    def read(self, last: int = 0) -> str:
        out = Recorder()
        self.backend.read_log(self.ref, out, last=last)
        return out.data.decode()


def test_follower_expands_patterns_streams_files_and_records_ends(tmp_path: Path) -> None:
    """An array of two: each task's file (`%x-%A_%3a-%N.out`: the node known only once it
    runs; a separate `.err`) streamed with its index from its first line, as it grows;
    the files and the ends recorded; task 1's exit 3 fails the run with that code."""
    line = "{id}|40|{t}|arr|{host}|{state}|{code}|x|0:0{t}|{host}|{reason}"
    pend = "\n".join(
        line.format(id=40, t=t, host="n/a", state="PENDING", code=0, reason="Priority")
        for t in (0, 1)
    )
    run0 = line.format(id=41, t=0, host="c1.cluster", state="RUNNING", code=0, reason="None")
    run1 = line.format(id=42, t=1, host="c2", state="RUNNING", code=0, reason="None")
    end0 = line.format(id=41, t=0, host="c1.cluster", state="COMPLETED", code=0, reason="None")
    end1 = line.format(id=42, t=1, host="c2", state="FAILED", code=768, reason="NonZeroExitCode")
    steps = [
        f"echo '{pend}'",
        f"echo one > arr-40_000-c1.out; echo '{run0}'; echo '{pend.splitlines()[1]}'",
        f"echo two >> arr-40_000-c1.out; printf 'oops\\n' > arr-40_001-c2.err;"
        f" echo '{run0}'; echo '{run1}'",
        f"printf 'last' >> arr-40_001-c2.out; echo '{end0}'; echo '{end1}'",
    ]
    fake = Fake(
        tmp_path,
        steps,
        {
            "array": "0-1",
            "output": "%x-%A_%3a-%N.out",
            "error": "%x-%A_%3a-%N.err",
            "job_name": "arr",
        },
    )
    with pytest.raises(CommandFailed) as caught:
        fake.follow()
    assert caught.value.exit_status == 3 and "task 1 of job 40" in str(caught.value)
    text = fake.out.data.decode()
    assert sorted(text.splitlines()) == ["[0] one", "[0] two", "[1 err] oops", "[1] last"]
    assert "task 0 of job 40 is PENDING (Priority)" in fake.out.lines
    assert "task 1 of job 40 running on c2" in fake.out.lines
    files = (fake.rec / "files").read_text().splitlines()
    assert f"0 o {fake.work}/arr-40_000-c1.out" in files and len(files) == 4
    ended = [ln.split()[:3] for ln in (fake.rec / "ended").read_text().splitlines()]
    assert ended == [["0", "COMPLETED", "0"], ["1", "FAILED", "768"]]
    # read again afterwards, from the recorded files; --last 1: each file's last line
    assert fake.read(last=1).count("\n") == 3


def test_reader_finds_files_by_pattern_when_nothing_recorded_them(tmp_path: Path) -> None:
    """A detached job squeue has forgotten and nobody followed: its files are found by its
    pattern (`%N` any node) among those newer than its record; older ones are not its."""
    fake = Fake(tmp_path, [""], {"output": "%N-%j.out", "error": "%N-%j.out", "job_name": "job.sh"})
    old = fake.work / "c9-40.out"
    old.write_text("x")
    os.utime(fake.rec / "run.json", (1, 1))
    os.utime(old, (0, 0))
    (fake.work / "c1-40.out").write_text("from the job\n")
    (fake.work / "c1-39.out").write_text("another job\n")
    assert fake.read() == "from the job\n"


def test_a_job_left_unknown_is_not_called_done(tmp_path: Path) -> None:
    """The job leaves squeue while running and no accounting knows it: vmrun says it
    cannot tell how it ended, never that it completed."""
    run = "40|40|N/A|job|c1|RUNNING|0|x|0:01|c1|None"
    fake = Fake(
        tmp_path, [f"echo '{run}'", "true"], {"output": "slurm-%j.out", "error": "slurm-%j.out"}
    )
    with pytest.raises(OutcomeUnknown):
        fake.follow()
    assert (fake.rec / "ended").read_text().split()[:3] == ["-", "ENDED", "-"]


def test_fetch_logs_names_the_output_files_by_their_patterns() -> None:
    from vmrun.runs.outputs import RunLocation, resolve_what

    assert batchfile.as_glob("logs/%x-%4j.err") == "logs/*-*.err"
    assert batchfile.as_glob("100%%-%a") == "100%-*"
    run = RunLocation("r", "bed", "/rec", "/code", since_ns=5, logs=("slurm-*_*.out",))
    record, outputs = resolve_what("logs", run)
    assert outputs.remote == "/code" and outputs.select == ("slurm-*_*.out",)
    assert outputs.newer_than_ns == 5 and "ended" in record.select


def test_a_job_that_can_never_start_is_cancelled(tmp_path: Path, monkeypatch: Any) -> None:
    """A pending reason no wait clears (more nodes than the partition has): cancelled, one
    line that says why, not followed for ever."""
    pend = "40|40|N/A|job|n/a|PENDING|0|x|0:00||PartitionNodeLimit"
    fake = Fake(tmp_path, [f"echo '{pend}'"], {"output": "o", "error": "o"})
    stopped: list[str] = []
    monkeypatch.setattr(
        SlurmBackend, "_cancel", lambda self, ref, grace: stopped.append(ref.run_id)
    )
    with pytest.raises(UsageError) as caught:
        fake.follow()
    assert caught.value.code == "job-never-starts" and stopped == ["r"]


def test_stream_frames(tmp_path: Path) -> None:
    out = Recorder()
    stream = own_script.TaskStream(out, array=False)
    stream.feed(b"\x1e- o\x1ehello\n\x1e- e\x1ewor")
    stream.feed(b"ld\n\x1dvmrun task - 40|RUNNING\n")
    stream.flush()
    assert out.data == b"hello\nworld\n"


def test_recover_lines_tell_by_the_jobs_agent_only_where_asked(tmp_path: Path) -> None:
    """`submit --recover`: the copy's lines carry the agent's launch spec (no webhook: the
    record's notify.json) and, where the run asked to be told, the files that tell; its
    vmrun_tell is the agent's `tell`, which claims the event in the record."""
    import subprocess

    from vmrun.runs.launch_spec import LaunchSpec, Notify, Watchers

    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "notify.json").write_text('{"on": ["requeue"], "webhooks": []}')
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (stubs / "scontrol").chmod(0o755)

    def told(notify: bool, python3: str = "") -> list[str]:
        spec = LaunchSpec(
            rec=str(rec),
            workdir=str(tmp_path),
            run_id="r1",
            argv=(str(tmp_path / "again.sh"),),
            watchers=Watchers(notify=Notify() if notify else None),
        )
        lines = own_script.recover_lines(spec, 3)
        assert "VMRUN_NOTIFIER" not in lines and 'python3 -c "$' not in lines  # no program
        assert ("VMRUN_AGENT=()" in lines) != notify  # nothing to run, unless asked
        script = f'#!/bin/bash\n{lines}vmrun_tell requeue ""\nexit 0\n'
        (stubs / "python3").unlink(missing_ok=True)
        if python3:  # a python3 too old for the agent: its check fails
            (stubs / "python3").write_text(f"#!/bin/sh\n{python3}\n")
            (stubs / "python3").chmod(0o755)
        env = {
            **os.environ,
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "SLURM_JOB_ID": "7",
            "SLURM_JOB_NODELIST": "n1",
        }
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (b"vmrun: not told (requeue)" in done.stdout) == bool(python3 and notify)
        return sorted(p.name for p in rec.glob("notified.*"))

    assert told(False) == []
    assert told(True, python3="exit 1") == []  # said, not told
    assert told(True) == ["notified.requeue"]
    assert sorted(p.name for p in (rec / ".watch").iterdir()) == ["notify_send.py", "run_agent.py"]
