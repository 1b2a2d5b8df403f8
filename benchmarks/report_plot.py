"""`vmrun report` and `vmrun plot -o` over 10 runs: how long a user waits, warm.

Builds a project whose results/ holds 10 runs of 50 epochs each (metrics.jsonl as the
template writes it, with eval_loss and accuracy; half as `train --local` leaves a run, half
as `fetch` leaves a run of two hosts, a folder per host), then times the real CLI (`python -m
vmrun`, a child process each time): `report`, `report --json`, `report --markdown`, `plot -o
x.png` and `plot -o x.svg`, after one warm-up run each; medians of 5. Goal (issue "See what
a run did"): each under 2 s.

    python benchmarks/report_plot.py [--runs 5]

Measured here (2 cores shared with other work, so plot varies with the load; medians of 5,
three runs): `vmrun --version` 0.04-0.06 s; `report`, `report --json` and `report --markdown`
0.10-0.12 s each (in a terminal, with rich's table: 0.30 s); `plot -o x.png` 0.77-1.48 s,
`plot -o x.svg` 0.78-1.44 s, of which importing matplotlib is about 0.6 s (the terminal plot,
without matplotlib: 0.25 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPOCHS = 50
T0 = 1_700_000_000.0


def _lines(world: int, seed: int) -> str:
    rate = 12_000.0 * world**0.9
    out = []
    for e in range(1, EPOCHS + 1):
        wobble = 1 + 0.03 * ((e * 7 + seed) % 5 - 2)
        loss = 2.3 * 0.93**e + 0.05
        out.append(
            json.dumps(
                {
                    "epoch": e,
                    "loss": loss,
                    "samples_per_s": rate * wobble,
                    "epoch_time_s": 65536 / (rate * wobble),
                    "world_size": world,
                    "lr": 0.1,
                    "eval_loss": loss * 1.1,
                    "accuracy": 1 - loss / 2.5,
                    "eval_accuracy": 1 - loss / 2.4,
                }
            )
        )
    return "\n".join(out) + "\n"


def build(project: Path) -> list[str]:
    """10 runs: worlds 1 to 16 on this machine, then 2 to 32 on two hosts."""
    ids = []
    for i, world in enumerate([1, 2, 4, 8, 16, 2, 4, 8, 16, 32]):
        rid = f"template-2024010{i // 5 + 1}-00000{i % 5}-{i:04x}"
        run = project / "results" / rid
        start = T0 + 600 * i
        if i < 5:
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text(_lines(world, i))
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(start))
            end = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(start + 300))
            (run / "run.json").write_text(
                json.dumps(
                    {
                        "id": rid,
                        "template": True,
                        "launcher": "torchrun",
                        "args": [str(EPOCHS), "5"],
                        "nproc": str(world),
                        "start_time": stamp,
                        "end_time": end,
                        "exit_code": 0,
                    }
                )
            )
        else:
            for h, host in enumerate(("n1", "n2")):
                place = run / host
                place.mkdir(parents=True)
                if h == 0:
                    (place / "metrics.jsonl").write_text(_lines(world, i))
                (place / "run.json").write_text(
                    json.dumps(
                        {
                            "id": rid,
                            "template": True,
                            "launcher": "torchrun",
                            "host": host,
                            "args": [str(EPOCHS), "5"],
                            "nproc": str(world // 2),
                            "nodes": ["n1", "n2"],
                            "nnodes": "2",
                            "started": start,
                        }
                    )
                )
                (place / "exit_code").write_text("0\n")
                os.utime(place / "exit_code", (start + 300, start + 300))
        ids.append(rid)
    return ids


def timed(argv: list[str], cwd: Path, runs: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    vmrun = [sys.executable, "-m", "vmrun"]
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        build(project)
        cases = {
            "vmrun --version": ["--version"],
            "vmrun report (10 runs)": ["report"],
            "vmrun report --json": ["report", "--json"],
            "vmrun report --markdown": ["report", "--markdown"],
            "vmrun plot -o x.png": ["plot", "-o", "x.png"],
            "vmrun plot -o x.svg": ["plot", "-o", "x.svg"],
        }
        print(f"{len(cases) - 1} commands over 10 runs x {EPOCHS} epochs; medians of {runs}")
        for name, args in cases.items():
            seconds = timed([*vmrun, *args], project, runs)
            print(f"{name:<28} {seconds:>6.2f} s{'' if seconds < 2 else '  (over 2 s)'}")


if __name__ == "__main__":
    main()
