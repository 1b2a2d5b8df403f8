"""`vmrun submit job.sh -C` to the job's first output line, against the same by hand:
`ssh login 'cd code && sbatch job.sh'`, then `ssh login tail -F slurm-<id>.out` until the line.

Goal (the own-sbatch-script issue): <= 1.2x the hand path. Both submit the same script from
the same synced directory on the bed's real Slurm (the hand path's code is already there, as
after a user's earlier scp; vmrun's sync finds nothing to send); both are timed from the
command's start to the first line on this machine's stdout; interleaved, so drift hits both
alike, after one untimed round of each (slurmctld's first scheduling pass, vmrun's host-side
files installed once). Needs root (network-namespace test hosts), Debian's slurm-wlm and
munge.

    python benchmarks/submit.py [--runs 5]

Measured here (2 cores, Slurm 22.05 in the bed, medians of 5): by hand 2.42 s, vmrun submit
2.39 s: 0.99x (both wait for the same scheduler tick; vmrun's CLI start, connection, probe
and nothing-to-send sync take about what the hand path's two ssh connections take).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed  # noqa: E402

JOB = "#!/bin/bash\n#SBATCH --job-name=first\necho first line\nsleep 1\n"


def until_line(argv: list[str], cwd: Path, env: dict[str, str], text: str) -> float:
    """Seconds from starting argv to `text` in its output."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if text in line:
                return time.perf_counter() - start
        raise RuntimeError(f"{argv[:4]} ended without {text!r}")
    finally:
        proc.kill()
        proc.wait(timeout=60)


def by_hand(ssh: list[str], code: str, project: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    job = subprocess.run(
        [*ssh, f"cd {code} && sbatch --parsable job.sh"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    jobid = job.stdout.strip().split(";")[0]
    tail = [*ssh, f"tail -n +1 -F {code}/slurm-{jobid}.out 2>/dev/null"]
    return time.perf_counter() - start + until_line(tail, project, env, "first line")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from testbed.slurm import SlurmCluster, skip_reason_no_slurm

    from vmrun.remote_paths import remote_workdir

    reason = skip_reason_no_slurm()
    if reason or os.geteuid() != 0:
        sys.exit(f"benchmarks/submit.py: cannot run here: {reason or 'needs root'}")
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    try:
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed, SlurmCluster(bed) as cluster:
            home, project, env = client_dirs(bed, work)
            env["NO_COLOR"] = "1"
            (project / "vmrun.toml").write_text('[[clusters]]\nname = "bed"\nlogin = "login"\n')
            (project / "job.sh").write_text(JOB)
            code = str(cluster.login.home / remote_workdir(project))
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
            vmrun = [sys.executable, "-m", "vmrun", "submit", "job.sh", "-C", "bed"]
            hand, ours = [], []
            for i in range(args.runs + 1):  # round 0 untimed: warm-up of both
                a = until_line(vmrun, project, env, "first line")
                cluster.cancel_all_and_wait(timeout=120)
                b = by_hand(ssh, code, project, env)
                cluster.cancel_all_and_wait(timeout=120)
                if i:
                    ours.append(a)
                    hand.append(b)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hand_s, ours_s = statistics.median(hand), statistics.median(ours)
    print(f"by hand (ssh sbatch + ssh tail -F), to the first line, median: {hand_s:6.2f} s")
    print(f"vmrun submit, median:                                           {ours_s:6.2f} s")
    print(f"ratio vmrun / by hand: {ours_s / hand_s:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
