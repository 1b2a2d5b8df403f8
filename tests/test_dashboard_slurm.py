"""`vmrun dashboard` in a project with a real Slurm cluster (tests/testbed/slurm.py): the GPUs
page's API has the GPUs of the nodes the user's running job holds, as `watch-gpus -C` reads
them (an `srun --overlap` step per node, nvidia-smi the recording stand-in), with no -C given
(the project's clusters), and leaves no step behind when the server ends."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, wait_for
from test_cli_slurm_gpus import assert_no_step_left, standin, submit
from web_helpers import Lines

__all__ = ["standin"]  # the fixture, shared with `watch-gpus -C`'s tests


def _clusters(base: str, token: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"{base}/api/gpus/clusters", headers={"X-Vmrun-Token": token})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return list(json.loads(resp.read())["clusters"])


def test_the_gpus_page_has_the_clusters_running_jobs(
    slurm_cluster: Any, slurm_client: Client, standin: dict[str, Path]
) -> None:
    job = submit(slurm_cluster, "-N1", "-w", "vmt-c2")
    lines = Lines(slurm_client.popen("dashboard", "--port", "0"))
    try:
        base, token = lines.url(60).split("/?token=")
        want = f"vmt-c2 (job {job})"

        def seen() -> dict[str, Any] | None:
            (bed,) = _clusters(base, token)
            hosts = [h for h in bed["hosts"] if h["host"] == want and h["gpus"]]
            return hosts[0] if hosts else None

        host = wait_for(seen, 60, f"{want}'s GPUs on the page")
        assert isinstance(host, dict) and host["state"] == "ok", host
        assert [g["name"] for g in host["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
        assert all(isinstance(g["health"], list) for g in host["gpus"])
        code, err = lines.finish(signal.SIGINT)
        assert code == 0, err
    finally:
        if lines.proc.poll() is None:
            lines.finish(signal.SIGKILL)
    assert_no_step_left(slurm_cluster, job, standin)


pytestmark = pytest.mark.timeout(300)
