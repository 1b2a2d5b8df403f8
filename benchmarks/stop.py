"""`vmrun stop --grace G` on a host with many processes: how long it takes, against the grace.

Goal (the "runs that tell the truth" issue): the grace is wall-clock time, so stopping a run
that ignores SIGTERM takes about G plus the KILL, and stays within G + 2 s however many other
processes the host has. Before, the wait counted 0.1 s ticks while each tick re-read every
process's environment with two processes per pid: a 10 s grace took ~22 s on a quiet host.

Runs the real CLI against a netns test host (root only; see tests/testbed): starts N other
processes of the host's user (`sleep`, in a run of their own), then for each grace a run that
ignores SIGTERM, and times `vmrun stop RUN --grace G` from this machine (connection
included), with the bare `ssh host true` round trip for scale.

    sudo python benchmarks/stop.py [--crowd 2000] [--grace 2 --grace 10] [--rounds 3]

Measured here (2 shared cores, netns test host, medians of 3), 2,000 other processes of the
host's user, the connection included: grace 2 s -> 2.96 s, grace 10 s -> 10.90 s (the
floor, `vmrun exec -- true`, 0.15 s). Before, a 10 s grace took ~22 s on a quiet host.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from bench_common import client_dirs  # noqa: E402
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402


def _wait(predicate, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crowd", type=int, default=2000)
    parser.add_argument("--grace", type=float, action="append")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    graces = args.grace or [2.0, 10.0]
    reason = skip_reason_no_netns()
    if reason:
        sys.exit(f"needs the netns test bed: {reason}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetnsBed(Path(tmp) / "bed", ClientKeys.generate(Path(tmp) / "keys")) as bed,
    ):
        host = bed.add_host("s1")
        home, cwd, env = client_dirs(bed, Path(tmp))

        def vmrun(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "vmrun", *argv, "-H", host.name],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )

        from vmrun.backends.hosts import records
        from vmrun.ssh.connection import Connection

        crowd = f"i=0; while [ $i -lt {args.crowd} ]; do sleep 3600 & i=$((i+1)); done; wait"
        stubborn = "trap '' TERM; while :; do sleep 0.2; done"
        from vmrun.config import load_settings

        settings = load_settings({}, cwd=cwd, environ={"HOME": str(home)})
        with Connection(host.name, settings) as conn:
            records.start(conn, "crowd", ".", ["sh", "-c", crowd], {})
            _wait(lambda: len(host.user_pids()) >= args.crowd, 300, f"{args.crowd} processes")
            ssh_rtt = []
            for _ in range(args.rounds):
                began = time.monotonic()
                vmrun("exec", "--", "true")
                ssh_rtt.append(time.monotonic() - began)
            print(f"host {host.name}: {len(host.user_pids())} processes of its user")
            print(f"vmrun exec -- true: {statistics.median(ssh_rtt):.2f} s (the floor)")
            print("grace   stop took (median)   over the grace")
            try:
                for grace in graces:
                    took = []
                    for r in range(args.rounds):
                        rid = f"stubborn-{int(grace)}-{r}"
                        records.start(conn, rid, ".", ["sh", "-c", stubborn], {})
                        log = host.home / ".vmrun/runs" / rid / "pid"
                        _wait(log.exists, 60, "the run to start")
                        began = time.monotonic()
                        done = vmrun("stop", rid, "--grace", f"{grace:g}")
                        took.append(time.monotonic() - began)
                        if done.returncode != 0 or "SIGKILL" not in done.stdout:
                            sys.exit(f"stop failed: {done.stdout}{done.stderr}")
                    mid = statistics.median(took)
                    print(f"{grace:5.1f}   {mid:8.2f} s            {mid - grace:+6.2f} s")
            finally:
                records.stop(conn, "crowd", grace=1)


if __name__ == "__main__":
    main()
