"""Beside a run on each node: a run that stops moving while its processes live (a collective
that waits for a rank that never comes, a dead data loader), found and told once.

    python3 hang_watch.py REC PID TIMEOUT ACTION RUN_ID RANKED [slurm [PYTHON]]

(on an SSH host, `watch` is a part of the run's agent, run_agent.py: the same watch)

Progress is a rank's heartbeat (REC/beat/rank-R, which vmrun's trainer writes every second
while it steps; a script of its own may touch such a file too) or a new line in the run's
log from a rank (RANKED=1: torchrun's output, whose ranks' lines carry their prefix, so its
own banner is not progress; 0: any line). A node judges only once it has seen progress:
on a node whose ranks print nothing and beat nothing, silence is no news. When none came
for TIMEOUT seconds, once per stall:

- every rank's stacks on this node go to REC/stacks/hang-N/ (stacks.py, py-spy);
- REC/hang holds what was seen (JSON: since, seen, timeout, host, ranks, stacks, action)
  and the log gets one line naming the host, the ranks and where the stacks are;
- ACTION stop: after a grace (a quarter of TIMEOUT, 5 to 30 s: the other nodes' watchers
  and a follower take their stacks meanwhile, the silent nodes' too), the ranks get
  SIGTERM, SIGKILL 10 s later, and REC/hang_stopped is written,
  so the run ends failed (exit 124, run_agent.py) and a --recover run's supervisor
  brings it back from its snapshot; ACTION wait: it goes on watching, and says so when
  progress comes again (the next stall is a new one).

It also reads which network NCCL chose (the INIT/NET lines vmrun has NCCL write to
REC/nccl/*.log): REC/nccl/transport records it, and when NCCL fell back to TCP sockets on a
host that has RDMA devices (InfiniBand, RoCE, AWS EFA in /sys/class/infiniband) the log
says so once: such a multi-node run can be slower than one node.

PID is the run's agent; the watch ends with it. Stdlib only.

`slurm`: beside a Slurm job's step, in its batch script (slurm_job.bash, from the copies of
this file and its siblings the job writes into REC/.watch): PID is the step's srun, the log
REC/job.log (each line labelled by srun), the heartbeats REC/beat on the shared filesystem
(every node's ranks), the stacks taken on every node of the job at once (`srun --overlap`,
one task per node), and `stop` sends the step's srun SIGTERM, which it passes to every task.
PYTHON: the run's interpreter, which takes the ranks' stacks (the batch script's
VMRUN_PYTHON); the watch reads nothing of the run's record (run.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings on the host
from spot_watch import alive  # type: ignore[import-not-found]
from stacks import ranks  # type: ignore[import-not-found]

RANK_LINE = re.compile(rb"^(?:\s*\d+: )?\x1e?\[rank\d+\]:", re.MULTILINE)  # srun's label first


LOG = "log"  # the run's log in REC (a Slurm job's: job.log)


def tell(rec: str, text: str) -> None:
    with open(os.path.join(rec, LOG), "a") as log:  # O_APPEND, beside the run's own lines
        log.write(f"vmrun: {text}\n")


def period(seconds: float) -> str:
    seconds = int(seconds)
    parts = [(seconds // 3600, "h"), (seconds // 60 % 60, "m"), (seconds % 60, "s")]
    return "".join(f"{n}{u}" for n, u in parts if n) or "0s"


def spans(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> `0-2,5`."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


class Progress:
    """The newest sign of progress on this node (this host's clock), None before the first."""

    def __init__(self, rec: str, ranked: bool, log: str = "log"):
        self.rec, self.ranked, self.log = rec, ranked, log
        self.offset = 0
        with contextlib.suppress(OSError):  # an earlier attempt's lines are not this one's
            self.offset = os.path.getsize(os.path.join(rec, log))
        self.last: float | None = None

    def seen(self) -> float | None:
        try:
            with open(os.path.join(self.rec, self.log), "rb") as log:
                log.seek(self.offset)
                new = log.read(1 << 22)
            cut = new.rfind(b"\n") + 1  # whole lines only; the rest is read again
            lines = [x for x in new[:cut].split(b"\n") if x and not x.startswith(b"vmrun: ")]
            if lines and (not self.ranked or RANK_LINE.search(b"\n".join(lines))):
                self.last = time.time()  # vmrun's own lines (this watcher's) are no progress
            self.offset += cut
        except OSError:
            pass
        beat = os.path.join(self.rec, "beat")
        try:
            for name in os.listdir(beat):
                when = os.stat(os.path.join(beat, name)).st_mtime
                if self.last is None or when > self.last:
                    self.last = when
        except OSError:
            pass
        return self.last


NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$", re.MULTILINE)
NET_DEVICES = re.compile(r"NCCL INFO NET/(\w+) : Using \[")  # the same, in its device line


class Transport:
    """The network NCCL chose on this node, read from its debug files as they grow."""

    def __init__(self, rec: str, rdma_dir: str = "/sys/class/infiniband"):
        self.folder = os.path.join(rec, "nccl")
        self.rdma_dir = rdma_dir
        self.read: dict[str, int] = {}
        self.network = ""

    def seen(self) -> str:
        """The network (IB, Socket, AWS Libfabric...) once NCCL has said it, else ""."""
        if self.network:
            return self.network
        try:
            names = [n for n in os.listdir(self.folder) if n.endswith(".log")]
        except OSError:
            return ""
        for name in names:
            path = os.path.join(self.folder, name)
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.read.get(name, 0))
                    text = fh.read(1 << 20)
            except OSError:
                continue
            cut = text.rfind(b"\n") + 1
            self.read[name] = self.read.get(name, 0) + cut
            lines = text[:cut].decode(errors="replace")
            match = NETWORK.search(lines) or NET_DEVICES.search(lines)
            if match:
                self.network = match.group(1).strip()
                return self.network
        return ""

    def rdma(self) -> list[str]:
        try:
            return sorted(os.listdir(self.rdma_dir))
        except OSError:
            return []

    def warning(self) -> str:
        """What to say when NCCL fell back to sockets beside RDMA devices, else ""."""
        devices = self.rdma()
        if self.network.lower() != "socket" or not devices:
            return ""
        return (
            f"NCCL chose TCP sockets (NET/Socket) though this host has RDMA devices"
            f" ({', '.join(devices)}): a multi-node run may crawl; look for NCCL_IB_DISABLE"
            f" or NCCL_NET in the environment, a missing IB/EFA plugin (aws-ofi-nccl), or"
            f" `Failed to open libibverbs` in {self.folder}"
        )


