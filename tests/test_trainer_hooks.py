"""The template trainer is an example to copy: its test behaviour lives in tests/trainer_hooks
(a sitecustomize on the test runs' PYTHONPATH), never in the shipped file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, wait_for

from vmrun.trainer import TEMPLATE_PATH

HOOKS = ROOT / "tests" / "trainer_hooks"


def _gated(tmp_path: Path, epochs: int, **more: str) -> tuple[dict[str, str], list[str]]:
    """A one-process template run of `epochs` tiny epochs gated after its first (GATE at
    tmp_path/gate), with `more` hooks: its environment and argv."""
    env = {
        **os.environ,
        "PYTHONPATH": str(HOOKS),
        "OMP_NUM_THREADS": "1",
        "VMRUN_TEST_HOOK_GATE": str(tmp_path / "gate"),
        "VMRUN_TEST_HOOK_GATE_AT": "1",
        **{f"VMRUN_TEST_HOOK_{k}": v for k, v in more.items()},
    }
    env.pop("WORLD_SIZE", None)  # one process: a world of 1
    argv = [
        sys.executable,
        str(TEMPLATE_PATH),
        str(epochs),
        "10",
        "--dataset-size",
        "64",
        "--eval-size",
        "32",
        "--out-dir",
        str(tmp_path),
    ]
    return env, argv


def test_the_shipped_template_has_no_test_hook() -> None:
    text = TEMPLATE_PATH.read_text()
    for trace in ("VMRUN_TEST_HOOK", "VMRUN_TEMPLATE_", "sleep("):
        assert trace not in text, trace


def test_the_hooks_leave_every_other_process_alone() -> None:
    """torchrun's agent and vmrun's host scripts start with the same PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(HOOKS), "VMRUN_TEST_HOOK_EPOCH_DELAY": "100"}
    probe = "import sys; print(sorted(m for m in sys.modules if 'torch' in m), end='')"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and done.stdout == "[]", done.stdout + done.stderr


def test_a_gated_run_waits_after_its_epoch_until_the_gate_opens(tmp_path: Path) -> None:
    """VMRUN_TEST_HOOK_GATE: the recovery tests' run cannot end before they lose a node."""
    gate = tmp_path / "gate"
    env, argv = _gated(tmp_path, 2)
    metrics = tmp_path / "metrics.jsonl"
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as run:
        try:
            wait_for(
                lambda: metrics.is_file() and metrics.read_text().count("\n") == 1,
                60,
                "the first epoch",
            )
            time.sleep(0.5)  # held: a second epoch would take a few milliseconds
            assert run.poll() is None and metrics.read_text().count("\n") == 1
            gate.touch()
            assert run.wait(timeout=60) == 0, run.stderr.read() if run.stderr else ""
        finally:
            run.kill()
    assert metrics.read_text().count("\n") == 2


def test_a_gate_for_another_world_size_holds_nothing(tmp_path: Path) -> None:
    """VMRUN_TEST_HOOK_GATE_WORLD: a sweep's other sizes run through a closed gate."""
    env, argv = _gated(tmp_path, 2, GATE_WORLD="2")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_a_signal_noted_on_another_node_ends_this_epochs_hold_only(tmp_path: Path) -> None:
    """PATH.asked-EPOCH (left by a rank whose node got the notice) ends that epoch's hold
    here too, so the collective check comes on every node; the next epoch holds again."""
    gate = tmp_path / "gate"
    env, argv = _gated(tmp_path, 3)
    metrics = tmp_path / "metrics.jsonl"

    def epochs() -> int:
        return metrics.read_text().count("\n") if metrics.is_file() else 0

    with subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as run:
        try:
            wait_for(lambda: epochs() == 1, 60, "the first epoch")
            Path(f"{gate}.asked-1").touch()
            wait_for(lambda: epochs() == 2, 60, "the second epoch, the first hold ended")
            time.sleep(0.5)  # held again: a third epoch would take a few milliseconds
            assert run.poll() is None and epochs() == 2
            gate.touch()
            assert run.wait(timeout=60) == 0, run.stderr.read() if run.stderr else ""
        finally:
            run.kill()
    assert epochs() == 3
