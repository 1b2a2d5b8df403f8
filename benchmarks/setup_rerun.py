"""`vmrun setup` first run vs a re-run that has nothing to do, on a real sshd test host.

Goal (setup issue): a re-run costs a few SSH round trips, well under 3 s on loopback.
Needs root (a network-namespace test host) and the test cache's interpreter with torch
(run the test suite once, or pass --python PATH to an interpreter with torch).

    python benchmarks/setup_rerun.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from testbed import ClientKeys, NetnsBed  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--python", default="/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    keys = ClientKeys.generate(work / "keys")
    with NetnsBed(work / "bed", keys) as bed:
        bed.add_host("h1")
        home = work / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(bed.ssh_config_text())
        (home / ".ssh" / "known_hosts").write_text(bed.known_hosts_text())
        project = work / "project"
        project.mkdir()
        env = {**os.environ, "HOME": str(home), "NO_COLOR": "1"}
        env.pop("SSH_AUTH_SOCK", None)
        cmd = [sys.executable, "-m", "vmrun", "setup", "h1", "--python", args.python, "--no-record"]

        def timed() -> float:
            start = time.perf_counter()
            subprocess.run(cmd, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - start

        first = timed()
        again = [timed() for _ in range(args.runs)]
        ssh = [sys.executable, "-m", "vmrun", "exec", "-H", "h1", "--", "true"]

        def timed_exec() -> float:
            start = time.perf_counter()
            subprocess.run(ssh, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - start

        floor = statistics.median(timed_exec() for _ in range(args.runs))
    rerun = statistics.median(again)
    print(f"first run (verify imports torch):   {first:6.2f} s")
    print(f"re-run, nothing to do (median):     {rerun:6.2f} s")
    print(f"vmrun exec -- true (median):        {floor:6.2f} s  (CLI start + connect + 1 cmd)")
    print(f"re-run / first: {rerun / first:.2f}   re-run / exec: {rerun / floor:.2f}")


if __name__ == "__main__":
    main()
