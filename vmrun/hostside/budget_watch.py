"""Beside a `train --max-cost` run on each node: the run stopped when it has cost what it
may, with its work saved, whether or not vmrun follows it.

    python3 budget_watch.py REC PID SECONDS SPENT_TEXT

SECONDS: how much longer the run may go (vmrun computed it from the run's prices, its cap
and the time its earlier attempts took); SPENT_TEXT: the cap as the user wrote it ($5.00).
When the time is up and the run still runs:

- REC/budget is written (JSON: seen, cap) and the log gets one line;
- the run's ranks on this node that catch SIGUSR2 get it (the template's preemption
  protocol: the ranks agree after the epoch, rank 0 snapshots it, every rank exits); ranks
  still starting (importing torch) are waited for, a minute at most;
- after a grace (VMRUN_BUDGET_GRACE_S, 300 s: an epoch's end, its snapshot), what is left
  of the run here (every process below PID: a script that ignores SIGUSR2) gets SIGTERM,
  then SIGKILL 10 s later, REC/stopped written first.

The run's agent (run_agent.py) then records the run as stopped, not failed: a --recover
run's supervisor does not bring it back, as after `vmrun stop`. PID is the run's agent; the
watch ends with it (a pidfd: nothing outlives the run). Stdlib only.

A Slurm job's cap (run_agent.py's `budget` and `step`, from the copies the batch script
writes into REC/.watch) is the job's own: its spec is written once, at submission, so
SECONDS run from the first attempt's start (REC/starts' first line: the queue's waits
between attempts count, as the run's cost does). Spent before an attempt, REC/budget is
written and the attempt starts nothing (`spent`); spent while the step runs, REC/budget is
written and the batch shell gets SIGUSR2 (`job`), as at its time limit: it passes the
signal to the step's ranks, which save their epoch, and ends the job stopped, never
requeued (slurm_job.bash).
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings on the host
from hang_watch import (  # type: ignore[import-not-found]
    running,
    tell,
    terminate,
    waiter,
    write_json,
)
from spot_watch import alive, send, tree  # type: ignore[import-not-found]

# how long ranks that catch no SIGUSR2 yet may still be starting (VMRUN_BUDGET_STARTING_S)
STARTING_S = 60.0


def stop(rec: str, top: int, run: int = 0) -> None:
    """Recorded as stopped, then SIGTERM to what runs under `top`, SIGKILL after 10 s."""
    with open(os.path.join(rec, "stopped"), "w") as fh:
        fh.write("budget\n")  # run_stop.sh's WHY: meant to end, as the user's stop
    terminate(lambda: tree(top, run))


def main() -> int:
    rec, pid, seconds, cap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    return watch(rec, pid, seconds, cap, command(rec))


def command(rec: str) -> int:
    """The run's command (REC/session: PID START, its agent's), 0 when it is not there."""
    try:
        with open(os.path.join(rec, "session")) as fh:
            pid, born = fh.read().split()
        with open(f"/proc/{pid}/stat") as stat:
            return int(pid) if stat.read().rsplit(")", 1)[1].split()[19] == born else 0
    except (OSError, ValueError, IndexError):
        return 0


def watch(rec: str, pid: int, seconds: float, cap: str, run: int = 0) -> int:
    """The watch itself (the script's, autostop_watch.sh's; a part of run_agent.py, which
    names its command: `run`)."""
    grace = float(os.environ.get("VMRUN_BUDGET_GRACE_S") or 300)
    pause = waiter(pid)
    deadline = time.monotonic() + max(0.0, seconds)
    while alive(rec, pid) and time.monotonic() < deadline:
        pause(min(5.0, max(0.05, deadline - time.monotonic())))
    if not alive(rec, pid):
        return 0
    write_json(os.path.join(rec, "budget"), {"seen": time.time(), "cap": cap})
    starting_s = float(os.environ.get("VMRUN_BUDGET_STARTING_S") or STARTING_S)
    sent, starting = 0, time.monotonic() + starting_s
    while alive(rec, pid) and not (sent := send(pid, signal.SIGUSR2, run)):
        if time.monotonic() > starting:
            break
        pause(1.0)  # its ranks may still be starting: none has its handler yet
    if sent:  # said even when the ranks were quick to end: they were told
        tell(
            rec,
            f"the run has cost --max-cost {cap}: snapshot and stop after this epoch"
            f" (SIGUSR2 to {sent} rank(s))",
        )
    elif not alive(rec, pid):
        return 0
    else:
        tell(
            rec,
            f"the run has cost --max-cost {cap}: no process of the run catches SIGUSR2;"
            " stopping it",
        )
        grace = 0.0
    until = time.monotonic() + grace
    while alive(rec, pid) and time.monotonic() < until:
        pause(min(1.0, max(0.05, until - time.monotonic())))
    if alive(rec, pid):
        tell(rec, f"the run did not stop within {grace:.0f} s of --max-cost: stopping it")
        stop(rec, pid, run)
    return 0


def left(rec: str, seconds: float) -> float:
    """A Slurm job's time left: `seconds` from its first attempt's start (now, when none is
    recorded yet)."""
    now = time.time()
    try:
        with open(os.path.join(rec, "starts")) as fh:
            first = float(fh.readline().split()[1])
    except (OSError, IndexError, ValueError):
        first = now
    return first + seconds - now


def reached(rec: str, cap: str) -> None:
    """REC/budget: when the cap was reached, and the cap as the user wrote it."""
    write_json(os.path.join(rec, "budget"), {"seen": int(time.time()), "cap": cap})


def spent(rec: str, seconds: float, cap: str) -> bool:
    """Before a Slurm job's attempt: its cap reached already (REC/budget written)."""
    if left(rec, seconds) > 0:
        return False
    reached(rec, cap)
    return True


def job(rec: str, step: int, shell: int, seconds: float, cap: str) -> int:
    """Beside a Slurm job's step (`step`: its srun): at the cap, while the step runs,
    REC/budget and SIGUSR2 to the batch shell (`shell`), which does the rest."""
    pause = waiter(step)
    deadline = time.monotonic() + left(rec, seconds)
    while running(step) and time.monotonic() < deadline:
        pause(min(5.0, max(0.05, deadline - time.monotonic())))
    if running(step):
        reached(rec, cap)
        os.kill(shell, signal.SIGUSR2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
