"""Preemption under real torchrun (gloo, 2 CPU processes) with real signals: SIGUSR2 (or
SIGTERM with VMRUN_REQUEUE_FILE set) stops the run after the epoch with a snapshot and the
requeue file, exit 0; the same command run again resumes at the next epoch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for
from train_helpers import (
    TEMPLATE,
    base_env,
    event_scalars,
    hook_env,
    marked,
    read_metrics,
    run,
    torchrun_argv,
)

pytestmark = pytest.mark.slow


def popen(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_epochs(proc: subprocess.Popen[str], out: Path, epochs: int) -> None:
    """Until metrics.jsonl has `epochs` lines; fails with the output if the run ended first."""
    metrics = out / "metrics.jsonl"

    def done() -> bool:
        return (metrics.exists() and len(metrics.read_text().splitlines()) >= epochs) or (
            proc.poll() is not None
        )

    wait_for(done, 60, f"{epochs} epochs")
    assert proc.poll() is None, proc.communicate()[0]


def worker_pids(pid_dir: Path) -> list[int]:
    return [int((pid_dir / f"rank{r}-restart0.pid").read_text()) for r in (0, 1)]


def signal_run(
    tmp_path: Path,
    hooks: Path,
    env: dict[str, str],
    argv: list[str],
    epochs: int,
    send: signal.Signals,
    *,
    delay: str,
    to_ranks: tuple[int, ...] = (0, 1),
    to_agent: bool = False,
    shell: str = "",
) -> str:
    """Start `argv` with each epoch `delay` s longer (the trainer hooks in `hooks`), wait
    for `epochs` epochs, send `send` to the chosen processes, wait for the end; returns the
    output. Every process started is killed by PID on the way out."""
    out, pid_dir = tmp_path / "out", tmp_path / "pids"
    env = {**env, **hook_env(hooks, EPOCH_DELAY=delay, PID_DIR=str(pid_dir))}
    if shell:  # sh sets the disposition, then becomes torchrun (same pid)
        argv = ["sh", "-c", f'{shell}; exec "$@"', "sh", *argv]
    with marked() as mark:
        proc = popen(argv, base_env(mark, env), tmp_path)
        try:
            wait_for_epochs(proc, out, epochs)
            pids = worker_pids(pid_dir)
            if to_agent:
                os.kill(proc.pid, send)
            for rank in to_ranks:
                os.kill(pids[rank], send)
            output, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, output
    return output


def _snapshot_epoch(out: Path) -> int:
    import torch  # here, not at collection: the quick tier never pays for it

    return int(torch.load(out / "snapshot.pt", weights_only=True)["epoch"])


def assert_stopped_for_requeue(out: Path, requeue: Path, output: str, name: str) -> int:
    """The run stopped after some epoch E < 30 with a snapshot of E; returns E."""
    note = json.loads(requeue.read_text())
    epoch = note["epoch"]
    assert note == {"epoch": epoch, "signal": name} and 2 <= epoch < 30, output
    assert _snapshot_epoch(out) == epoch
    assert [m["epoch"] for m in read_metrics(out)] == list(range(1, epoch + 1))
    assert not (out / "finalmodel.pt").exists()
    stop = f"stopping after epoch {epoch} for requeue ({name})"
    assert f"[rank 0] {stop}: snapshot saved\n" in output, output
    assert f"[rank 1] {stop}\n" in output, output
    return epoch


def test_sigusr2_to_one_worker_stops_both_and_the_rerun_resumes(
    tmp_path: Path, trainer_hooks: Path
) -> None:
    """SIGUSR2 to rank 1 alone: both ranks stop after the same epoch E (rank 0 was not
    signalled, yet snapshots E); the same command again trains E+1..30, nothing twice."""
    out, requeue = tmp_path / "out", tmp_path / "requeue.json"
    argv = torchrun_argv(["30", "100", "--out-dir", str(out)])
    env = {"VMRUN_REQUEUE_FILE": str(requeue)}
    output = signal_run(
        tmp_path, trainer_hooks, env, argv, 2, signal.SIGUSR2, delay="0.3", to_ranks=(1,)
    )
    assert "[rank 1] got SIGUSR2: will stop after this epoch\n" in output, output
    assert "[rank 0] got SIGUSR2" not in output, output
    epoch = assert_stopped_for_requeue(out, requeue, output, "SIGUSR2")

    with marked() as mark:
        again = run(argv, base_env(mark, env), tmp_path)
    assert again.returncode == 0, again.stdout
    assert f"[rank 0] resumed from snapshot at epoch {epoch + 1} " in again.stdout
    assert [m["epoch"] for m in read_metrics(out)] == list(range(1, 31))
    assert _snapshot_epoch(out) == epoch
    assert (out / "finalmodel.pt").exists()
    assert not requeue.exists()  # the stop it resumed from is over
    assert len(list(out.glob("events.out.tfevents.*"))) == 2  # one per attempt
    for tag, points in event_scalars(out).items():  # each epoch once, none lost at the stop
        assert [step for step, _ in points] == list(range(1, 31)), tag


@pytest.mark.parametrize(
    ("name", "shell", "to_agent"),
    [
        ("SIGTERM", "", False),
        # as vmrun's Slurm task wrapper starts torchrun, and as Slurm signals every process
        # of the step: torchrun ignores SIGUSR2, its workers inherit that, the template's
        # own handler still catches it
        ("SIGUSR2", "trap '' USR2", True),
    ],
)
def test_a_signal_to_every_process_stops_for_requeue(
    tmp_path: Path, trainer_hooks: Path, name: str, shell: str, to_agent: bool
) -> None:
    out, requeue = tmp_path / "out", tmp_path / "requeue.json"
    env = {"VMRUN_REQUEUE_FILE": str(requeue)}
    argv = torchrun_argv(["30", "100", "--out-dir", str(out)])
    output = signal_run(
        tmp_path,
        trainer_hooks,
        env,
        argv,
        2,
        signal.Signals[name],
        delay="0.3",
        to_agent=to_agent,
        shell=shell,
    )
    for rank in (0, 1):
        assert f"[rank {rank}] got {name}: will stop after this epoch\n" in output, output
    assert_stopped_for_requeue(out, requeue, output, name)


def test_without_a_requeue_file_sigterm_ends_the_worker_at_once(
    tmp_path: Path, trainer_hooks: Path
) -> None:
    """On SSH hosts `vmrun stop` sends SIGTERM: the worker ends mid-epoch, nothing saved."""
    env = hook_env(trainer_hooks, EPOCH_DELAY="100")  # epoch 1 would end only after 100 s
    with marked() as mark:
        proc = popen([sys.executable, TEMPLATE, "3", "100"], base_env(mark, env), tmp_path)
        try:
            wait_for_epochs(proc, tmp_path, 1)  # and now in the epoch's delay
            os.kill(proc.pid, signal.SIGTERM)
            sent = time.monotonic()
            output, _ = proc.communicate(timeout=20)
            assert time.monotonic() - sent < 10
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGTERM, output
    assert "got SIGTERM" not in output and "stopping" not in output, output
    left = [p.name for p in tmp_path.iterdir() if not p.name.startswith("events.out.tfevents.")]
    assert left == ["metrics.jsonl"]


def test_a_signal_in_the_last_epoch_finishes_the_run(tmp_path: Path, trainer_hooks: Path) -> None:
    """Caught after the last epoch's metrics line: no epoch remains, a normal finish."""
    out, requeue = tmp_path / "out", tmp_path / "requeue.json"
    env = {"VMRUN_REQUEUE_FILE": str(requeue)}
    argv = torchrun_argv(["3", "100", "--out-dir", str(out)])
    output = signal_run(tmp_path, trainer_hooks, env, argv, 3, signal.SIGUSR2, delay="1")
    for rank in (0, 1):
        assert f"[rank {rank}] got SIGUSR2" in output, output  # caught, during the last epoch
    assert "stopping after" not in output, output
    assert f"[rank 0] final model saved -> {out / 'finalmodel.pt'}" in output
    assert [m["epoch"] for m in read_metrics(out)] == [1, 2, 3]
    assert not requeue.exists()


def test_sigusr1_to_one_worker_snapshots_that_epoch_and_training_goes_on(
    tmp_path: Path, trainer_hooks: Path
) -> None:
    """SIGUSR1 (a cloud's early warning) to rank 1 alone: rank 0 snapshots the epoch the
    ranks agree on, nobody stops, the run finishes; no requeue file."""
    out, requeue = tmp_path / "out", tmp_path / "requeue.json"
    env = {"VMRUN_REQUEUE_FILE": str(requeue)}
    argv = torchrun_argv(["12", "100", "--out-dir", str(out)])
    output = signal_run(
        tmp_path, trainer_hooks, env, argv, 2, signal.SIGUSR1, delay="0.3", to_ranks=(1,)
    )
    assert "[rank 1] got SIGUSR1: will snapshot after this epoch\n" in output, output
    epoch = _snapshot_epoch(out)
    assert 2 <= epoch < 12 and output.count("snapshot saved at epoch") == 1, output
    assert [m["epoch"] for m in read_metrics(out)] == list(range(1, 13))
    assert (out / "finalmodel.pt").exists() and not requeue.exists()
    assert "for requeue" not in output, output
