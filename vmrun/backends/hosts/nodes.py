"""Watching a run on several hosts at once: one merged, prefixed log, and the failure rule.

Every node's log is followed on its own channel; lines come out whole as they arrive, as
`[host rankN] text` or `[host] text` (the launcher's own lines; see vmrun.runs.lines). When
one node's launcher exits non-zero, or its host stops answering while the others still do,
that node is reported as the first failure and the run is stopped on every other node
(`runs.stop`: TERM, KILL after the grace, verified), so nobody waits out a 30-minute
collective timeout. When *every* host stops answering at once the fault is this machine's
network: the run goes on there, and this says how to reattach.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vmrun.backends.hosts import records as runs
from vmrun.errors import (
    ConnectionLostError,
    Detached,
    Interrupted,
    VmrunError,
    run_failed,
    run_over_budget,
)
from vmrun.reporting import Reporter
from vmrun.runs.lines import Prefixer
from vmrun.runs.plan import STOP_GRACE_S
from vmrun.ssh.connection import Connection

SILENT = "its host stopped answering"  # a node's failure when it went quiet (no reset)
ALIVE_CHECK_S = 10.0  # how long a quick command may take on a host thought alive
STOP_SLACK_S = 10.0  # beyond a stop's own deadline: opening its channel, on a loaded host
LOGS_END_S = 10.0  # for the other nodes' logs to end once their runs are stopped


@dataclass
class _Event:
    host: str
    record: runs.RunRecord | None = None
    error: BaseException | None = None


def _follow_one(
    conn: Connection, rid: str, out: Prefixer, last: int, skip: int, events: queue.Queue
) -> None:
    try:
        runs.follow(conn, rid, out, last=last, skip=skip)
        out.flush()
        (record,) = runs.list_runs(conn, [rid])
        events.put(_Event(conn.label, record=record))
    except BaseException as exc:  # reported by the watcher, never lost
        out.flush()
        events.put(_Event(conn.label, error=exc))


def _answers(conn: Connection) -> bool:
    try:
        return conn.run(["true"], timeout=ALIVE_CHECK_S).ok
    except VmrunError:
        return False


def follow_nodes(
    conns: Sequence[Connection],
    rid: str,
    out: Reporter,
    *,
    last: int = 0,
    skip: Mapping[str, int] | None = None,
    grace: float = STOP_GRACE_S,
    verbose: bool = False,
) -> None:
    """Follow the run on every node until it ends everywhere (each node's log after its
    `skip` lines, the earlier attempts', else its last `last` lines, 0: all); raise if it
    failed anywhere (after stopping it on the others), Detached on Ctrl-C (it goes on).
    The lines go to `out.output`, `[host rankN]`-prefixed; the stops to `out.info`.
    `verbose`: torchrun's banner and c10d's host name warnings too."""
    events: queue.Queue[_Event] = queue.Queue()
    threads = []
    for conn in conns:
        lines = Prefixer(conn.label, out, verbose=verbose)
        begin = (skip or {}).get(conn.label, 0)
        t = threading.Thread(
            target=_follow_one, args=(conn, rid, lines, last, begin, events), daemon=True
        )
        t.start()
        threads.append(t)
    pending = {c.label for c in conns}
    capped: list[_Event] = []  # nodes its budget watcher stopped: the others stop by theirs
    try:
        while pending:
            try:
                event = events.get(timeout=0.5)
            except queue.Empty:
                continue
            pending.discard(event.host)
            if event.record is not None and event.record.budget and event.record.stopped:
                capped.append(event)
                continue
            if _failure(event) is None:
                continue
            event = _first(event, events, pending)
            why = _failure(event)
            assert why is not None
            if isinstance(event.error, ConnectionLostError):
                others = [c for c in conns if c.label != event.host]
                if not any(_answers(c) for c in others):
                    raise ConnectionLostError(
                        f"lost the connection to every host of run {rid}; it goes on running there",
                        hint=f"reattach with `vmrun logs -f {rid}`",
                    ) from None
            _fail(conns, rid, event, why, threads, out, grace)
    except (KeyboardInterrupt, Interrupted):
        raise Detached(
            f"detached from run {rid}; it goes on running on {len(conns)} hosts",
            hint=f"reattach with `vmrun logs -f {rid}`, stop it with `vmrun stop {rid}`",
        ) from None
    if capped:
        budget = capped[0].record.budget if capped[0].record else None
        raise run_over_budget(rid, str((budget or {}).get("cap") or "?"), host=capped[0].host)


def _first(event: _Event, events: queue.Queue[_Event], pending: set[str]) -> _Event:
    """Of the failures known now (this one and any already queued), the one that ended first
    by its host's record (a run that had ended before it was followed delivers them all at
    once, in no useful order); arrival order otherwise."""
    failed = [event]
    while True:
        try:
            other = events.get_nowait()
        except queue.Empty:
            break
        pending.discard(other.host)
        if _failure(other) is not None:
            failed.append(other)

    def ended(e: _Event) -> float:
        return e.record.ended if e.record is not None and e.record.ended else float("inf")

    return min(failed, key=ended)


def _failure(event: _Event) -> str | None:
    """Why this node's end is a failure of the run, or None when it finished cleanly."""
    if event.error is not None:
        if isinstance(event.error, ConnectionLostError):
            return SILENT
        if isinstance(event.error, VmrunError):
            return event.error.message
        return f"{type(event.error).__name__}: {event.error}"
    record = event.record
    assert record is not None
    if record.state == "done":
        return None
    if record.state == "stopped":
        return "it was stopped"
    if record.requeued is not None:
        return f"it stopped after epoch {record.requeued}'s snapshot to go on elsewhere"
    if record.exit_code is None:
        return "its launcher vanished without an exit code (killed, or the host rebooted)"
    if record.failure is not None:
        return record.failure.describe(record.host)
    return f"its launcher exited with {record.exit_code}"