def stacks(rec: str, run_id: str, folder: str, slurm: bool = False, python: str = "") -> list[int]:
    """Every rank's stacks here (`slurm`: on every node of the job) into `folder`
    (stacks.py beside this file, under `python`: the run's, which the launch spec names);
    their ranks."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    python = python or os.environ.get("VMRUN_PYTHON") or sys.executable
    argv = [python, os.path.join(here, "stacks.py"), run_id, folder]
    if slurm:
        nodes = os.environ.get("SLURM_NNODES", "1")
        argv = [
            "srun",
            "--overlap",
            f"--jobid={os.environ.get('SLURM_JOB_ID', '')}",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            "--ntasks-per-node=1",
            *argv,
        ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    del done  # the ranks are the files written (several nodes' output is mixed by srun)
    with contextlib.suppress(OSError):
        names = os.listdir(folder)
        return sorted(int(n[5:-5]) for n in names if n.startswith("rank-") and n.endswith(".json"))
    return []


def stop_ranks(run_id: str, srun: int = 0) -> None:
    """SIGTERM to the run's ranks here, SIGKILL to those left after 10 s: torchrun sees its
    workers fail and ends the run. On Slurm (`srun`: the step's) srun passes it to every
    task of the step."""
    pids = [srun] if srun else [int(r["pid"]) for r in ranks(run_id)]
    terminate(lambda: pids)


def terminate(pids_of: Callable[[], list[int]]) -> None:
    """SIGTERM to these processes, SIGKILL to those left (asked again) after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        pids = pids_of()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        until = time.time() + wait
        while wait and time.time() < until and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.2)


