"""The sweeps page: each sweep under results/ (its record, sweep.json) and one sweep's
scaling report, as `vmrun sweep` writes it and `vmrun report` prints it (the same
library call: vmrun.operations.sweep_run.sweep_report), with its plots' points for the
page's charts. Read from this machine's files alone: a sweep's runs are fetched as it goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vmrun.errors import UsageError, VmrunError
from vmrun.runs.sweep import PREFIX, RECORD


def sweep_list(project: Path) -> dict[str, Any]:
    """Every sweep here, newest first: its id, where it runs, its sizes' states and run ids
    (the runs page marks a sweep's runs by these). A record that cannot be read is listed
    with its `error`."""
    from vmrun.runs.sweep import load

    found: list[dict[str, Any]] = []
    for path in sorted((project / "results").glob(f"{PREFIX}*/{RECORD}"), reverse=True):
        sweep_id = path.parent.name
        try:
            sweep = load(project, sweep_id)
        except VmrunError as exc:
            found.append({"id": sweep_id, "error": exc.one_line()})
            continue
        states: dict[str, int] = {}
        for size in sweep.sizes:
            states[str(size.state)] = states.get(str(size.state), 0) + 1
        found.append(
            {
                "id": sweep.id,
                "where": where_text(sweep.where),
                "sizes": len(sweep.sizes),
                "states": states,
                "runs": {s.run: s.label for s in sweep.sizes if s.run},
                "error": None,
            }
        )
    return {"sweeps": found}


def sweep_page(project: Path, sweep_id: str) -> dict[str, Any]:
    """One sweep: its sizes and what became of each, its report (`table`: the columns and
    cells `vmrun report` prints; `rows`: as `report --json`, the runs left out last with
    their error) and its plots (one per metric `vmrun sweep` plots: each run's points by
    epoch, labelled as the PNG's legend)."""
    from vmrun.operations.sweep_run import plotted, sweep_report
    from vmrun.results.plotting import labels, series, title
    from vmrun.results.report import left_out_dicts, notes, row_dicts, table
    from vmrun.runs.sweep import load

    try:
        sweep = load(project, sweep_id)
    except UsageError as exc:
        if exc.code == "sweep-not-found" or "give a sweep id" in exc.message:
            raise UsageError(exc.message, code="run-not-found") from None
        raise
    problems: list[VmrunError] = []
    runs, rows, legend = sweep_report(project, sweep, problems)
    heads, numeric, cells = table(rows) if rows else ((), frozenset(), [])
    plots = []
    for metric in plotted(runs) if runs else []:
        named = zip(runs, labels(runs, legend), strict=True)
        plots.append(
            {
                "metric": metric,
                "title": title(metric, "epoch"),
                "series": [
                    {"run": r.run_id, "label": label, "points": series(r, metric)}
                    for r, label in named
                ],
            }
        )
    return {
        "id": sweep.id,
        "where": where_text(sweep.where),
        "sizes": [
            {
                "label": s.label,
                "words": s.words(),
                "run": s.run,
                "state": str(s.state),
                "detail": s.detail or None,
            }
            for s in sweep.sizes
        ],
        "table": {"heads": list(heads), "numeric": sorted(numeric), "rows": cells},
        "note": notes(rows) if rows else "",
        "rows": row_dicts(rows) + left_out_dicts(problems),
        "plots": plots,
    }


def where_text(where: dict[str, Any]) -> str:
    """`here`, `hosts a, b` or `cluster NAME`, from the record's `where`."""
    if where.get("cluster"):
        return f"cluster {where['cluster']}"
    if where.get("hosts"):
        return "hosts " + ", ".join(str(h) for h in where["hosts"])
    return "here" if where.get("local") else "the project's hosts"