def _fail(
    conns: Sequence[Connection],
    rid: str,
    first: _Event,
    why: str,
    threads: list[threading.Thread],
    out: Reporter,
    grace: float,
) -> None:
    out.info(f"node {first.host} failed: {why}; stopping run {rid} on the other nodes")
    reachable = [c for c in conns if not (c.label == first.host and first.error is not None)]
    results: dict[str, str] = {}

    def stop(conn: Connection) -> None:
        try:
            res = runs.stop(conn, rid, grace=grace, why="failure")
            results[conn.label] = (
                f"stopped {len(res.signalled)} process(es)" if res.signalled else "had ended"
            )
        except VmrunError as exc:
            results[conn.label] = f"could not be stopped: {exc.message}"

    stoppers = [threading.Thread(target=stop, args=(c,), daemon=True) for c in reachable]
    for t in stoppers:
        t.start()
    waited = runs.stop_deadline(grace) + STOP_SLACK_S  # each stop's own, and opening a channel
    _join_all(stoppers, waited)
    answered = []
    for conn, t in zip(reachable, stoppers, strict=True):
        if t.is_alive():  # a host that answers nothing at all: named, not waited for
            results.setdefault(conn.label, f"did not confirm the stop within {waited:g} s")
        else:
            answered.append(conn)
    _join_all(threads, LOGS_END_S)  # the other logs end now that their runs have ended
    left = [f"{h} {what}" for h, what in dict(results).items()]
    if first.error is not None:
        left.append(f"{first.host} unreachable: `vmrun stop {rid}` once it is back")
    out.info("; ".join(left))
    code = first.record.exit_code if first.record and first.record.exit_code else 1
    raise run_failed(
        rid,
        f"failed: node {first.host} was the first to fail ({why})",
        code,
        host=first.host,
        hint=f"see `vmrun logs {rid} --node {first.host}`; {_next_step(rid, answered, conns)}",
    )


def _join_all(threads: Sequence[threading.Thread], seconds: float) -> None:
    """Join them all within one deadline (not `seconds` each)."""
    deadline = time.monotonic() + seconds
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _next_step(rid: str, answered: Sequence[Connection], nodes: Sequence[Connection]) -> str:
    """Resume only helps a run that trained (rank 0's node reports epochs): one that failed
    before its first epoch (a missing module, CUDA on a CPU host) fails the same way again.
    Said only when the node that would have reported epochs answered: a lost master's epochs
    are with it."""
    if nodes and nodes[0] not in answered:
        lost = nodes[0].label
        return f"resume with `vmrun train --resume {rid}` ({lost}, its master, did not answer)"
    trained = False
    for conn in answered:
        try:
            trained = trained or any(r.progress for r in runs.list_runs(conn, [rid]))
        except VmrunError:
            return f"resume with `vmrun train --resume {rid}`"  # cannot tell: the safe advice
    if trained:
        return f"resume with `vmrun train --resume {rid}`"
    return "it failed before its first epoch, so resuming would fail the same way: fix the cause"
