"""What a sweep leaves in results/sweep-<id>/: the scaling report (report.md, report.json,
the same rows `vmrun report` prints) and plots of its runs (loss.png, and accuracy.png
when the runs measured accuracy), made from the runs' fetched files alone; what else a
sweep varied (`cpus=2 lr=0.01`) comes from its record, into columns and legends."""

from __future__ import annotations

from pathlib import Path

from vmrun.cli import output
from vmrun.errors import VmrunError
from vmrun.runs.sweep import Sweep, write_text_atomic

PLOTS = (("loss", "loss.png"), ("eval_accuracy", "accuracy.png"), ("accuracy", "accuracy.png"))


def write_results(project: Path, sweep: Sweep) -> list[Path]:
    """Write the report and plots of the sizes that finished; print the report. Returns
    the files written (none when no size finished)."""
    from vmrun.cli.report_cmd import show_table
    from vmrun.results.history import load_runs
    from vmrun.results.report import render_markdown, report_rows, rows_json

    problems: list[VmrunError] = []
    runs = load_runs([project / "results" / rid for rid in sweep.run_ids()], problems)
    for problem in problems:
        output.info_line(f"sweep {sweep.id}: left out of the report: {problem.one_line()}")
    if not runs:
        return []
    folder = project / sweep.folder
    varied = {s.run: s.varied() for s in sweep.sizes if s.run and s.values}
    rows = report_rows(runs, varied)
    written = [folder / "report.md", folder / "report.json"]
    write_text_atomic(written[0], render_markdown(rows))
    write_text_atomic(written[1], rows_json(rows) + "\n")
    notes = {s.run: s.words() for s in sweep.sizes if s.run and s.values}
    written += _plots(runs, folder, sweep.id, notes)
    show_table(rows)
    names = ", ".join(str(p.relative_to(project)) for p in written)
    output.info_line(f"sweep {sweep.id}: {len(runs)} run(s); wrote {names}")
    return written


def _plots(runs: list, folder: Path, sweep_id: str, notes: dict[str, str]) -> list[Path]:
    """loss.png, and accuracy.png from eval_accuracy (else accuracy) where every run has it."""
    from vmrun.results.plotting import save_plot

    written: list[Path] = []
    for metric, name in PLOTS:
        path = folder / name
        if path in written or not all(metric in run.metric_names for run in runs):
            continue
        try:
            written.append(save_plot(runs, metric, path, notes=notes))
        except VmrunError as exc:  # matplotlib missing: the report stands without plots
            output.info_line(f"sweep {sweep_id}: no {name}: {exc.one_line()}")
            break
    return written
