"""One row per run, to compare runs side by side: shape, time, throughput, scaling, result.

Speed-up and efficiency are against the baseline, the run with the smallest world size (the
first such run named):

    speed-up   = median samples/s of the run / median samples/s of the baseline
    efficiency = speed-up / (world size of the run / world size of the baseline)

samples/s is the template's own figure: samples of every rank in an epoch over its time.
A sweep that varies more than the size names what its runs differ in (`cpus=2 lr=0.01`):
those options are columns of their own, after RUN. The JSON also names each run's commit
and versions (vmrun.results.provenance), so a number can be traced to the code that made it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from vmrun.errors import VmrunError, error_json
from vmrun.results.cost import charge, money, recovery_seconds
from vmrun.results.history import RunHistory
from vmrun.results.provenance import VERSION_KEYS, summary_of

HEADERS = (
    "RUN",
    "NODES",
    "PROCS/NODE",
    "WORLD",
    "LAUNCHER",
    "EPOCHS",
    "TOTAL TIME",
    "S/EPOCH",
    "SAMPLES/S",
    "SPEED-UP",
    "EFFICIENCY",
    "FINAL LOSS",
    "FINAL ACC",
)
NUMERIC = frozenset(range(1, 4)) | frozenset(range(5, len(HEADERS)))  # right-aligned columns


@dataclass(frozen=True)
class ReportRow:
    """A run's line of the report; None where it is unknown. The JSON keys are these."""

    run: str
    where: str
    nodes: int | None
    procs_per_node: int | None
    world_size: int | None
    launcher: str | None
    epochs: int  # done
    epochs_asked: int | None
    total_time_s: float | None  # from the run's start to its end
    epoch_time_s: float | None  # median over the epochs
    samples_per_s: float | None  # median over the epochs, every rank together
    speedup: float | None
    efficiency: float | None
    final_loss: float | None
    final_accuracy: float | None  # eval_accuracy, else accuracy, of the last epoch with one
    baseline: str | None  # the run speed-up and efficiency compare with
    varied: dict[str, str] = field(default_factory=dict)  # a sweep's other axes: {"lr": "0.1"}
    commit: str | None = None  # the code's commit (run.json's `code`)
    dirty: bool | None = None  # uncommitted changes were synced with it
    versions: dict[str, str | None] | None = None  # python, torch, cuda, nccl, gpu, driver
    exit: int | None = None  # the run's own code (a failed torchrun worker's, not torchrun's)
    failure: dict[str, Any] | None = None  # which worker failed first (failure.json), if known
    # what --recover did, in turn: kind, at, text, downtime_s, epochs_redone, swap (which
    # node took which one's place), new_vm_s, and what each cost: cost_s (the downtime and
    # the epochs done again), cost (at the nodes' prices, where known, in `currency`)
    recoveries: list[dict[str, Any]] | None = None
    cost: float | None = None  # the run's time at its nodes' prices (run.json's)
    currency: str | None = None  # the prices' (USD unless the hosts' `currency` said)
    # ranks slower than the others (vmrun.results.stragglers, on each rank's median step
    # time): rank, node, seconds, typical (the others' median), ratio
    slow_ranks: list[dict[str, Any]] | None = None
    # its run.json, as vmrun.results.record's typed fields (docs/reports.md lists them)
    record: dict[str, Any] | None = None


def _median(run: RunHistory, metric: str) -> float | None:
    found = [v for _, v in run.values(metric)]
    return statistics.median(found) if found else None


def baseline_of(runs: Sequence[RunHistory]) -> RunHistory | None:
    """The run with the smallest world size that has a throughput (the first such one)."""
    known = [r for r in runs if r.world_size and _median(r, "samples_per_s")]
    return min(known, key=lambda r: r.world_size or 0, default=None)


def report_rows(
    runs: Sequence[RunHistory], varied: Mapping[str, Mapping[str, str]] | None = None
) -> list[ReportRow]:
    """A row per run; `varied`: by run id, the options a sweep varied besides the size."""
    base = baseline_of(runs)
    base_rate = _median(base, "samples_per_s") if base else None
    rows = []
    for run in runs:
        rate = _median(run, "samples_per_s")
        speedup = efficiency = None
        if base is not None and base_rate and rate is not None and run.world_size:
            speedup = rate / base_rate
            efficiency = speedup / (run.world_size / (base.world_size or 1))
        accuracy = run.last("eval_accuracy")
        epoch_s = _median(run, "epoch_time_s")
        rows.append(
            ReportRow(
                run=run.run_id,
                where=run.where,
                nodes=run.nodes,
                procs_per_node=run.procs_per_node,
                world_size=run.world_size,
                launcher=run.launcher,
                epochs=run.epochs_done,
                epochs_asked=run.epochs_asked,
                total_time_s=run.duration,
                epoch_time_s=epoch_s,
                samples_per_s=rate,
                speedup=speedup,
                efficiency=efficiency,
                final_loss=run.last("loss"),
                final_accuracy=accuracy if accuracy is not None else run.last("accuracy"),
                baseline=base.run_id if speedup is not None and base else None,
                varied=dict((varied or {}).get(run.run_id, {})),
                **_provenance(run),
                exit=run.exit_code,
                failure=run.failure.as_json(run.failure_node) if run.failure else None,
                recoveries=_costed(_recoveries(run.path), epoch_s, run.price_per_hour),
                cost=charge(run.ran_s, run.price_per_hour),
                currency=run.currency if run.price_per_hour is not None else None,
                slow_ranks=_slow(run),
                record=run.record.as_json() if run.record else None,
            )
        )
    return rows


