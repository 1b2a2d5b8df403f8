"""Beside a `train --recover` run on each node: a cloud's warning that the VM will go, seen
in time to save the run's work. AWS says it in the instance metadata (IMDS, IMDSv2: a token
first, then the token on every read), polled every 5 s as AWS advises:

- `spot/instance-action` (JSON `{"action": "terminate"|"stop"|"hibernate", "time": ...}`,
  two minutes ahead): REC/notice is written, a line goes to the run's log, and the run's
  ranks on this node get SIGUSR2: the ranks agree after the epoch, rank 0 snapshots it,
  writes $VMRUN_REQUEUE_FILE and every rank exits 0 (the template's preemption protocol),
  so the run ends with its work saved and its supervisor resumes it without this node;
- `events/recommendations/rebalance` (an earlier, softer warning): SIGUSR1, a snapshot
  now, training goes on; said once.

python3 spot_watch.py REC PID: PID is the run's agent (a Slurm job's: its step); the watch
ends with it. A host with no metadata service (not a cloud VM, or IMDS turned off) is found at the
first try: the watcher then ends, saying nothing. Told are the processes below PID that
catch the signal (the template's ranks, a script that follows the protocol): never one it
would end, such as torchrun's agent or a shell.
Stdlib only; VMRUN_SPOT_EVERY sets the pace (seconds).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

IMDS = "http://169.254.169.254"
TTL = 21600  # seconds a token lives (the most IMDSv2 allows)


def alive(rec: str, pid: int) -> bool:
    """The run still runs: its agent lives (run_alive.sh's rule) and no exit
    code or stop is recorded."""
    if os.path.exists(os.path.join(rec, "exit_code")) or os.path.exists(
        os.path.join(rec, "stopped")
    ):
        return False
    try:
        with open(os.path.join(rec, "pid_start")) as born, open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            return fields[0] != "Z" and fields[19] == born.read().strip() != ""
    except (OSError, IndexError):
        return False


class Metadata:
    """IMDSv2 reads: a token (PUT), kept until it is refused, then asked again."""

    def __init__(self, base: str):
        self.base, self.token = base, ""

    def _token(self) -> str:
        ask = urllib.request.Request(
            f"{self.base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TTL)},
        )
        with urllib.request.urlopen(ask, timeout=2) as answer:
            return answer.read().decode()

    def get(self, path: str) -> str | None:
        """The text at `path`, or None where there is none (404: no notice)."""
        for _ in range(2):
            if not self.token:
                self.token = self._token()
            ask = urllib.request.Request(
                f"{self.base}/latest/meta-data/{path}",
                headers={"X-aws-ec2-metadata-token": self.token},
            )
            try:
                with urllib.request.urlopen(ask, timeout=2) as answer:
                    return answer.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code != 401:
                    raise
                self.token = ""  # expired: a new one
        return None


def _parents() -> dict[int, int]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    found[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return found


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for `signum` (SigCgt in /proc/PID/status): only such a
    process is told, never one the signal would end (torchrun's agent, a shell)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def below(top: int) -> list[int]:
    """Every process under `top` in the process tree (torchrun starts its workers in
    sessions of their own: the tree, not the session, holds them)."""
    parents = _parents()
    found, todo = [], [top]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        found += kids
        todo += kids
    return found


def tree(top: int, run: int = 0) -> list[int]:
    """The run's processes: the command `run` and its tree when the run's agent names it
    (not the agent's copy passes beside it), else every process under `top`."""
    return [run, *below(run)] if run else below(top)


def ranks(top: int, signum: int, run: int = 0) -> list[int]:
    """The run's processes on this node that catch `signum`."""
    return [pid for pid in tree(top, run) if catches(pid, signum)]


def tell(rec: str, text: str) -> None:
    with open(os.path.join(rec, "log"), "a") as log:  # O_APPEND, beside the run's own lines
        log.write(f"vmrun: {text}\n")


def send(top: int, signum: int, run: int = 0) -> int:
    sent = 0
    for pid in ranks(top, signum, run):
        try:
            os.kill(pid, signum)
            sent += 1
        except OSError:
            continue
    return sent


def notice(rec: str, top: int, action: dict[str, str], run: int = 0) -> None:
    """The VM goes soon: the notice recorded (what the supervisor reads), the ranks told."""
    record = {"kind": "interruption", "seen": time.time(), **action}
    tmp = os.path.join(rec, f".notice.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, os.path.join(rec, "notice"))
    what = f"{action.get('action', 'terminate')} at {action.get('time', '?')}"
    sent = send(top, signal.SIGUSR2, run)
    if sent:
        tell(
            rec,
            f"spot interruption notice ({what}): snapshot and stop after this epoch"
            f" (SIGUSR2 to {sent} rank(s)), to go on without this node",
        )
    else:
        tell(
            rec,
            f"spot interruption notice ({what}): no process of the run catches SIGUSR2;"
            " it goes on until the node goes",
        )


def main() -> int:
    return watch(sys.argv[1], int(sys.argv[2]))


def watch(rec: str, pid: int, run: int = 0) -> int:
    """The watch itself (the script's, a Slurm job's; a part of run_agent.py, which names
    its command: `run`)."""
    every = float(os.environ.get("VMRUN_SPOT_EVERY") or 5)
    meta = Metadata(os.environ.get("VMRUN_IMDS") or IMDS)
    try:
        meta.get("instance-id")
    except (OSError, ValueError):
        return 0  # no metadata service here: nothing to watch
    rebalanced = False
    while alive(rec, pid):
        try:
            action = meta.get("spot/instance-action")
            if action is not None:
                said = json.loads(action)
                notice(rec, pid, said if isinstance(said, dict) else {}, run)
                return 0
            if not rebalanced and meta.get("events/recommendations/rebalance") is not None:
                sent = send(pid, signal.SIGUSR1, run)  # none yet (still starting): the next poll
                if sent:
                    rebalanced = True
                    tell(
                        rec,
                        f"spot rebalance recommendation: snapshot now (SIGUSR1 to {sent}"
                        " rank(s)); training goes on",
                    )
        except (OSError, ValueError):
            pass  # a missed read: the next one, in `every` s
        time.sleep(every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
