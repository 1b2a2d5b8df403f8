"""Beside a run on its host: when each line of its log was written, for merging the logs of
several hosts by time (`vmrun logs RUN`). The log itself stays exactly what the run printed.

python3 -c SOURCE REC PID: every 0.1 s at most, while PID (the run's supervising shell)
lives (`alive`: run_alive.sh's rule, the pid started when REC/pid_start says), appends
`LINES TIME` to REC/log.times when the log has grown: LINES is how many whole lines REC/log
holds (from its start, earlier attempts included), TIME the host's clock. A last mark
follows once PID is gone, or at SIGTERM (the supervising shell sends it when the run has
ended, and waits, so nothing of the run outlives its exit code).
Stdlib only; one process per run.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def alive(rec: str, pid: int) -> bool:
    """The pid is a process, no zombie, that started when REC/pid_start says
    (hostside/run_alive.sh)."""
    try:
        with open(os.path.join(rec, "pid_start")) as born, open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            return fields[0] != "Z" and fields[19] == born.read().strip() != ""
    except (OSError, IndexError):
        return False


rec, pid = sys.argv[1], int(sys.argv[2])
count, marked = 0, -1
ending: list[bool] = []
signal.signal(signal.SIGTERM, lambda *_: ending.append(True))
with open(os.path.join(rec, "log"), "rb") as log, open(os.path.join(rec, "log.times"), "a") as out:
    while True:
        running = alive(rec, pid) and not ending
        while True:
            data = log.read(1 << 20)
            if not data:
                break
            count += data.count(b"\n")
        if count != marked:
            out.write(f"{count} {time.time():.3f}\n")
            out.flush()
            marked = count
        if not running:
            break
        time.sleep(0.1)