def _slow(run: RunHistory) -> list[dict[str, Any]] | None:
    if run.rank_step_s is None:
        return None
    from vmrun.results.stragglers import slow_ranks

    return [
        {
            "rank": s.rank,
            "node": s.node,
            "step_s": round(s.seconds, 6),
            "others_step_s": round(s.typical, 6),
            "ratio": round(s.ratio, 3),
        }
        for s in slow_ranks(run.rank_step_s, run.rank_node)
    ]


def _provenance(run: RunHistory) -> dict[str, Any]:
    """The run's commit, dirty and versions, from its folder (None where unknown): which
    code and stack a number came from, for the JSON."""
    found = summary_of(run.path)
    versions = {k: found[k] for k in VERSION_KEYS}
    return {
        "commit": found["commit"],
        "dirty": found["dirty"],
        "versions": versions if any(v is not None for v in versions.values()) else None,
    }


def _recoveries(path: Path) -> list[dict[str, Any]] | None:
    """The supervisor's lines (the `recoveries` file fetched with the run's logs: KIND<TAB>
    TIME<TAB>TEXT<TAB>FACTS), each with what it cost; None when it had none."""
    found = sorted(path.glob("recoveries")) + sorted(path.glob("*/recoveries"))
    lines = [x for f in found[:1] for x in f.read_text().splitlines() if x]
    return [_recovery(x) for x in lines] or None


def recoveries_of(path: Path) -> list[dict[str, Any]]:
    """What the run's supervisor did, from its folder here, as `report --json` gives it
    (its `recoveries` lines, without their cost); [] where it did nothing."""
    return _recoveries(path) or []


def _costed(
    recoveries: list[dict[str, Any]] | None, epoch_s: float | None, per_hour: float | None
) -> list[dict[str, Any]] | None:
    """Each recovery with the time it cost and, at the run's prices, the money."""
    if recoveries is None:
        return None
    done = []
    for event in recoveries:
        seconds = recovery_seconds(event, epoch_s) if event["kind"] == "recovery" else None
        done.append({**event, "cost_s": seconds, "cost": charge(seconds, per_hour)})
    return done


def _recovery(line: str) -> dict[str, Any]:
    kind, at, text, told = [*line.split("\t", 3), "", "", ""][:4]
    try:
        facts = json.loads(told) if told else {}
    except ValueError:
        facts = {}
    facts = facts if isinstance(facts, dict) else {}
    return {
        "kind": kind,
        "at": float(at) if at.isdigit() else None,
        "text": text,
        "downtime_s": facts.get("downtime_s"),
        "epochs_redone": facts.get("epochs_redone"),
        "swap": facts.get("swap") or {},
        "new_vm_s": facts.get("new_vm_s"),
    }


def recovered_text(recoveries: Sequence[dict[str, Any]] | None, currency: str | None = None) -> str:
    """The RECOVERIES cell: how many, their downtime and epochs redone, or that it gave up."""
    if not recoveries:
        return ""
    done = [r for r in recoveries if r["kind"] == "recovery"]
    down = sum(r["downtime_s"] or 0 for r in done)
    redone = sum(r["epochs_redone"] or 0 for r in done)
    spent = [r["cost"] for r in done if r.get("cost") is not None]
    paid = f", {money(sum(spent), currency)}" if spent else ""
    text = f"{len(done)} ({duration_text(down)} down, {redone} redone{paid})" if done else "0"
    return text + (", gave up" if recoveries[-1]["kind"] == "gave-up" else "")


def row_dicts(rows: Sequence[ReportRow]) -> list[dict[str, object]]:
    return [{**asdict(row), "error": None} for row in rows]


def left_out_dicts(left_out: Sequence[VmrunError]) -> list[dict[str, object]]:
    """A run that could not be reported: its id and its error, every other key null."""
    keys = [f.name for f in fields(ReportRow)]
    return [
        {**dict.fromkeys(keys), "run": getattr(err, "run", None), "error": error_json(err)}
        for err in left_out
    ]


def rows_json(rows: Sequence[ReportRow], left_out: Sequence[VmrunError] = ()) -> str:
    """A JSON list of objects, the same keys in every one; null where unknown. The runs
    left out come last, each with its `error` (vmrun.errors.error_object)."""
    return json.dumps(row_dicts(rows) + left_out_dicts(left_out), indent=2)


def varied_keys(rows: Sequence[ReportRow]) -> list[str]:
    """The options some row varies, in the order first met."""
    return list(dict.fromkeys(k for row in rows for k in row.varied))


