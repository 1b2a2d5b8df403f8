"""nvidia-smi over one SSH channel: the watch script's command, and its CSV streams parsed.

One nvidia-smi cannot stream both `--query-gpu` (the devices) and `--query-compute-apps`
(the processes), so the watch script (vmrun/hostside/gpus_watch.bash) starts one of each: the
devices stream straight to the channel's stdout, and the script tags the processes, with
the vmrun run that owns each new pid, on stderr. This module builds that command and turns
both streams into readings; `vmrun.gpus.fleet` runs it on every host.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vmrun import hostside
from vmrun.autostop.status import TAG as AUTOSTOP_TAG
from vmrun.remote_paths import NVIDIA_PATH, RUN_ENV

# The query order is ours: `count` makes every iteration self-delimiting (a batch is complete
# after `count` rows) and the free-text name goes last, so a comma in it cannot shift fields.
GPU_FIELDS = (
    "count",
    "index",
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "name",
)
# Compute apps print nothing at all when no process holds a GPU, so rows carry `timestamp`:
# rows of one iteration share it. process_name goes last for the same reason as name above.
APP_FIELDS = ("timestamp", "gpu_uuid", "pid", "used_memory", "process_name")
CSV_FORMAT = "--format=csv,noheader,nounits"

EXTRA_PATH = NVIDIA_PATH  # where nvidia-smi lives besides sshd's default PATH

# What the watch script writes on stderr besides error text: `APP_TAG ROW` for each
# compute-apps row, and `OWNER_TAG PID RUN_ID` (RUN_ID empty: not a vmrun run's) the first
# time a pid appears, before its row.
APP_TAG = "vmrun-app"
# Seconds a host waits without hearing from the watch before it stops its nvidia-smi: the
# watch may end while the link is down, and then no EOF ever reaches the host.
HEARTBEAT = 15.0
OWNER_TAG = "vmrun-owner"

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # as vmrun.backends.hosts.records names runs

# nvidia-smi exit codes that mean "no usable NVIDIA GPU here", and the shell's "not found".
NO_GPU_EXITS = {
    127: "no NVIDIA driver: nvidia-smi not found (or set nvidia_smi in vmrun.toml)",
    126: "no NVIDIA driver: nvidia-smi is not executable",
    9: "no NVIDIA driver loaded",
    12: "no NVIDIA driver: the NVML library is missing",
    6: "no NVIDIA GPU found",
}


def parse_value(text: str) -> str | None:
    """One CSV field; nvidia-smi writes unavailable values as `[N/A]`, `[Not Supported]`..."""
    text = text.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def _number(text: str) -> float | None:
    value = parse_value(text)
    if value is None:
        return None
    try:
        number = float(value.split()[0])  # tolerate units if `nounits` were ever ignored
    except (ValueError, IndexError):
        return None
    return number if math.isfinite(number) else None


def _split(line: str, fields: Sequence[str]) -> list[str] | None:
    parts = line.rstrip("\r\n").split(",", len(fields) - 1)
    return [p.strip() for p in parts] if len(parts) == len(fields) else None


@dataclass(frozen=True)
class GpuReading:
    """One GPU in one iteration. Units: %, MiB, degrees C, W; None where the GPU has none."""

    count: int
    index: int
    uuid: str
    name: str
    utilization: float | None
    memory_used: float | None
    memory_total: float | None
    temperature: float | None
    power_draw: float | None
    power_limit: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "utilization_pct": self.utilization,
            "memory_used_mib": self.memory_used,
            "memory_total_mib": self.memory_total,
            "temperature_c": self.temperature,
            "power_draw_w": self.power_draw,
            "power_limit_w": self.power_limit,
        }


def parse_gpu_line(line: str) -> GpuReading | None:
    """A `--query-gpu=GPU_FIELDS` row, or None for anything else (an error line, a blank)."""
    parts = _split(line, GPU_FIELDS)
    if parts is None:
        return None
    count, index, uuid, util, used, total, temp, draw, limit, name = parts
    try:
        count_n, index_n = int(count), int(index)
    except ValueError:
        return None
    return GpuReading(
        count=count_n,
        index=index_n,
        uuid=uuid,
        name=name,
        utilization=_number(util),
        memory_used=_number(used),
        memory_total=_number(total),
        temperature=_number(temp),
        power_draw=_number(draw),
        power_limit=_number(limit),
    )


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU; `run` is the vmrun run that owns it, when known."""

    gpu_uuid: str
    pid: int
    name: str
    memory_used: float | None
    run: str | None = None

    def to_json(self, gpu_index: int | None) -> dict[str, Any]:
        return {
            "gpu_index": gpu_index,
            "gpu_uuid": self.gpu_uuid,
            "pid": self.pid,
            "name": self.name,
            "memory_used_mib": self.memory_used,
            "run": self.run,
        }