def write_json(path: str, value: object) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(value, fh)
    os.replace(tmp, path)


def waiter(pid: int) -> Callable[[float], None]:
    """A way to sleep that ends the moment `pid` exits (a pidfd, Linux 5.3+), so nothing of
    the watch outlives the run by a poll's length; else a plain sleep."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return time.sleep

    def wait(seconds: float) -> None:
        select.select([fd], [], [], seconds)

    return wait


def running(pid: int) -> bool:
    """A Slurm step's srun, alive and no zombie (its batch shell waits for it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main() -> int:
    global LOG
    rec, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    action, run_id, ranked = sys.argv[4], sys.argv[5], sys.argv[6] == "1"
    slurm = sys.argv[7:8] == ["slurm"]
    if slurm:
        LOG = "job.log"
    python = sys.argv[8] if len(sys.argv) > 8 else ""
    return watch(rec, pid, timeout, action, run_id, ranked, slurm, python)


def watch(
    rec: str,
    pid: int,
    timeout: float,
    action: str,
    run_id: str,
    ranked: bool,
    slurm: bool = False,
    python: str = "",
) -> int:
    """The watch itself, until PID ends (or the run is stopped): the script's, and a part of
    the run's agent (run_agent.py) on an SSH host."""
    every = max(0.2, min(5.0, timeout / 10))
    pause = waiter(pid)
    progress = Progress(rec, ranked, LOG)
    live = (lambda: running(pid)) if slurm else (lambda: alive(rec, pid))
    host = socket.gethostname() if not slurm else f"job {os.environ.get('SLURM_JOB_ID', '?')}"
    try:  # an earlier attempt's stalls keep their folders
        kept = os.listdir(os.path.join(rec, "stacks"))
    except OSError:
        kept = []
    stalls, hung = sum(1 for name in kept if name.startswith("hang-")), False
    transport, told = Transport(rec), False
    while live():
        if not told and transport.seen():
            told = True
            write_json(
                os.path.join(rec, "nccl", "transport"),
                {"network": transport.network, "rdma": transport.rdma(), "host": host},
            )
            if transport.warning():
                tell(rec, f"{host}: {transport.warning()}")
        last = progress.seen()
        now = time.time()
        if last is not None and hung and now - last < timeout:
            hung = False
            tell(rec, f"progress again on {host}")
        elif last is not None and not hung and now - last >= timeout:
            hung, stalls = True, stalls + 1
            folder = os.path.join(rec, "stacks", f"hang-{stalls}")
            tell(
                rec,
                f"no progress for {period(now - last)} on {host} (--hang-timeout"
                f" {period(timeout)}): taking every rank's stacks",
            )
            found = stacks(rec, run_id, folder, slurm, python)
            write_json(
                os.path.join(rec, "hang"),
                {
                    "since": last,
                    "seen": now,
                    "timeout": timeout,
                    "host": host,
                    "ranks": sorted(found),
                    "stacks": os.path.relpath(folder, rec),
                    "action": action,
                    "stall": stalls,
                },
            )
            where = f"ranks {spans(found)}" if found else "no rank found"
            grace = min(30.0, max(5.0, timeout / 4))
            then = (
                f"stopping the run in {grace:.0f} s"
                if action == "stop"
                else "waiting (--on-hang wait)"
            )
            tell(
                rec,
                f"hung on {host}: {where}; stacks in {folder}"
                f" (`vmrun stacks {run_id} --hang`); {then}",
            )
            if action == "stop":
                time.sleep(grace)
                if (progress.seen() or 0) > last:  # it moved after all: not stopped
                    hung = False
                    tell(rec, f"progress again on {host}: the run is not stopped")
                    continue
                write_json(os.path.join(rec, "hang_stopped"), {"seen": now})
                stop_ranks(run_id, pid if slurm else 0)
                return 0
        pause(every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