def headers(rows: Sequence[ReportRow]) -> tuple[tuple[str, ...], frozenset[int]]:
    """The table's headers (a column per varied option after RUN, RECOVERIES last when a
    run had a supervisor at work) and which are numeric."""
    keys = varied_keys(rows)
    shift = len(keys)
    numeric = frozenset(i + shift for i in NUMERIC) | frozenset(range(1, shift + 1))
    cost = ("COST",) if _paid(rows) else ()
    if cost:
        numeric |= {len(HEADERS) + shift}
    slow = ("SLOW RANKS",) if _slowed(rows) else ()
    last = ("RECOVERIES",) if _recovered(rows) else ()
    return (HEADERS[0], *(k.upper() for k in keys), *HEADERS[1:], *cost, *slow, *last), numeric


def table(
    rows: Sequence[ReportRow],
) -> tuple[tuple[str, ...], frozenset[int], list[tuple[str, ...]]]:
    """Headers, numeric columns and each row's cells, as every rendering shows them."""
    heads, numeric = headers(rows)
    keys, recovered, paid, slow = varied_keys(rows), _recovered(rows), _paid(rows), _slowed(rows)
    return heads, numeric, [cells(r, keys, recovered=recovered, paid=paid, slow=slow) for r in rows]


def _slowed(rows: Sequence[ReportRow]) -> bool:
    return any(r.slow_ranks for r in rows)


def slow_text(slow: Sequence[dict[str, Any]] | None) -> str:
    """The SLOW RANKS cell: `r3 (node 1) 1.9x`, each slow rank."""
    return ", ".join(
        f"r{s['rank']}"
        + (f" (node {s['node']})" if s.get("node") is not None else "")
        + f" {s['ratio']:.1f}x"
        for s in slow or ()
    )


def _recovered(rows: Sequence[ReportRow]) -> bool:
    return any(r.recoveries for r in rows)


def _paid(rows: Sequence[ReportRow]) -> bool:
    return any(r.cost is not None for r in rows)


def total_note(rows: Sequence[ReportRow]) -> str:
    """What the runs cost together (a sweep's bill), per currency, for under the table;
    "" for fewer than two priced runs."""
    by_currency: dict[str, list[float]] = {}
    for row in rows:
        if row.cost is not None:
            by_currency.setdefault(row.currency or "USD", []).append(row.cost)
    if sum(len(v) for v in by_currency.values()) < 2:
        return ""
    parts = [f"{money(sum(v), c)} ({len(v)} runs)" for c, v in by_currency.items()]
    return "cost in all: " + ", ".join(parts)


def cells(
    row: ReportRow,
    keys: Sequence[str] = (),
    *,
    recovered: bool = False,
    paid: bool = False,
    slow: bool = False,
) -> tuple[str, ...]:
    """The row as the table shows it ("" where unknown); `keys`: the varied columns;
    `recovered`, `paid`, `slow`: with the RECOVERIES, COST, SLOW RANKS columns."""
    epochs = f"{row.epochs}/{row.epochs_asked}" if row.epochs_asked else str(row.epochs)
    return (
        row.run,
        *(row.varied.get(k, "") for k in keys),
        _int(row.nodes),
        _int(row.procs_per_node),
        _int(row.world_size),
        row.launcher or "",
        epochs,
        duration_text(row.total_time_s),
        "" if row.epoch_time_s is None else f"{row.epoch_time_s:.3g}",
        "" if row.samples_per_s is None else f"{row.samples_per_s:,.0f}",
        "" if row.speedup is None else f"{row.speedup:.2f}x",
        "" if row.efficiency is None else f"{row.efficiency:.0%}",
        "" if row.final_loss is None else f"{row.final_loss:.4g}",
        "" if row.final_accuracy is None else f"{row.final_accuracy:.4g}",
        *(("" if row.cost is None else money(row.cost, row.currency),) if paid else ()),
        *((slow_text(row.slow_ranks),) if slow else ()),
        *((recovered_text(row.recoveries, row.currency),) if recovered else ()),
    )


def baseline_note(rows: Sequence[ReportRow]) -> str:
    """What speed-up and efficiency are relative to, for under the table."""
    base = next((r for r in rows if r.baseline and r.run == r.baseline), None)
    if base is None:
        return ""
    return (
        f"speed-up: samples/s over {base.run} (world size {base.world_size});"
        " efficiency: speed-up / world size ratio"
    )


def notes(rows: Sequence[ReportRow]) -> str:
    """What goes under the table: the baseline, and what the runs cost together."""
    return "\n".join(n for n in (baseline_note(rows), total_note(rows)) if n)


def render_markdown(rows: Sequence[ReportRow]) -> str:
    """A GitHub table (numbers right-aligned), then the notes."""
    heads, numeric, shown = table(rows)
    lines = [
        "| " + " | ".join(heads) + " |",
        "|" + "|".join("---:" if i in numeric else "---" for i in range(len(heads))) + "|",
    ]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in shown]
    note = notes(rows).replace("\n", "\n\n")
    return "\n".join(lines) + (f"\n\n{note}\n" if note else "\n")


def duration_text(seconds: float | None) -> str:
    """12.3 s, 4:05, 1:02:03."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _int(value: int | None) -> str:
    return "" if value is None else str(value)
