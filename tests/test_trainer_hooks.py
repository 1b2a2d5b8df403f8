"""The template trainer is an example to copy: its test behaviour lives in tests/trainer_hooks
(a sitecustomize on the test runs' PYTHONPATH), never in the shipped file."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT

from vmrun.trainer import TEMPLATE_PATH

HOOKS = ROOT / "tests" / "trainer_hooks"


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
