"""GPU health on the multi-node test hosts: `vmrun doctor` names a sick GPU, and `vmrun
train` refuses to start on it. No GPU here, so `nvidia-smi -q` and the kernel log are the
STAND-INs (tests/standins/nvidia-smi and dmesg, in ~/.vmrun/bin, the PATH vmrun's
commands see first), replaying outputs recorded on real GPUs (tests/fixtures/gpu_health,
their sources in its SOURCES.md); the rest is real: sshd, the host script, vmrun."""

from __future__ import annotations

import re

import pytest
from conftest import Client
from gpu_standins import FIXTURES, HEALTHY, SICK, install
from testbed import TestHost


def rows(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"(\S+)\s+(\S+)\s+(OK|WARN|FAIL|SKIP)\s+(.*)", line)
        if match:
            found[(match.group(1), match.group(2))] = (match.group(3), match.group(4))
    return found


def _project(multi: Client) -> None:
    """n1 and n2, each pointed at the stand-in as a host with GPUs would be found."""
    text = (multi.cwd / "vmrun.toml").read_text()
    (multi.cwd / "vmrun.toml").write_text(
        text.replace("python = ", 'nvidia_smi = "~/.vmrun/bin/nvidia-smi"\npython = ')
    )


@pytest.mark.timeout(300)
def test_doctor_names_the_sick_gpu_and_train_will_not_start_on_it(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    xids = [
        line
        for line in (FIXTURES / "xid_lines.txt").read_text().splitlines()
        if "Xid (PCI:0000:19:00): 48" in line
    ][:1]
    install(cluster["n1"], HEALTHY, [])
    install(cluster["n2"], SICK, xids)
    _project(multi)
    done = multi.vmrun("doctor", "--no-allreduce", timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    found = rows(done.stdout)
    assert found[("gpu-health", "n1")][0] == "OK", done.stdout
    assert found[("gpu-health", "n1")][1].startswith("8 GPU(s): no ECC"), done.stdout
    verdict, detail = found[("gpu-health", "n2")]
    assert verdict == "FAIL", done.stdout
    assert "a row remapping is pending" in detail and "Xid 48" in detail, detail

    refused = multi.vmrun("train", "-H", "n2", "--epochs", "1", timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "error[gpu-unhealthy]" in refused.stderr and "n2" in refused.stderr, refused.stderr
    assert "nothing was started" in refused.stderr
    assert not (cluster["n2"].home / ".vmrun" / "runs").exists() or not any(
        (cluster["n2"].home / ".vmrun" / "runs").iterdir()
    )

    anyway = multi.vmrun("train", "-H", "n2", "--epochs", "1", "--ignore-gpu-health", timeout=240)
    assert anyway.returncode == 0, anyway.stdout + anyway.stderr


@pytest.mark.timeout(300)
def test_a_gpu_that_only_runs_slow_is_said_and_the_run_starts(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    install(cluster["n1"], "nvsmi_q_h100x8_535.161.08_hw_slowdown.txt", [])
    _project(multi)
    done = multi.vmrun("train", "-H", "n1", "--epochs", "1", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"n1: GPU \S+: clocks held down: HW Slowdown", done.stderr), done.stderr
