"""Opt-in, against a real UCloud account: skipped unless VMRUN_UCLOUD_LIVE=1 and a token
(VMRUN_UCLOUD_TOKEN, a refresh or API token; VMRUN_UCLOUD_PROJECT where the grant is a
project's; VMRUN_UCLOUD_TYPE, the VM product, default u1-standard-2). The suite itself
tests against the STAND-IN (tests/testbed/ucloud.py) only, and never dials UCloud.

`vmrun up -n 2` (two VMs joined by a private network), first what source reading left
unconfirmed: each VM resolves its peer's hostname, and the interface holding that address
(KubeVirt's binding: masquerade would show 10.0.2.x); then `vmrun cloud`, `vmrun setup`
(VMRUN_UCLOUD_TORCH, default the newest CPU torch) and an all-reduce between the two VMs
over gloo (`vmrun train` of a two-line script), and `vmrun down`. What it made is removed
at the end whatever happened (the provider's terminate: jobs, network, key; then a check
that nothing of the cluster is left), and it costs a few minutes of the product's price."""

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


ALL_REDUCE = """import torch, torch.distributed as dist
dist.init_process_group("gloo"); t = torch.ones(1) * (dist.get_rank() + 1); dist.all_reduce(t)
print("sum", int(t.item()), "of", dist.get_world_size())
"""


def test_two_vms_joined_by_a_private_network_all_reduce_on_a_real_ucloud_account(
    tmp_path: Path,
) -> None:
    from vmrun.providers.ucloud.provider import UCloudProvider

    name = f"vmrun-live-{uuid.uuid4().hex[:6]}"
    product = os.environ.get("VMRUN_UCLOUD_TYPE") or "u1-standard-2"
    torch = os.environ.get("VMRUN_UCLOUD_TORCH") or "torch"
    (tmp_path / "allreduce.py").write_text(ALL_REDUCE)
    try:
        up = _vmrun(tmp_path, "up", name, "--cloud", "ucloud", "--type", product, "-n", "2")
        assert up.returncode == 0, up.stderr + up.stdout
        for peer in (f"{name}-1", f"{name}-0"):  # the network's names, and their interface
            ran = _vmrun(
                tmp_path,
                "exec",
                "-H",
                f"@{name}",
                "--",
                "sh",
                "-c",
                f"getent hosts {peer}; ip -o -4 addr show",
                timeout=300,
            )
            assert ran.returncode == 0 and peer in ran.stdout, ran.stderr + ran.stdout
        listed = _vmrun(tmp_path, "cloud", "--cloud", "ucloud", timeout=300)
        assert listed.returncode == 0 and "private-network" in listed.stdout, listed.stdout
        setup = _vmrun(tmp_path, "setup", f"@{name}", "--torch", torch, timeout=1800)
        assert setup.returncode == 0, setup.stderr + setup.stdout
        train = _vmrun(
            tmp_path,
            "train",
            "allreduce.py",
            "-H",
            f"@{name}",
            "--nproc-per-node",
            "1",
            timeout=900,
        )
        assert train.returncode == 0 and "sum 3 of 2" in train.stdout, train.stderr + train.stdout
        down = _vmrun(tmp_path, "down", name, timeout=600)
        assert down.returncode == 0, down.stderr + down.stdout
    finally:
        provider = UCloudProvider()
        provider.terminate(name, "")  # whatever a failure left
        wait_for(lambda: provider.describe(name, "") == [], 300, "every job of the test ended")
        assert provider._networks(name) == []
