"""The GPU health STAND-INs on a test host (no GPU here): `nvidia-smi -q` replaying an output
recorded on a real GPU (tests/fixtures/gpu_health, sources in its SOURCES.md) and `dmesg`
replaying recorded kernel lines, in ~/.vmrun/bin (first on the PATH of vmrun's commands)."""

from __future__ import annotations

import os
import shutil

from conftest import ROOT
from testbed import TestHost

STANDINS = ROOT / "tests" / "standins"
FIXTURES = ROOT / "tests" / "fixtures" / "gpu_health"
SICK = "nvsmi_q_a100x4_555.42.02_remap_pending_dram_ce.txt"  # a row remapping pending
HEALTHY = "nvsmi_q_h100x8_565.57.01.txt"


def install(host: TestHost, query: str, kernel_lines: list[str]) -> None:
    """The stand-ins in ~/.vmrun/bin: `nvidia-smi -q` replays `query`, `dmesg` the lines."""
    where = host.home / ".vmrun" / "bin"
    host.run(["mkdir", "-p", str(where)], as_user=True)
    replay = where / "nvidia-smi-replay"
    replay.mkdir(exist_ok=True)
    shutil.copy(STANDINS / "nvidia-smi", where / "nvidia-smi")
    shutil.copy(FIXTURES / query, replay / "q.txt")
    (replay / "starts.log").touch()
    shutil.copy(STANDINS / "dmesg", where / "dmesg")
    (where / "dmesg-replay.txt").write_text("".join(f"{x}\n" for x in kernel_lines))
    for path in [where, *where.rglob("*")]:
        os.chown(path, host.uid, host.gid)
