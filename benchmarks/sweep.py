"""`vmrun sweep` on two test hosts: what the sweep costs beyond its runs' own time.

Runs `vmrun sweep --nodes 1,2 --nproc-per-node 1,2` (4 sizes, the template with --task
classify) on two network-namespace test hosts, then prints the scaling report it wrote and
the sweep's wall time against the sum of its runs' durations (the runs as the report measures
them: first start to end on the host). The difference is vmrun's share: per size a CLI-free
start (connections, preflight, staging the template, rendezvous wiring), following, and the
final verified fetch of the run's results. Needs root and the test cache's interpreter with
torch. `--picture FILE` keeps the sweep's accuracy plot (docs/sweep-accuracy.png is made so).

    python benchmarks/sweep.py [--epochs 10] [--picture accuracy.png]

Measured here (2 cores, 4 sizes x 10 epochs of --task classify): sweep 36.0 s, runs 23.5 s,
vmrun's share 3.1 s per size (wall / runs = 1.53).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--python", default=CACHED_PYTHON)
    parser.add_argument("--picture", type=Path, help="copy the sweep's accuracy.png here")
    args = parser.parse_args()
    if not Path(args.python).exists():
        sys.exit(f"no {args.python}: run the test suite once (it builds that interpreter)")
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    try:
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed:
            for name in ("n1", "n2"):
                bed.add_host(name, hosts_file_loopback_hostname=True)
            _, project, env = client_dirs(bed, work)
            (project / "vmrun.toml").write_text(
                "".join(
                    f'[[hosts]]\naddress = "{n}"\npython = "{args.python}"\n\n'
                    for n in ("n1", "n2")
                )
            )
            env.update(NO_COLOR="1", OMP_NUM_THREADS="1")
            argv = [
                sys.executable,
                "-m",
                "vmrun",
                "sweep",
                "--nodes",
                "1,2",
                "--nproc-per-node",
                "1,2",
                "--epochs",
                str(args.epochs),
                "--task",
                "classify",
            ]
            began = time.perf_counter()
            done = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - began
            if done.returncode != 0:
                sys.exit(f"vmrun sweep failed ({done.returncode}):\n{done.stderr[-3000:]}")
            folder = next((project / "results").glob("sweep-*"))
            rows = json.loads((folder / "report.json").read_text())
            print((folder / "report.md").read_text())
            if args.picture:
                shutil.copy(folder / "accuracy.png", args.picture)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runs = sum(float(r["total_time_s"] or 0) for r in rows)
    print(f"sweep wall time: {wall:.1f} s for {len(rows)} sizes; the runs themselves: {runs:.1f} s")
    print(
        f"vmrun's share: {(wall - runs) / len(rows):.1f} s per size"
        f" (wall / runs = {wall / runs:.2f})"
    )


if __name__ == "__main__":
    main()
