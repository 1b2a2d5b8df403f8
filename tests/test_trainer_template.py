"""The template trainer under real torchrun (gloo, 2 CPU processes) and as a plain script."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import wait_for
from train_helpers import (
    TEMPLATE,
    base_env,
    epoch_lines,
    event_hparams,
    event_scalars,
    hook_env,
    marked,
    read_metrics,
    run,
    torchrun_argv,
)

from vmrun.runs import launch
from vmrun.trainer.template import build_model

pytestmark = pytest.mark.slow

DDP_ARGS = ["4", "2", "--batch-size", "8", "--deterministic", "--seed", "0"]
KEYS = {"epoch", "loss", "samples_per_s", "epoch_time_s", "world_size", "lr", "eval_loss"}
RANKED = {"rank_step_s", "rank_node"}  # a distributed run's: each rank's step time, node
CLASSIFY_KEYS = KEYS | {"accuracy", "eval_accuracy"}
TAGS = {  # metrics.jsonl key -> TensorBoard tag
    "loss": "train/loss",
    "samples_per_s": "train/samples_per_s",
    "epoch_time_s": "train/epoch_time_s",
    "lr": "train/lr",
    "eval_loss": "eval/loss",
}
CLASSIFY_TAGS = {**TAGS, "accuracy": "train/accuracy", "eval_accuracy": "eval/accuracy"}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """One 2-process run, 4 epochs, snapshot every 2, per-rank batch 8; shared by the checks."""
    out = tmp_path_factory.mktemp("ddp") / "out"
    with marked() as mark:
        done = run(torchrun_argv([*DDP_ARGS, "--out-dir", str(out)]), base_env(mark), out.parent)
    assert done.returncode == 0, done.stdout
    yield out, done.stdout


def test_two_ranks_train_with_gloo(ddp_run: tuple[Path, str]) -> None:
    _, output = ddp_run
    for rank in (0, 1):
        assert f"[rank {rank}] started: pid " in output
    assert "world_size 2 backend gloo device cpu" in output
    assert "batch 8/rank (16 global)" in output
    assert [ln.split(" loss ")[0] for ln in epoch_lines(output)] == [
        f"[rank 0] epoch {e}/4" for e in range(1, 5)
    ]


def test_loss_falls_and_metrics_are_complete(ddp_run: tuple[Path, str]) -> None:
    out, _ = ddp_run
    metrics = read_metrics(out)
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[-1]["loss"] < 0.5 * metrics[0]["loss"], metrics
    assert metrics[-1]["eval_loss"] < 0.5 * metrics[0]["eval_loss"], metrics  # it generalises
    for m in metrics:
        assert set(m) == KEYS | RANKED
        assert m["world_size"] == 2 and m["lr"] == pytest.approx(0.1)
        assert len(m["rank_step_s"]) == 2 and m["rank_node"] == [0, 0]
        assert m["samples_per_s"] > 0 and m["epoch_time_s"] > 0


def test_snapshots_after_every_kth_epoch(ddp_run: tuple[Path, str]) -> None:
    out, output = ddp_run
    saved = [ln for ln in output.splitlines() if "snapshot saved" in ln]
    assert saved == [
        f"[rank 0] snapshot saved at epoch {e} -> {out / 'snapshot.pt'}" for e in (2, 4)
    ]
    snap = torch.load(out / "snapshot.pt", weights_only=True)
    assert snap["epoch"] == 4
    assert {"model", "optimizer", "epoch", "rng", "world_size", "args"} <= set(snap)
    assert {"torch", "python"} <= set(snap["rng"])
    assert not any(p.name.startswith(".") for p in out.iterdir()), "temp files left behind"


def test_final_model_loads_into_bare_model(ddp_run: tuple[Path, str]) -> None:
    out, output = ddp_run
    assert f"[rank 0] final model saved -> {out / 'finalmodel.pt'}" in output
    state = torch.load(out / "finalmodel.pt", weights_only=True)
    assert not any(key.startswith("module.") for key in state)
    build_model().load_state_dict(state, strict=True)


def test_two_ranks_equal_one_rank_with_the_same_global_batch(
    ddp_run: tuple[Path, str], tmp_path: Path
) -> None:
    """2 procs x batch 8 and 1 plain process x batch 16 see the same global batches."""
    two, _ = ddp_run
    args = [a if a != "8" else "16" for a in DDP_ARGS]
    with marked() as mark:
        done = run([sys.executable, TEMPLATE, *args, "--out-dir", "one"], base_env(mark), tmp_path)
    assert done.returncode == 0, done.stdout
    assert "world_size 1" in done.stdout
    one_state = torch.load(tmp_path / "one" / "finalmodel.pt", weights_only=True)
    two_state = torch.load(two / "finalmodel.pt", weights_only=True)
    assert one_state.keys() == two_state.keys()
    for key in one_state:
        assert torch.allclose(one_state[key], two_state[key], atol=1e-5), key
    for key in ("loss", "eval_loss"):  # eval: each rank its shard, the sums all-reduced
        one_values = [m[key] for m in read_metrics(tmp_path / "one")]
        assert one_values == pytest.approx([m[key] for m in read_metrics(two)], abs=1e-5), key


def assert_events_match_metrics(out: Path, tags: dict[str, str]) -> None:
    """Each metric of metrics.jsonl is a TensorBoard scalar with one point per epoch."""
    metrics, scalars = read_metrics(out), event_scalars(out)
    assert set(scalars) == set(tags.values())
    for key, tag in tags.items():
        assert [step for step, _ in scalars[tag]] == [m["epoch"] for m in metrics], tag
        expected = pytest.approx([m[key] for m in metrics], rel=1e-6)  # stored as float32
        assert [value for _, value in scalars[tag]] == expected, tag


def test_rank_0_writes_tensorboard_events_of_every_epoch(ddp_run: tuple[Path, str]) -> None:
    out, output = ddp_run
    assert "no TensorBoard events" not in output
    assert len(list(out.glob("events.out.tfevents.*"))) == 1  # rank 0's alone
    assert_events_match_metrics(out, TAGS)
    settings, metric_tags, status = event_hparams(out)
    assert settings == {
        "task": "regress",
        "world_size": 2,
        "nodes": 1,
        "batch_size": 8,
        "global_batch_size": 16,
        "lr": 0.1,
        "momentum": 0,
        "dataset_size": 2048,
        "seed": 0,
    }
    assert metric_tags == ["train/loss", "eval/loss"] and status == "STATUS_SUCCESS"


def test_resume_continues_at_the_next_epoch(tmp_path: Path) -> None:
    """4 epochs, then the same command with 6 in all: only epochs 5 and 6 run."""
    with marked() as mark:
        first = run([sys.executable, TEMPLATE, "4", "2"], base_env(mark), tmp_path)
        assert first.returncode == 0, first.stdout
        second = run([sys.executable, TEMPLATE, "6", "2"], base_env(mark), tmp_path)
    assert second.returncode == 0, second.stdout
    assert "[rank 0] resumed from snapshot at epoch 5 (epochs 1-4 done)" in second.stdout
    assert [ln.split(" loss ")[0] for ln in epoch_lines(second.stdout)] == [
        "[rank 0] epoch 5/6",
        "[rank 0] epoch 6/6",
    ]
    assert [m["epoch"] for m in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    assert torch.load(tmp_path / "snapshot.pt", weights_only=True)["epoch"] == 6


def test_a_resumed_run_has_each_epoch_once_in_the_events(tmp_path: Path) -> None:
    """5 epochs (snapshots at 2 and 4), then 6 in all: epoch 5 runs again from the snapshot
    of 4. TensorBoard shows epoch 5 once, the second attempt's (its epoch_time_s, which no
    two attempts share), as metrics.jsonl does."""
    with marked() as mark:
        first = run([sys.executable, TEMPLATE, "5", "2"], base_env(mark), tmp_path)
        assert first.returncode == 0, first.stdout
        second = run([sys.executable, TEMPLATE, "6", "2"], base_env(mark), tmp_path)
    assert second.returncode == 0, second.stdout
    assert "[rank 0] resumed from snapshot at epoch 5 (epochs 1-4 done)" in second.stdout
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    assert [m["epoch"] for m in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    assert_events_match_metrics(tmp_path, TAGS)
    assert event_hparams(tmp_path)[2] == "STATUS_SUCCESS"


# Makes `import tensorboard` fail, then runs the script given after it as __main__.
HIDE_TENSORBOARD = """import runpy, sys
sys.modules["tensorboard"] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_without_tensorboard_it_trains_and_says_so_once(tmp_path: Path) -> None:
    wrapper, out = tmp_path / "hide_tensorboard.py", tmp_path / "out"
    wrapper.write_text(HIDE_TENSORBOARD)
    argv = launch.torchrun_argv(
        sys.executable,
        str(wrapper),
        [TEMPLATE, "3", "2", "--out-dir", str(out)],
        nproc_per_node=2,
        max_restarts=0,
        rdzv_endpoint="localhost:0",
        rdzv_id="no-tb",
    )
    with marked() as mark:
        done = run(argv, base_env(mark), tmp_path)
    assert done.returncode == 0, done.stdout
    said = [ln for ln in done.stdout.splitlines() if "no TensorBoard events" in ln]
    assert len(said) == 1 and said[0].startswith("[rank 0] "), done.stdout
    assert "pip install tensorboard" in said[0]
    assert "[rank 0] final model saved" in done.stdout
    assert not list(out.glob("events.out.tfevents.*"))
    assert [set(m) for m in read_metrics(out)] == [KEYS | RANKED] * 3


