"""`vmrun train --local`: the real CLI process launching real torchrun on this machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, Client, error_in, wait_for
from train_helpers import (
    SEED_SCRIPT,
    env_options,
    hook_env,
    kill_marked,
    new_mark,
    pids_with_env,
    pieces_script,
    rank_lines,
)

RUN_ID = re.compile(r"^(?P<name>.+)-\d{8}-\d{6}-[0-9a-f]{4}$")


def _env(mark: str, **extra: str) -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1", "VMRUN_TEST_MARK": mark, **extra}


def _only_run(client: Client) -> tuple[Path, dict]:
    runs = list((client.cwd / "results").iterdir())
    assert len(runs) == 1, runs
    return runs[0], json.loads((runs[0] / "run.json").read_text())


def test_help_imports_no_torch() -> None:
    probe = (
        "import sys\nfrom vmrun.cli.main import main\n"
        "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH_LOADED' if 'torch' in sys.modules else 'NO_TORCH')"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    assert "Usage: vmrun train [OPTIONS] [SCRIPT] [-- SCRIPT_ARGS...]" in out
    assert out.strip().splitlines()[-1] == "NO_TORCH"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--epochs", "3"], "no hosts given: pass -H user@host"),
        (["train", "--local", "nope.py"], "script nope.py: no such file"),
        (["train", "--local", "--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["train", "--local", "--epochs", "-2"], "--epochs must be >= 1, got -2"),
        (["train", "--local", "--save-every", "0"], "--save-every must be >= 1, got 0"),
        (["train", "--local", "--nproc-per-node", "lots"], "--nproc-per-node 'lots'"),
        (["train", "--local", "--nproc-per-node", "0"], "--nproc-per-node '0'"),
        (["train", "--local", "--env", "1BAD=x"], "invalid environment variable name"),
        (["train", "--local", "--env", "NOT_SET_ANYWHERE_X"], "is not set here"),
        (["train", "--local", "--launcher", "mpirun"], "--launcher 'mpirun'"),
        (["train", "--local", "--name", "a b"], "--name 'a b'"),
        (["train", "--local", "--max-restarts", "-1"], "--max-restarts must be >= 0"),
        (["train", "--local", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["train", "--local", "--task", "sort"], "--task must be regress or classify, got 'sort'"),
        (["train", "--local", "--launcher", "python", "--max-restarts", "2"], "torchrun's"),
        (["train", "--local", "--epochs", "3", "--", "5", "1"], "cannot be combined"),
        (["train", "--local", "--epochs", "x"], "'x' is not a valid int"),
        (["train", "--local", "--detach"], "--detach is for runs on hosts (-H)"),
        (["train", "--local", "--allow-concurrent"], "--allow-concurrent is for runs on hosts"),
        (["train", "--local", "--detach", "--allow-concurrent"], "drop them"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(
    client: Client, args: list[str], needle: str
) -> None:
    mark = new_mark()
    try:
        done = client.vmrun(*args, env=_env(mark), timeout=60)
    finally:
        kill_marked(mark)
    assert done.returncode == 2, (args, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vmrun: error["), done.stderr
    assert needle in lines[0], lines[0]
    assert not (client.cwd / "results").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--batch-size", "8"],
        ["--lr", "0.1"],
        ["--task", "classify"],
        ["--batch-size", "8", "--lr", "0.1", "--", "3", "1"],
    ],
)
def test_batch_size_and_lr_are_the_templates_only(client: Client, flags: list[str]) -> None:
    """A seed-style script's argparse knows no --batch-size/--lr/--task: they are refused for a
    SCRIPT (its own args go after --), before anything starts."""
    (client.cwd / "seed.py").write_text(SEED_SCRIPT)
    mark = new_mark()
    try:
        done = client.vmrun("train", "--local", "seed.py", *flags, env=_env(mark), timeout=60)
    finally:
        kill_marked(mark)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "the template trainer's options" in lines[0], done.stderr
    assert "pass your script's own arguments after --" in lines[0]
    assert not (client.cwd / "results").exists()


def test_missing_torch_is_reported_with_a_pinned_install_hint(
    client: Client, tmp_path: Path
) -> None:
    fake = tmp_path / "fake-site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named torch (test)')\n")
    pythonpath = f"{fake.parent}{os.pathsep}{ROOT}"
    mark = new_mark()
    try:
        done = client.vmrun("train", "--local", env=_env(mark, PYTHONPATH=pythonpath))
    finally:
        kill_marked(mark)
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip()
    assert "torch is not importable" in line and "download.pytorch.org/whl/cpu" in line, line
    assert not (client.cwd / "results").exists()


def test_nproc_gpu_without_a_gpu_is_a_usage_error(client: Client) -> None:
    import torch  # here, not at collection: the quick tier never pays for it

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    mark = new_mark()
    try:
        done = client.vmrun("train", "--local", "--nproc-per-node", "gpu", env=_env(mark))
    finally:
        kill_marked(mark)
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "usage" and said.startswith("--nproc-per-node gpu:"), done.stderr
    assert "--nproc-per-node cpu" in said  # the hint: what to run instead
    assert not (client.cwd / "results").exists()


def test_task_classify_reaches_the_template(client: Client) -> None:
    import torch

    from vmrun.trainer.template import build_model

    mark = new_mark()
    try:
        done = client.vmrun(
            "train",
            "--local",
            "--task",
            "classify",
            "--epochs",
            "2",
            "--save-every",
            "2",
            env=_env(mark),
            timeout=120,
        )
    finally:
        kill_marked(mark)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, record = _only_run(client)
    rel = f"results/{run_dir.name}"
    assert record["argv"][-6:] == ["2", "2", "--task", "classify", "--out-dir", rel]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = {
        "epoch",
        "loss",
        "accuracy",
        "samples_per_s",
        "epoch_time_s",
        "world_size",
        "lr",
        "eval_loss",
        "eval_accuracy",
        "rank_step_s",
        "rank_node",
    }
    assert [set(m) for m in metrics] == [keys] * 2
    assert list(run_dir.glob("events.out.tfevents.*"))  # TensorBoard's, beside them
    build_model("classify").load_state_dict(
        torch.load(run_dir / "finalmodel.pt", weights_only=True)
    )


def test_template_runs_two_process_ddp_and_records_the_run(client: Client) -> None:
    import torch

    from vmrun.trainer.template import build_model

    mark = new_mark()
    try:
        done = client.vmrun(
            "train", "--local", "--epochs", "5", "--save-every", "2", env=_env(mark), timeout=120
        )
    finally:
        kill_marked(mark)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir, record = _only_run(client)
    assert RUN_ID.match(run_dir.name) and RUN_ID.match(run_dir.name)["name"] == "template"
    out = done.stdout
    assert "[rank0] started" in out and "[rank1] started" in out
    assert "world_size 2 backend gloo" in out
    assert "[rank0] epoch 5/5 loss" in out
    rel = f"results/{run_dir.name}"
    assert f"[rank0] snapshot saved at epoch 4 -> {rel}/snapshot.pt" in out
    assert (run_dir / "train.log").read_text() == out  # the log is exactly what streamed
    assert f"run {run_dir.name}" in done.stderr
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4, 5]
    assert metrics[-1]["loss"] < 0.5 * metrics[0]["loss"]
    assert torch.load(run_dir / "snapshot.pt", weights_only=True)["epoch"] == 4
    build_model().load_state_dict(torch.load(run_dir / "finalmodel.pt", weights_only=True))
    assert record["id"] == run_dir.name and record["status"] == "finished"
    assert record["exit_code"] == 0 and record["nproc"] == "2" and record["template"] is True
    assert record["start_time"] <= record["end_time"] and isinstance(record["pid"], int)
    assert record["argv"][1:3] == ["-m", "torch.distributed.run"]
    assert f"--rdzv-id={run_dir.name}" in record["argv"]
    assert record["argv"][-4:] == ["5", "2", "--out-dir", rel]


def test_seed_style_script_runs_unchanged(client: Client) -> None:
    (client.cwd / "multigpu_torchrun.py").write_text(SEED_SCRIPT)
    mark = new_mark()
    try:
        done = client.vmrun(
            "train",
            "--local",
            "multigpu_torchrun.py",
            "--epochs",
            "3",
            "--save-every",
            "1",
            env=_env(mark),
            timeout=120,
        )
    finally:
        kill_marked(mark)
    assert done.returncode == 0, done.stdout + done.stderr
    for epoch in range(3):
        for gpu in (0, 1):
            assert f"[GPU{gpu}] Epoch {epoch} | Batchsize: 32 | Steps: 32" in done.stdout
        assert f"Epoch {epoch} | Training snapshot saved at snapshot.pt" in done.stdout
    assert "Final model saved at finalmodel.pt" in done.stdout
    # it ran in the project dir, as by hand: its files are there, vmrun's in results/<id>/
    assert (client.cwd / "snapshot.pt").exists() and (client.cwd / "finalmodel.pt").exists()
    run_dir, record = _only_run(client)
    assert RUN_ID.match(run_dir.name)["name"] == "multigpu_torchrun"  # type: ignore[index]
    assert record["cwd"] == str(client.cwd) and record["status"] == "finished"
    assert record["argv"][-2:] == ["3", "1"]


def test_script_args_after_dashdash_and_exit_code(client: Client) -> None:
    """`--launcher python`: args after -- go as-is; the script's exit code is vmrun's."""
    (client.cwd / "fail.py").write_text(
        "import os, sys\nprint('args', sys.argv[1:], os.environ['VMRUN_RUN_ID'])\nsys.exit(3)\n"
    )
    mark = new_mark()
    try:
        done = client.vmrun(
            "train", "--local", "fail.py", "--launcher", "python", "--", "--x", "1", env=_env(mark)
        )
    finally:
        kill_marked(mark)
    run_dir, record = _only_run(client)
    assert done.returncode == 3, done.stderr
    assert f"args ['--x', '1'] {run_dir.name}" in done.stdout
    code, said = error_in(done.stderr)
    assert code == "run-failed" and run_dir.name in said, done.stderr
    assert record["status"] == "failed" and record["exit_code"] == 3


def test_a_torchrun_worker_s_own_exit_code_and_rank(client: Client) -> None:
    """torchrun exits 1 when a worker fails; the run's code is the worker's (3), and which
    rank it was is said and kept (failure.json beside run.json)."""
    (client.cwd / "rank1.py").write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(120)\n"
    )
    mark = new_mark()
    try:
        done = client.vmrun("train", "--local", "rank1.py", "--nproc-per-node", "2", env=_env(mark))
    finally:
        kill_marked(mark)
    run_dir, record = _only_run(client)
    assert done.returncode == 3, done.stderr
    code, said = error_in(done.stderr)
    assert code == "run-failed" and "exited with 3: rank 1 on " in said, done.stderr
    assert record["exit_code"] == 3
    failure = json.loads((run_dir / "failure.json").read_text())
    assert (failure["rank"], failure["exit"], failure["launcher_exit"]) == (1, 3, 1)


# A script that spawns its own workers (torch.multiprocessing.spawn), the `python`
# launcher's kind: 2 gloo processes on 127.0.0.1 and a free port, one all_reduce.
SPAWN_SCRIPT = """\
import os, socket
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    total = torch.ones(1) * (rank + 1)
    dist.all_reduce(total)
    # one write per line: the two workers share the output pipe
    os.write(1, f"spawned rank {rank}/{world} sum {int(total.item())}\\n".encode())
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)


