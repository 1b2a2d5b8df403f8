"""A Slurm controller that stops answering during a run (tests/testbed/slurm.py stops and
starts slurmctld by pid): `vmrun train -C` rides it out and the run ends as the job does."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conftest import Client, wait_for
from test_cli_slurm import use_cluster


def test_a_controller_outage_during_a_run_is_ridden_out_and_the_run_finishes(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    use_cluster(slurm_client, host_python)
    flag = slurm_cluster.shared / "go"  # the job runs until it exists
    train = slurm_client.popen(
        "train", "-C", "bed", "wait_for_file.py", "--launcher", "python", "--", str(flag)
    )
    out: list[str] = []
    notes: list[str] = []
    readers = [
        threading.Thread(target=lambda: out.extend(train.stdout or ()), daemon=True),
        threading.Thread(target=lambda: notes.extend(train.stderr or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        wait_for(lambda: any("waiting for the flag" in ln for ln in out), 120, "the job running")
        slurm_cluster.stop_slurmctld()
        try:
            # squeue gives up on the controller after its own timeout (about 10 s)
            seen = lambda: any("cannot reach the controller" in n for n in notes)  # noqa: E731
            wait_for(lambda: seen() or train.poll() is not None, 60, "squeue to fail")
            assert train.poll() is None, "the run was reported ended: " + "".join(notes)
        finally:
            slurm_cluster.start_slurmctld()
        wait_for(lambda: any("answers again" in n for n in notes), 60, "squeue to answer")
        assert train.poll() is None, "".join(notes)
        flag.touch()
        train.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=10)
    finally:
        train.kill()
    text = "".join(notes) + "".join(out)
    assert train.returncode == 0, text
    assert any("flag seen" in ln for ln in out), text
    assert "ended" not in "".join(notes) and "cannot open" not in text, text