def test_resume_when_only_rank_0_has_the_snapshot(
    ddp_run: tuple[Path, str], tmp_path: Path
) -> None:
    """Two "nodes" (one process each, env wiring, separate directories as without a shared
    filesystem): only node 0 has snapshot.pt. Node 1 must still start at epoch 5, or the two
    would run different numbers of collectives and fail."""
    snapshot_dir, _ = ddp_run
    node_dirs = [tmp_path / "node0", tmp_path / "node1"]
    for node_dir in node_dirs:
        node_dir.mkdir()
    for name in ("snapshot.pt", "metrics.jsonl"):
        shutil.copy(snapshot_dir / name, node_dirs[0] / name)
    port = _free_port()
    args = [a if a != "4" else "6" for a in DDP_ARGS]
    with marked() as mark:
        procs = []
        for rank, node_dir in enumerate(node_dirs):
            wiring = launch.env_wiring(
                node_rank=rank, nnodes=2, master_addr="127.0.0.1", master_port=port
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, TEMPLATE, *args],
                    env=base_env(mark, wiring),
                    cwd=node_dir,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output
    assert "[rank 0] resumed from snapshot at epoch 5 (epochs 1-4 done)" in outputs[0]
    assert [ln.split(" loss ")[0] for ln in epoch_lines(outputs[0])] == [
        "[rank 0] epoch 5/6",
        "[rank 0] epoch 6/6",
    ]
    assert "[rank 1] started" in outputs[1]
    assert [m["epoch"] for m in read_metrics(node_dirs[0])] == [1, 2, 3, 4, 5, 6]
    assert list(node_dirs[1].iterdir()) == []  # only rank 0 writes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sigkilled_worker_is_restarted_from_the_last_snapshot(
    tmp_path: Path, trainer_hooks: Path
) -> None:
    """Kill rank 1 mid-epoch 4 (snapshot at 2): torchrun restarts both ranks, which resume at
    epoch 3, and the run ends with exactly 6 epochs."""
    pids, out = tmp_path / "pids", tmp_path / "out"
    argv = torchrun_argv(["6", "2", "--out-dir", str(out)], max_restarts=2)
    hooks = hook_env(trainer_hooks, STALL_AT_EPOCH="4", PID_DIR=str(pids))
    with marked() as mark:
        env = base_env(mark, {**hooks, **launch.torchrun_env(2)})
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            stalled = pids / "stalled-rank1.pid"
            wait_for(lambda: stalled.exists() or proc.poll() is not None, 60, "rank 1 to stall")
            assert proc.poll() is None, proc.communicate()[0]
            victim = int(stalled.read_text())
            os.kill(victim, signal.SIGKILL)
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, output
    assert f"(pid: {victim})" in output  # torchrun saw the killed worker fail
    assert "[rank 0] resumed from snapshot at epoch 3 (epochs 1-2 done)" in output
    assert (pids / "rank0-restart1.pid").exists() and (pids / "rank1-restart1.pid").exists()
    assert [m["epoch"] for m in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert torch.load(out / "snapshot.pt", weights_only=True)["epoch"] == 6
    build_model().load_state_dict(torch.load(out / "finalmodel.pt", weights_only=True))


@pytest.mark.parametrize("paused_save", [1, 2])
def test_kill_during_snapshot_write_never_leaves_a_torn_snapshot(
    tmp_path: Path, trainer_hooks: Path, paused_save: int
) -> None:
    """The writer is SIGKILLed with half a snapshot on disk: snapshot.pt is absent (first
    save) or the previous complete one (second save); a rerun cleans up and resumes."""
    marker = tmp_path / "save-paused.pid"
    with marked() as mark:
        env = base_env(mark, hook_env(trainer_hooks, PAUSE_IN_SAVE=str(paused_save)))
        proc = subprocess.Popen(
            [sys.executable, TEMPLATE, "6", "1"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            wait_for(lambda: marker.exists() or proc.poll() is not None, 60, "a paused save")
            assert proc.poll() is None, proc.communicate()[0]
            temps = list(tmp_path.glob(".snapshot.pt.tmp-*"))
            assert len(temps) == 1 and temps[0].stat().st_size > 0  # half written
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        snapshot = tmp_path / "snapshot.pt"
        if paused_save == 1:
            assert not snapshot.exists()
            return
        assert torch.load(snapshot, weights_only=True)["epoch"] == 1
        rerun = run([sys.executable, TEMPLATE, "2", "1"], base_env(mark), tmp_path)
    assert rerun.returncode == 0, rerun.stdout
    assert "resumed from snapshot at epoch 2 (epoch 1 done)" in rerun.stdout
    assert not list(tmp_path.glob(".snapshot.pt.tmp-*"))
    assert [m["epoch"] for m in read_metrics(tmp_path)] == [1, 2]


CLASSIFY_ARGS = ["10", "5", "--task", "classify", "--deterministic"]


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`vmrun train --task classify` on a CPU machine: 2 processes, batch 32/rank, 10 epochs."""
    out = tmp_path_factory.mktemp("classify") / "out"
    with marked() as mark:
        argv = torchrun_argv([*CLASSIFY_ARGS, "--out-dir", str(out)])
        done = run(argv, base_env(mark), out.parent)
    assert done.returncode == 0, done.stdout
    assert "[rank 0] epoch 10/10 loss " in done.stdout and " acc " in done.stdout
    yield out


def test_classify_accuracy_rises(classify_run: Path) -> None:
    metrics = read_metrics(classify_run)
    assert [set(m) for m in metrics] == [CLASSIFY_KEYS | RANKED] * 10
    first, last = metrics[0], metrics[-1]
    assert first["accuracy"] < 0.65 and last["accuracy"] > 0.85, metrics  # chance: 0.25
    assert last["eval_accuracy"] > max(0.8, first["eval_accuracy"] + 0.15), metrics
    assert last["eval_loss"] < 0.5 * first["eval_loss"], metrics
    assert_events_match_metrics(classify_run, CLASSIFY_TAGS)
    settings, metric_tags, _ = event_hparams(classify_run)
    assert settings["task"] == "classify"
    assert metric_tags == ["train/loss", "eval/loss", "train/accuracy", "eval/accuracy"]


def test_classify_final_model_loads_into_the_classify_model(classify_run: Path) -> None:
    state = torch.load(classify_run / "finalmodel.pt", weights_only=True)
    build_model("classify").load_state_dict(state, strict=True)
    with pytest.raises(RuntimeError, match="size mismatch"):
        build_model().load_state_dict(state)  # no argument: the regression model, as ever


def test_classify_two_ranks_equal_one_rank(classify_run: Path, tmp_path: Path) -> None:
    """The same trajectory on 1 process with the global batch: the same weights, and the
    same eval numbers (a sample near a class boundary may flip: 2 of 512 allowed)."""
    argv = [sys.executable, TEMPLATE, *CLASSIFY_ARGS, "--batch-size", "64", "--out-dir", "one"]
    with marked() as mark:
        done = run(argv, base_env(mark), tmp_path)
    assert done.returncode == 0, done.stdout
    one, two = read_metrics(tmp_path / "one"), read_metrics(classify_run)
    for key in ("loss", "eval_loss"):
        assert [m[key] for m in one] == pytest.approx([m[key] for m in two], abs=1e-5), key
    for key in ("accuracy", "eval_accuracy"):
        assert [m[key] for m in one] == pytest.approx([m[key] for m in two], abs=2 / 512), key
    one_state = torch.load(tmp_path / "one" / "finalmodel.pt", weights_only=True)
    two_state = torch.load(classify_run / "finalmodel.pt", weights_only=True)
    for key in one_state:
        assert torch.allclose(one_state[key], two_state[key], atol=1e-5), key


def test_a_snapshot_of_another_task_is_refused(tmp_path: Path) -> None:
    with marked() as mark:
        first = run([sys.executable, TEMPLATE, "2", "1"], base_env(mark), tmp_path)
        assert first.returncode == 0, first.stdout
        second = run(
            [sys.executable, TEMPLATE, "3", "1", "--task", "classify"], base_env(mark), tmp_path
        )
    assert second.returncode == 1, second.stdout
    assert "snapshot.pt is from --task regress, this run is --task classify" in second.stdout
    assert [m["epoch"] for m in read_metrics(tmp_path)] == [1, 2]  # nothing lost
