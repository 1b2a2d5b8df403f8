"""A run's copy to its bucket (`train --store`) as a part of the run's agent (run_agent.py):
a thread that runs one pass of store_sync.sh every few seconds (what changed goes, fenced
by the attempt's generation; what one pass leaves for the next is in REC/.store.state)
until a pass says the copy is over: one last pass after the run's end, a newer attempt
that replaced this one, or giving up. So no process of its own outlives the agent, and the
agent, outside the run's session, makes the last pass after `vmrun stop`.

    python3 store_copier.py REC OUT DEST URL SINCE CFG RCLONE ROLE PYTHON ID
        the loop alone, with a config already in CFG, until the run recorded in REC ends
        (its exit code or stop written, or its agent gone)

REC/store.pid holds `PID START` of the process copying: a later attempt's agent stops an
earlier one still making its last pass (its process group: the pass and its mover too)
and goes on from the marks it left. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))


def started(pid: int) -> str:
    """Field 22 of /proc/PID/stat (its start), "" when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def alive(rec: str) -> bool:
    """run_alive.sh's rule: REC/pid started when REC/pid_start says, and no zombie."""
    try:
        with open(os.path.join(rec, "pid")) as fh:
            pid = int(fh.read().strip())
        with open(os.path.join(rec, "pid_start")) as fh:
            born = fh.read().strip()
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return False
    return fields[0] != "Z" and fields[19] == born != ""


class Copier:
    """The copy of one attempt: `start` (once), `run` (the loop, in a thread), `close`."""

    def __init__(
        self,
        rec: str,
        out: str,
        dest: str,
        url: str,
        since: str,
        role: str,
        token: str,
        python: str = "",
    ):
        self.rec, self.out, self.dest, self.url, self.since = rec, out, dest, url, since
        self.role, self.token, self.python = role, token, python
        self.cfg, self.rclone = "", ""
        self.thread: threading.Thread | None = None

    def take_over(self) -> None:
        """An earlier attempt's copy still running here (its agent's last pass) ends first."""
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(self.rec, "store.pid")) as fh:
                pid, born = fh.read().split()
            old = int(pid)
            if old == os.getpid() or started(old) != born:
                return
            with contextlib.suppress(OSError):
                if os.getpgid(old) == old:  # an agent: a session's leader, its passes with it
                    os.killpg(old, signal.SIGTERM)
                else:
                    os.kill(old, signal.SIGTERM)
            until = time.monotonic() + 5
            while started(old) == born and time.monotonic() < until:
                time.sleep(0.05)

    def start(self, config: str) -> bool:
        """The mover found and the config (`config`: a secret) in a 0600 file of the
        record's, by the environment alone; False when the copy cannot start."""
        self.take_over()
        done = subprocess.run(
            ["sh", os.path.join(HERE, "store_sync.sh"), "start", self.rec, self.python],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "VMRUN_STORE_CONFIG": config},
            check=False,
        )
        said = done.stdout.decode("utf-8", "surrogateescape").split("\n")
        if done.returncode != 0 or len(said) < 3 or not said[0]:
            return False
        self.cfg, self.rclone, self.python = said[0], said[1], said[2]
        return True

    def one_pass(self, end: bool) -> str:
        """One round (store_sync.sh pass, niced): the seconds until the next, or `stop`."""
        argv = [
            *(["nice", "-n", "10"] if shutil.which("nice") else []),  # beside the training
            "sh",
            os.path.join(HERE, "store_sync.sh"),
            "pass",
            self.rec,
            self.out,
            self.dest,
            self.url,
            self.since,
            self.cfg,
            self.rclone,
            self.role,
            self.python or "python3",
            self.token,
            "1" if end else "0",
        ]
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        lines = done.stdout.decode("utf-8", "replace").split()
        return lines[-1] if done.returncode == 0 and lines else ""

    def run(self, ended: Callable[[], bool]) -> None:
        """Passes until one says the copy is over. `ended`: the run has ended (the next
        pass is a last one: a pause is cut short when the end comes during it)."""
        with open(os.path.join(self.rec, "store.pid"), "w") as fh:
            fh.write(f"{os.getpid()} {started(os.getpid())}\n")
        # a pass that cannot run at all (gone, broken) ends the copy after the end's wait
        final_wait = float(os.environ.get("VMRUN_STORE_FINAL_WAIT") or 1800) + 60
        given_up = None
        try:
            while os.path.isdir(self.rec):
                end = ended()
                said = self.one_pass(end)
                if said == "stop":
                    break
                try:
                    pause = float(said)
                except ValueError:
                    pause = 2.0
                if end:
                    given_up = given_up or time.monotonic() + final_wait
                    if time.monotonic() > given_up:
                        break
                    time.sleep(pause)
                    continue
                until = time.monotonic() + pause
                while time.monotonic() < until and not ended():
                    time.sleep(min(0.1, max(0.0, until - time.monotonic())))
        finally:
            self.close()

    def close(self) -> None:
        """The config (credentials) gone, and this copier's pid."""
        if self.cfg:
            with contextlib.suppress(OSError):
                os.unlink(self.cfg)
        path = os.path.join(self.rec, "store.pid")
        with contextlib.suppress(OSError, ValueError):
            with open(path) as fh:
                mine = int(fh.read().split()[0]) == os.getpid()
            if mine:
                os.unlink(path)

    def begin(self, ended: Callable[[], bool]) -> None:
        """The loop as a thread of the agent (a daemon: a stopped agent ends it)."""
        self.thread = threading.Thread(target=self.run, args=(ended,), daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


def main() -> int:
    rec, out, dest, url, since, cfg, rclone, role, python, token = sys.argv[1:11]
    copier = Copier(rec, out, dest, url, since, role, token, python)
    copier.cfg, copier.rclone = cfg, rclone
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    done = ("exit_code", "stopped")
    copier.run(lambda: any(os.path.exists(os.path.join(rec, n)) for n in done) or not alive(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