if __name__ == "__main__":
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)
    print("spawn joined", flush=True)
"""


def test_python_launcher_runs_a_script_that_spawns_its_own_workers(client: Client) -> None:
    (client.cwd / "spawner.py").write_text(SPAWN_SCRIPT)
    mark = new_mark()
    try:
        done = client.vmrun(
            "train", "--local", "spawner.py", "--launcher", "python", env=_env(mark), timeout=120
        )
    finally:
        kill_marked(mark)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(re.findall(r"^spawned rank (\d)/2 sum 3$", done.stdout, re.M)) == ["0", "1"]
    assert done.stdout.splitlines()[-1] == "spawn joined"
    run_dir, record = _only_run(client)
    assert record["launcher"] == "python" and record["status"] == "finished"
    assert record["argv"][1:] == [str(client.cwd / "spawner.py"), "10", "5"]
    assert pids_with_env(f"VMRUN_RUN_ID={run_dir.name}") == []


def test_env_launcher_wires_rank_variables(client: Client) -> None:
    (client.cwd / "show.py").write_text(
        "import os\nprint(*(f'{k}={os.environ[k]}' for k in"
        " ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'FOO')))\n"
    )
    mark = new_mark()
    try:
        done = client.vmrun(
            "train", "--local", "show.py", "--launcher", "env", "-e", "FOO=bar", env=_env(mark)
        )
    finally:
        kill_marked(mark)
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=\d+ FOO=bar",
        done.stdout,
    )
    assert _only_run(client)[1]["env_keys"] == ["FOO"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_every_process_of_the_run(
    client: Client, tmp_path: Path, trainer_hooks: Path, sig: signal.Signals
) -> None:
    """SIGINT (or SIGTERM) to vmrun mid-run: output streamed live until then, then nothing of
    the run is left (torchrun's group, workers in their own sessions), run.json says stopped,
    exit 130."""
    pids = tmp_path / "pids"
    mark = new_mark()
    proc = client.popen(
        "train",
        "--local",
        "--epochs",
        "50",
        "--save-every",
        "10",
        *env_options(hook_env(trainer_hooks, STALL_AT_EPOCH="2", PID_DIR=str(pids))),
        env=_env(mark),
    )
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def read() -> None:
        for line in stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: (
                all((pids / f"stalled-rank{r}.pid").exists() for r in (0, 1))
                or proc.poll() is not None
            ),
            90,
            "both ranks to stall in epoch 2",
        )
        assert proc.poll() is None, "".join(lines)
        # streamed live: epoch 1's line is here while the run still goes on
        wait_for(lambda: any("[rank0] epoch 1/50" in ln for ln in lines), 10, "epoch 1 line")
        run_dir, record = _only_run(client)
        leader, run_id = record["pid"], record["id"]
        workers = [int((pids / f"stalled-rank{r}.pid").read_text()) for r in (0, 1)]
        assert pids_with_env(f"VMRUN_RUN_ID={run_id}")
        proc.send_signal(sig)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_marked(mark)
    assert proc.returncode == 130, stderr
    code, said = error_in(stderr)
    assert code == "interrupted" and run_id in said, stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(leader, 0)
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid), pid
    assert pids_with_env(f"VMRUN_RUN_ID={run_id}") == []
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "stopped" and record["exit_code"] == 130
    assert record["end_time"] is not None


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_local_lines_arrive_whole_and_prefixed_and_torchruns_banner_only_in_the_log(
    client: Client,
) -> None:
    """Two ranks writing each line in two pieces at once: on the terminal and in train.log
    every line is whole and `[rankN]`-prefixed; torchrun's banner is in train.log only,
    unless --verbose. (Before, the ranks' pieces interleaved mid-line.)"""
    (client.cwd / "pieces.py").write_text(pieces_script(60))
    every = sorted((r, i) for r in (0, 1) for i in range(60))
    for verbose in ((), ("--verbose",)):
        mark = new_mark()
        try:
            env = {"VMRUN_TEST_MARK": mark}  # no OMP_NUM_THREADS: torchrun prints its banner
            done = client.vmrun(
                "train", "--local", *verbose, "pieces.py", "--", "x", env=env, timeout=120
            )
        finally:
            kill_marked(mark)
        assert done.returncode == 0, done.stdout + done.stderr
        assert sorted(rank_lines(done.stdout)) == every
        run_dir, _ = _only_run(client)
        log = (run_dir / "train.log").read_text()
        assert sorted(rank_lines(log)) == every and "\x1e" not in log
        assert "Setting OMP_NUM_THREADS" in log
        assert ("Setting OMP_NUM_THREADS" in done.stdout) is bool(verbose), done.stdout[:500]
        shutil.rmtree(client.cwd / "results")
