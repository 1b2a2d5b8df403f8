"""What a queue of your own machines costs (issue 43): the time to a working Slurm cluster of
3 hosts with the packages present, and how long a job waits to start there, against
`train -H` on the same hosts.

The test bed: three service hosts (tests/testbed/services.py: reached as root, their own
Slurm and munge folders, the systemctl stand-in), Debian's slurm-wlm and munge, the test
hosts' interpreter (torch 2.13, CPU).

- make: `vmrun setup -H b1 -H b2 -H b3 --slurm bench --shared DIR` (the hosts' setup, then
  the cluster: facts, key, files, daemons, until every node is idle in sinfo), and the
  Slurm part alone as the command reports it; then the same command again (nothing to do);
- start: `vmrun train -C bench first_line.py` against `vmrun train -H b1 first_line.py`, the
  seconds from the command's start to the script's first output line (a script that prints
  and exits, so the time is vmrun's, Slurm's and Python's start), alternated, the median.

    sudo python benchmarks/queue.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import client_dirs  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"
SCRIPT = "import socket\nprint('FIRST', socket.gethostname(), flush=True)\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm
    from testbed.services import add_service_host, skip_reason_no_service_hosts

    if reason := skip_reason_no_service_hosts():
        raise SystemExit(reason)
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-queuebench-"))
    try:
        with NetnsBed(work / "bed", ClientKeys.generate(work / "keys")) as bed:
            for name in ("b1", "b2", "b3"):
                add_service_host(bed, name)
            shared = bed.home_root / bed.prefix / "shared"
            shared.mkdir()
            _home, cwd, env = client_dirs(bed, work)
            (cwd / "first_line.py").write_text(SCRIPT)
            made = measure_make(cwd, env, shared)
            start = measure_start(cwd, env, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({**made, **start}, indent=1))


def vmrun(cwd: Path, env: dict[str, str], *args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vmrun", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"vmrun {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def measure_make(cwd: Path, env: dict[str, str], shared: Path) -> dict[str, object]:
    argv = [
        "setup",
        "-H",
        "b1",
        "-H",
        "b2",
        "-H",
        "b3",
        "--slurm",
        "bench",
        "--shared",
        str(shared),
        "--env-manager",
        "python",
        "--python",
        CACHED_PYTHON,
    ]
    results: dict[str, object] = {}
    for key in ("make_first", "make_again"):
        started = time.monotonic()
        said = vmrun(cwd, env, *argv)
        results[f"{key}_s"] = round(time.monotonic() - started, 2)
        slurm = re.search(r"cluster bench: .*\((\d+\.\d)s\)", said)
        results[f"{key}_slurm_part_s"] = float(slurm.group(1)) if slurm else None
    return results


def first_line_after(cwd: Path, env: dict[str, str], *args: str) -> float:
    """Seconds from the command's start to the script's first output line."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmrun", "train", *args, "first_line.py"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = None
    for line in proc.stdout:
        if "FIRST " in line and seen is None:
            seen = time.monotonic() - started
    if proc.wait() != 0 or seen is None:
        raise SystemExit(f"vmrun train {' '.join(args)} failed")
    return seen


def measure_start(cwd: Path, env: dict[str, str], rounds: int) -> dict[str, object]:
    cluster, hosts = [], []
    for _ in range(rounds):
        cluster.append(first_line_after(cwd, env, "-C", "bench", "--nproc-per-node", "1"))
        hosts.append(first_line_after(cwd, env, "-H", "b1", "--nproc-per-node", "1"))
    c, h = statistics.median(cluster), statistics.median(hosts)
    return {
        "start_cluster_s": round(c, 2),
        "start_hosts_s": round(h, 2),
        "start_ratio_cluster_over_hosts": round(c / h, 2),
        "start_cluster_all_s": [round(x, 2) for x in cluster],
        "start_hosts_all_s": [round(x, 2) for x in hosts],
    }


if __name__ == "__main__":
    main()
