"""Slurm: submit to the first epoch line, vmrun against a hand-written sbatch of the same
script on the same bed; and `vmrun status -C` with 200 jobs in the queue.

Goals (Slurm issue): `vmrun train -C` within 1.2x of `ssh login sbatch job.sh` + watching
its output file; `vmrun status -C` with 200 queued jobs in one round trip and under 1 s.
The hand-written path is timed generously: its output file is watched on the shared
filesystem directly (no SSH round trips), while vmrun's time includes its CLI start, the
connection, the batch script and following the job over SSH. Needs root (network-namespace
test hosts), Debian's slurm-wlm and munge, and the test cache's interpreter with torch.

    python benchmarks/slurm.py [--runs 3]

Measured here (2 cores, Slurm 22.05 in the bed, medians of 3): hand-written sbatch 12.43 s,
vmrun train -C 10.17 s: 0.82x (vmrun's job is picked up by the first scheduling pass as
soon as it is queued, as the hand-written one is; the difference is within the scheduler's
one-second cycle and torch's start). status -C with 200 jobs queued: 0.33 s for the whole
CLI, 1 command on the login node.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"
HAND_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun bash -c '{python} -m torch.distributed.run --nnodes=$SLURM_NNODES \\
  --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint='$MASTER_ADDR':29500 \\
  --rdzv-id=$SLURM_JOB_ID {template} 3 1 --out-dir {results}'
"""


def until_first_epoch_in_file(argv: list[str], out: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    deadline = start + 300
    while time.perf_counter() < deadline:
        if out.exists() and "epoch 1/" in out.read_text(errors="replace"):
            return time.perf_counter() - start
        time.sleep(0.02)
    raise RuntimeError(f"no epoch line in {out}")


def until_first_epoch(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "epoch 1/" in line:
                return time.perf_counter() - start
        raise RuntimeError(f"{argv[:4]} ended without an epoch line")
    finally:
        proc.wait(timeout=300)


def sessions(cluster: object) -> int:
    """Commands the login node's sshd has started so far (LogLevel VERBOSE logs each)."""
    text = cluster.login.sshd_log()  # type: ignore[attr-defined]
    return len(re.findall(r"Starting session: command", text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--python", default=CACHED_PYTHON)
    parser.add_argument("--queued", type=int, default=200)
    args = parser.parse_args()
    from testbed.slurm import SlurmCluster, skip_reason_no_slurm

    reason = skip_reason_no_slurm()
    if reason or os.geteuid() != 0:
        sys.exit(f"benchmarks/slurm.py: cannot run here: {reason or 'needs root'}")
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    try:
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed, SlurmCluster(bed) as cluster:
            home, project, env = client_dirs(bed, work)
            env["NO_COLOR"] = "1"
            (project / "vmrun.toml").write_text(
                f'[[clusters]]\nname = "bed"\nlogin = "login"\npython = "{args.python}"\n'
                'env = { OMP_NUM_THREADS = "1" }\n'
            )
            login = cluster.login
            template = login.home / "template.py"
            shutil.copy(ROOT / "vmrun" / "trainer" / "template.py", template)
            os.chown(template, login.uid, login.gid)
            config, known = home / ".ssh" / "config", home / ".ssh" / "known_hosts"
            ssh = [
                "ssh",
                "-F",
                str(config),
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "BatchMode=yes",
                "login",
            ]
            hand, ours = [], []
            for i in range(args.runs):  # interleaved, so drift hits both alike
                out = login.home / f"hand-{i}.out"
                job = login.home / f"hand-{i}.sh"
                job.write_text(
                    HAND_JOB.format(
                        out=out,
                        python=args.python,
                        template=template,
                        results=login.home / f"hand-{i}",
                    )
                )
                os.chown(job, login.uid, login.gid)
                hand.append(until_first_epoch_in_file([*ssh, "sbatch", str(job)], out, env))
                cluster.cancel_all_and_wait(timeout=120)
                vmrun = [
                    sys.executable,
                    "-m",
                    "vmrun",
                    "train",
                    "-C",
                    "bed",
                    "--nodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--",
                    "3",
                    "1",
                ]
                ours.append(until_first_epoch(vmrun, project, env))
                cluster.cancel_all_and_wait(timeout=120)
            held = cluster.run_on_login(
                [
                    "sh",
                    "-c",
                    f"i=0; while [ $i -lt {args.queued} ]; do sbatch -H --wrap true"
                    " >/dev/null || exit 1; i=$((i+1)); done",
                ],
                timeout=600,
            )
            assert held.returncode == 0, held.stderr
            before = sessions(cluster)
            t0 = time.perf_counter()
            argv = [sys.executable, "-m", "vmrun", "status", "-C", "bed"]
            status = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True)
            status_s = time.perf_counter() - t0
            trips = sessions(cluster) - before
            assert status.returncode == 0, status.stderr
            queued = len(cluster.squeue_ids())
            cluster.cancel_all_and_wait(timeout=300)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hand_s, ours_s = statistics.median(hand), statistics.median(ours)
    print(f"hand-written sbatch, submit to first epoch line, median: {hand_s:6.2f} s")
    print(f"vmrun train -C, median:                                 {ours_s:6.2f} s")
    print(f"ratio vmrun / hand-written sbatch: {ours_s / hand_s:.2f} (goal <= 1.2)")
    print(
        f"vmrun status -C with {queued} jobs queued: {status_s:.2f} s (whole CLI), "
        f"{trips} command(s) on the login node (goal: 1, < 1 s)"
    )


if __name__ == "__main__":
    main()
