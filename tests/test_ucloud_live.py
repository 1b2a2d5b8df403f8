"""Opt-in, against a real UCloud account: skipped unless VMRUN_UCLOUD_LIVE=1 and a token
(VMRUN_UCLOUD_TOKEN, a refresh or API token; VMRUN_UCLOUD_PROJECT where the grant is a
project's; VMRUN_UCLOUD_TYPE, the VM product, default u1-standard-2). The suite itself
tests against the STAND-IN (tests/testbed/ucloud.py) only, and never dials UCloud.

`vmrun up` of one VM, a command over SSH on it, `vmrun clusters`, `vmrun down`: what it
made is terminated at the end whatever happened (the provider's own terminate by label,
then a check that no job of the cluster is left), and it costs a few minutes of the
product's price."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import wait_for

LIVE = os.environ.get("VMRUN_UCLOUD_LIVE") == "1" and bool(os.environ.get("VMRUN_UCLOUD_TOKEN"))
pytestmark = [
    pytest.mark.netns,  # never in the quick tier
    pytest.mark.skipif(not LIVE, reason="a live UCloud test: VMRUN_UCLOUD_LIVE=1 and a token"),
]


def _vmrun(cwd: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vmrun", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_up_exec_clusters_down_on_a_real_ucloud_account(tmp_path: Path) -> None:
    from vmrun.providers.ucloud.provider import UCloudProvider

    name = f"vmrun-live-{uuid.uuid4().hex[:6]}"
    product = os.environ.get("VMRUN_UCLOUD_TYPE") or "u1-standard-2"
    try:
        up = _vmrun(tmp_path, "up", name, "--cloud", "ucloud", "--type", product, "-n", "1")
        assert up.returncode == 0, up.stderr + up.stdout
        ran = _vmrun(tmp_path, "exec", "-H", f"@{name}", "--", "uname", "-m", timeout=300)
        assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr + ran.stdout
        listed = _vmrun(tmp_path, "cloud", "--cloud", "ucloud", timeout=300)
        assert listed.returncode == 0 and name in listed.stdout, listed.stderr + listed.stdout
        down = _vmrun(tmp_path, "down", name, timeout=600)
        assert down.returncode == 0, down.stderr + down.stdout
    finally:
        provider = UCloudProvider()
        provider.terminate(name, "")  # whatever a failure left
        wait_for(lambda: provider.describe(name, "") == [], 300, "every job of the test ended")
