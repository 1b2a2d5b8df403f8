"""`vmrun setup` first run vs a re-run that has nothing to do, on a real sshd test host.

Goal (setup issue): a re-run costs a few SSH round trips, well under 3 s on loopback.
Two cases, each timed as medians over fresh first runs (the host's ~/.vmrun wiped before
each) and over re-runs:

* python: `--python PATH`, an interpreter that already has torch (the first run only verifies);
* venv: `--env-manager venv --torch torch==2.13.0 --wheelhouse DIR`, the air-gapped path: the first
  run uploads the wheelhouse, makes the venv and pip-installs torch's CPU build from it.

Needs root (a network-namespace test host) and the test cache (/opt/vmrun-test-cache: the
interpreter with torch and the torch wheelhouse; run the test suite once to fill it).

    python benchmarks/setup_rerun.py [--runs 5] [--first-runs 3] [--cases python,venv]

Measured on this development machine (2 CPUs, Debian 12, netns test host over a veth), 2026-11-23:

    case     first run (median)   re-run (median)   re-run / first
    python      2.84 s (n=3)        0.82 s (n=5)        0.29
    venv       53.84 s (n=2)        1.34 s (n=5)        0.025
    vmrun exec -- true: 0.47-0.70 s (the floor: CLI start, connect, one command)

(each case in its own invocation; venv samples: first 39.8 / 67.9 s, re-run 0.83-1.68 s.)
A re-run is facts + checks (two round trips after connecting; the venv case also checks the
wheelhouse upload, which is why it costs more), well under the 3 s goal. An
earlier run while the machine was busy measured python 8.42 s / 2.71 s and venv 89.0 s /
0.74 s: absolute times move with load; the re-run stays a small multiple of the exec floor.
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
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from testbed import ClientKeys, NetnsBed  # noqa: E402

CACHE = Path("/opt/vmrun-test-cache")
CACHED_PYTHON = CACHE / "venv-py3-torch-2.13.0" / "bin" / "python"
CACHED_WHEELHOUSE = CACHE / "wheelhouse-torch-2.13.0"


def _timer(cmd: list[str], cwd: Path, env: dict[str, str]) -> Callable[[], float]:
    def timed() -> float:
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start

    return timed


def _secs(samples: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="re-runs per case")
    parser.add_argument("--first-runs", type=int, default=3, help="fresh first runs per case")
    parser.add_argument("--cases", default="python,venv", help="python, venv or both")
    parser.add_argument("--python", default=str(CACHED_PYTHON))
    parser.add_argument("--wheelhouse", default=str(CACHED_WHEELHOUSE))
    args = parser.parse_args()
    cases = {
        "python": ["--python", args.python],
        "venv": [
            *("--env-manager", "venv", "--torch", "torch==2.13.0"),
            *("--wheelhouse", args.wheelhouse),
        ],
    }
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(chosen) - set(cases)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: python, venv")
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    keys = ClientKeys.generate(work / "keys")
    results: list[tuple[str, list[float], list[float]]] = []
    with NetnsBed(work / "bed", keys) as bed:
        host = bed.add_host("h1")
        home = work / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(bed.ssh_config_text())
        (home / ".ssh" / "known_hosts").write_text(bed.known_hosts_text())
        project = work / "project"
        project.mkdir()
        env = {**os.environ, "HOME": str(home), "NO_COLOR": "1"}
        env.pop("SSH_AUTH_SOCK", None)
        base = [sys.executable, "-m", "vmrun", "setup", "h1", "--no-record"]
        for case in chosen:
            timed = _timer([*base, *cases[case]], project, env)
            firsts = []
            for _ in range(args.first_runs):
                shutil.rmtree(host.home / ".vmrun", ignore_errors=True)  # a fresh host again
                firsts.append(timed())
            again = [timed() for _ in range(args.runs)]
            results.append((case, firsts, again))
        floor = statistics.median(
            _timer(
                [sys.executable, "-m", "vmrun", "exec", "-H", "h1", "--", "true"], project, env
            )()
            for _ in range(args.runs)
        )
    shutil.rmtree(work, ignore_errors=True)
    for case, firsts, again in results:
        first, rerun = statistics.median(firsts), statistics.median(again)
        print(
            f"{case:7s} first run (median of {len(firsts)}): {first:7.2f} s   re-run (median of"
            f" {len(again)}): {rerun:5.2f} s   re-run / first: {rerun / first:.3f}"
        )
        print(f"        samples: first {_secs(firsts)}; re-run {_secs(again)}")
    print(f"vmrun exec -- true (median): {floor:.2f} s  (CLI start + connect + 1 command)")


if __name__ == "__main__":
    main()
