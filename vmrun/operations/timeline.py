"""A run's timeline: its start, snapshots, spot notices, hangs, budget stop, recoveries (with
their downtime) and end, in time order, from what vmrun already records of it: each node's
record as `status` lists it (hosts: notice, hang, budget, requeue, stop; any backend: start,
end, exit), the supervisor's `recoveries` lines as `report` reads them, and the log's lines
about saved snapshots with when each was written. Nothing here reaches a host.

Times are Unix seconds: the start by this machine's clock (run.json's `started`), what a
host recorded by that host's clock, as `status` shows them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# the log's lines about a saved snapshot: the template trainer's (snapshot.pt, and a
# sharded checkpoint once every rank's files are written), or a script's that says so as
# run_list.sh's SAVED reads them
_SAVED = re.compile(r"snapshot saved at epoch (\d+)|checkpoint \S+ complete|snapshot.*saved", re.I)
_EPOCH = re.compile(r"\bepoch[- _]?(\d+)", re.I)
_PREFIX = re.compile(r"^\[[^\]]*\]\s*")


@dataclass(frozen=True)
class Event:
    """One thing that happened to the run. `kind`: start, attempt, snapshot, notice, hang,
    over-budget, requeue, recovering, recovery, gave-up, end. `duration_s`: a recovery's
    downtime, how long a hang had been stuck when seen."""

    kind: str
    at: float | None
    text: str
    node: str | None = None
    duration_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def timeline(
    rows: Sequence[Any],
    recoveries: Sequence[Mapping[str, Any]] = (),
    saved: Iterable[tuple[float | None, str]] = (),
) -> list[Event]:
    """The run's events, oldest first (one still under way last). `rows`: its nodes'
    records as `status` gathered them (vmrun.backends.api.RunRow); `recoveries`: report's
    reading of its `recoveries` lines; `saved`: its log's lines with when each was written."""
    events = [*_from_rows(rows), *_from_recoveries(recoveries), *_snapshots(saved)]
    late = [e for e in events if e.kind == "recovering"]
    timed = sorted((e for e in events if e not in late), key=_order)
    return [*timed, *late]


def _order(event: Event) -> tuple[int, float]:
    first = {"start": 0, "end": 2}.get(event.kind, 1)
    return (first, event.at if event.at is not None else float("inf"))


def _from_rows(rows: Sequence[Any]) -> list[Event]:
    if not rows:
        return []
    from vmrun.backends.api import combined_state

    events: list[Event] = []
    starts = [float(r.started) for r in rows if r.started]
    nodes = ", ".join(r.host for r in rows)
    events.append(Event("start", min(starts) if starts else None, f"started on {nodes}"))
    attempts = max(int(r.attempts) for r in rows)
    began = [b for r in rows if (b := getattr(r, "began", None))]
    if attempts > 1:
        events.append(Event("attempt", max(began) if began else None, f"attempt {attempts} began"))
    for row in rows:
        events += _node_events(row)
    state, code = combined_state(rows) if len(rows) > 1 else (rows[0].state, rows[0].exit_code)
    if str(state) not in ("running", "pending"):
        ends = [float(r.ended) for r in rows if r.ended]
        events.append(Event("end", max(ends) if ends else None, _ending(rows, str(state), code)))
    return events


def _node_events(row: Any) -> list[Event]:
    """What one node's watchers recorded (hosts: the notice, the hang, the budget stop, the
    stop for requeue; a backend that records none has none of these)."""
    node, found = row.host, []
    notice = getattr(row, "notice", None)
    if isinstance(notice, Mapping):
        what = str(notice.get("kind") or "interruption")
        found.append(Event("notice", _time(notice.get("seen")), f"spot {what} notice", node))
    hung = getattr(row, "hung", None)
    if isinstance(hung, Mapping):
        since, seen = _time(hung.get("since")), _time(hung.get("seen"))
        ranks = hung.get("ranks")
        who = f"ranks {', '.join(map(str, ranks))}" if isinstance(ranks, list) and ranks else "run"
        action = f"; {hung['action']}" if hung.get("action") else ""
        stuck = seen - since if seen is not None and since is not None else None
        found.append(Event("hang", seen, f"hung: {who} made no progress{action}", node, stuck))
    budget = getattr(row, "budget", None)
    if isinstance(budget, Mapping):
        cap = budget.get("cap", "?")
        found.append(Event("over-budget", _time(budget.get("seen")), f"reached --max-cost {cap}"))
    requeued = getattr(row, "requeued", None)
    if isinstance(requeued, int):
        text = f"stopped after epoch {requeued}'s snapshot, to go on elsewhere"
        found.append(Event("requeue", _time(row.ended), text, node))
    recovering = getattr(row, "recovering", "")
    if recovering and str(row.state) != "running":
        found.append(Event("recovering", None, f"recovery under way: {recovering}", node))
    return found


def _ending(rows: Sequence[Any], state: str, code: int | None) -> str:
    if state == "stopped":
        by = {getattr(r, "stopped_by", "") for r in rows} - {""}
        return f"stopped ({', '.join(sorted(by))})" if by else "stopped"
    if state == "lost":
        return "lost: ended with no exit code"
    return f"{state} (exit {code})" if code is not None else state


def _from_recoveries(recoveries: Sequence[Mapping[str, Any]]) -> list[Event]:
    found = []
    for said in recoveries:
        kind = "gave-up" if said.get("kind") == "gave-up" else "recovery"
        down = said.get("downtime_s")
        found.append(
            Event(
                kind,
                _time(said.get("at")),
                str(said.get("text") or kind),
                duration_s=float(down) if isinstance(down, (int, float)) else None,
            )
        )
    return found


def _snapshots(saved: Iterable[tuple[float | None, str]]) -> list[Event]:
    found = []
    for when, line in saved:
        text = _PREFIX.sub("", line.strip())
        if not _SAVED.search(text):
            continue
        epoch = _EPOCH.search(text)
        said = f"snapshot at epoch {epoch.group(1)}" if epoch else text[:200]
        found.append(Event("snapshot", when, said))
    return found


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
