"""Beside a run on its host: when each line of its log was written, for merging the logs of
several hosts by time (`vmrun logs RUN`). The log itself stays exactly what the run printed.

python3 -c SOURCE REC PID (the run's agent, run_agent.py, marks the same in its loop): every
0.1 s at most, while PID (the run's agent) lives (`alive`: run_alive.sh's rule, the pid
started when REC/pid_start says), appends `LINES TIME` to REC/log.times when the log has
grown: LINES is how many whole lines REC/log holds (from its start, earlier attempts
included), TIME the host's clock. A last mark follows once PID is gone, or at SIGTERM.
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


class Marks:
    """The log's whole lines and when: one mark per call that finds the log grown (a part of
    the run's agent, run_agent.py, which calls it every 0.1 s)."""

    def __init__(self, rec: str) -> None:
        self.log = open(os.path.join(rec, "log"), "rb")  # noqa: SIM115  # open while the run is
        self.out = open(os.path.join(rec, "log.times"), "a")  # noqa: SIM115
        self.count, self.marked = 0, -1

    def step(self) -> None:
        while True:
            data = self.log.read(1 << 20)
            if not data:
                break
            self.count += data.count(b"\n")
        if self.count != self.marked:
            self.out.write(f"{self.count} {time.time():.3f}\n")
            self.out.flush()
            self.marked = self.count

    def close(self) -> None:
        self.log.close()
        self.out.close()


def main() -> None:
    rec, pid = sys.argv[1], int(sys.argv[2])
    ending: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: ending.append(True))
    marks = Marks(rec)
    while True:
        running = alive(rec, pid) and not ending
        marks.step()
        if not running:
            break
        time.sleep(0.1)
    marks.close()


if __name__ == "__main__":
    main()
