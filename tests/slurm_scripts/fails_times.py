"""Exits 5 on each of its first TIMES runs (it counts them in DIR), then succeeds: a crash
that bringing the job back cures (TIMES 1), or a crash loop (TIMES larger than the limit)."""

import sys
from pathlib import Path

folder, times = Path(sys.argv[1]), int(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
run = len(list(folder.iterdir())) + 1
(folder / f"run-{run}").touch()
if run <= times:
    print(f"run {run}: crashing", flush=True)
    sys.exit(5)
print(f"run {run}: done", flush=True)