def parse_app_line(line: str) -> tuple[str, GpuProcess] | None:
    """A `--query-compute-apps=APP_FIELDS` row as (timestamp, process), or None."""
    parts = _split(line, APP_FIELDS)
    if parts is None:
        return None
    stamp, uuid, pid, used, name = parts
    try:
        pid_n = int(pid)
    except ValueError:
        return None
    return stamp, GpuProcess(uuid, pid_n, parse_value(name) or "?", _number(used))


class GpuBatcher:
    """Groups the query-gpu stream into one batch per nvidia-smi iteration.

    A batch ends after `count` rows; an index that does not grow also ends one, so a GPU
    whose row was an error line never merges two iterations.
    """

    def __init__(self) -> None:
        self._rows: list[GpuReading] = []

    def feed(self, line: str) -> list[list[GpuReading]]:
        reading = parse_gpu_line(line)
        if reading is None:
            return []
        done = []
        if self._rows and reading.index <= self._rows[-1].index:
            done.append(self._rows)
            self._rows = []
        self._rows.append(reading)
        if len(self._rows) >= reading.count:
            done.append(self._rows)
            self._rows = []
        return done


class ProcessTracker:
    """The processes of the latest compute-apps iteration, while it is fresh.

    An iteration with no process prints nothing, so "no rows for longer than max_age" is
    how the last process leaving shows up.
    """

    def __init__(self, max_age: float):
        self.max_age = max_age
        self._lock = threading.Lock()
        self._stamp: str | None = None
        self._rows: list[GpuProcess] = []
        self._arrived = -math.inf

    def feed(self, line: str, now: float) -> None:
        parsed = parse_app_line(line)
        if parsed is None:
            return
        stamp, process = parsed
        with self._lock:
            if stamp != self._stamp:
                self._stamp, self._rows = stamp, []
            self._rows.append(process)
            self._arrived = now

    def current(self, now: float) -> tuple[GpuProcess, ...]:
        with self._lock:
            return tuple(self._rows) if now - self._arrived <= self.max_age else ()


def parse_owner_line(text: str) -> tuple[int, str | None] | None:
    """The rest of an `OWNER_TAG PID RUN_ID` line -> (pid, run id or None), or None."""
    pid, _, run = text.strip().partition(" ")
    if not pid.isdigit():
        return None
    run = run.strip()
    return int(pid), (run if _RUN_ID.fullmatch(run) else None)


def loop_arg(interval: float) -> str:
    """nvidia-smi's loop flag: whole seconds as --loop, anything finer as --loop-ms."""
    if float(interval).is_integer():
        return f"--loop={int(interval)}"
    return f"--loop-ms={round(interval * 1000)}"


def watch_argv(
    nvidia_smi: str, interval: float | None, autostop_state: str = "", *, inline: bool = False
) -> list[str]:
    """argv of the one remote command per host; `interval` None reads once, else it loops.
    `autostop_state`: the watchdog's state file, reported as it changes (vmrun.autostop).
    `inline`: the script's text (`bash -c`), for a node that may not see the home where
    vmrun's host-side files are installed (a Slurm compute node)."""
    script = (
        ["bash", "-c", hostside.source("gpus_watch.bash"), "vmrun-gpus"]
        if inline
        else hostside.command("gpus_watch.bash")
    )
    argv = [
        *script,
        RUN_ENV,
        EXTRA_PATH,
        APP_TAG,
        OWNER_TAG,
        AUTOSTOP_TAG,
        autostop_state,
        nvidia_smi,
    ]
    argv += [f"--query-gpu={','.join(GPU_FIELDS)}", f"--query-compute-apps={','.join(APP_FIELDS)}"]
    argv.append(CSV_FORMAT)
    if interval is not None:
        argv.append(loop_arg(interval))
    return argv
