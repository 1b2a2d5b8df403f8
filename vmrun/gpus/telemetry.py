"""GPU telemetry over SSH: nvidia-smi's CSV streams, parsed into samples, one watcher per host.

Cost to the hosts is the point. Each host gets ONE SSH connection with ONE channel, for as
long as the watch lasts, running one bash script (`WATCH_SCRIPT`). It starts two
`nvidia-smi ... -l INTERVAL` processes, because one nvidia-smi cannot stream both
`--query-gpu` (the devices) and `--query-compute-apps` (the processes); the devices stream
straight to the channel's stdout, and the script itself reads the processes, tags them and
writes them to stderr. It also looks up which vmrun run owns a new GPU pid with builtins
only, so nothing is started per refresh or per process. No rich here: rendering lives in
`vmrun.cli.watch_gpus_cmd`.
"""

from __future__ import annotations

import math
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmrun.config import Settings
from vmrun.errors import (
    ConfigError,
    ConnectionLostError,
    ExitCode,
    UnreachableError,
    VmrunError,
    exit_code_for,
)
from vmrun.remote_paths import RUN_ENV
from vmrun.ssh.connection import Connection
from vmrun.ssh.inventory import HostEntry

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

# Where nvidia-smi lives besides sshd's default PATH: NVIDIA's container/GKE layout and WSL.
EXTRA_PATH = "/usr/local/nvidia/bin:/usr/lib/wsl/lib"

# What the watch script writes on stderr besides error text: `APP_TAG ROW` for each
# compute-apps row, and `OWNER_TAG PID RUN_ID` (RUN_ID empty: not a vmrun run's) the first
# time a pid appears, before its row.
APP_TAG = "vmrun-app"
# Seconds a host waits without hearing from the watch before it stops its nvidia-smi: the
# watch may end while the link is down, and then no EOF ever reaches the host.
HEARTBEAT = 15.0
OWNER_TAG = "vmrun-owner"

# bash -c WATCH_SCRIPT vmrun-gpus NVIDIA_SMI GPU_QUERY APPS_QUERY FORMAT [LOOP]
# - NVIDIA_SMI is `nvidia-smi` or the host's `nvidia_smi` override (`~/` allowed), looked up
#   on PATH plus EXTRA_PATH; the wrapper (vmrun.ssh.quoting) has put ~/.vmrun/bin first already.
# - The devices query writes to stdout untouched; its exit status is the channel's, so
#   "not found" (127) or "no driver" (9) reach the watcher as they are.
# - The processes query is read here. Which run owns a pid: every process of a run carries
#   VMRUN_RUN_ID (vmrun.runs.records), even torchrun's workers in sessions of their own, so it is
#   read from /proc/PID/environ with `read -d ''` (a builtin: no grep per new pid). Another
#   user's process is unreadable and has no owner.
# - `read -t 2` wakes up to notice the devices query ending while no process holds a GPU
#   (then the processes query prints nothing); a line cut by that timeout is kept in $buf.
# - The processes query is a coproc: bash 4.0+ gives its pid (process substitution's $!
#   needs 4.4), and fd 3, a copy of its output, outlives bash closing the coproc's own fds.
# - When either query ends, the other is stopped, and the script exits with the devices'
#   status once both are gone. Everything is in one process group, which the wrapper kills
#   when the channel goes away.
WATCH_SCRIPT = r"""p=$1 g=$2 a=$3 f=$4
shift 4
case $p in "~/"*) p=$HOME/${p#??} ;; esac
PATH=$PATH:EXTRA_PATH_HERE
export PATH
"$p" "$g" "$f" "$@" &
gpu=$!
coproc APPS { exec "$p" "$a" "$f" "$@"; }
apps=$APPS_PID
exec 3<&"${APPS[0]}"
declare -A seen
buf=
while :; do
  IFS= read -r -t 2 -u 3 line
  rc=$?
  if [ $rc -gt 128 ]; then
    buf=$buf$line
    kill -0 "$gpu" 2>/dev/null && continue
    break
  fi
  line=$buf$line buf=
  if [ -n "$line" ]; then
    r=${line#*,} r=${r#*,} pid=${r%%,*} pid=${pid// /}
    case $pid in
    '' | *[!0-9]*) ;;
    *)
      if [ -z "${seen[$pid]}" ]; then
        seen[$pid]=1 own=
        while IFS= read -r -d '' e; do
          case $e in RUN_ENV_HERE=*) own=${e#*=}; break ;; esac
        done 2>/dev/null </proc/$pid/environ
        printf 'OWNER_TAG_HERE %s %s\n' "$pid" "$own" >&2
      fi ;;
    esac
    printf 'APP_TAG_HERE %s\n' "$line" >&2
  fi
  [ $rc -eq 0 ] || break
done
exec 3<&-
kill "$apps" 2>/dev/null
wait "$apps"
wait "$gpu"
"""
for _name, _value in (
    ("EXTRA_PATH", EXTRA_PATH),
    ("RUN_ENV", RUN_ENV),
    ("OWNER_TAG", OWNER_TAG),
    ("APP_TAG", APP_TAG),
):
    WATCH_SCRIPT = WATCH_SCRIPT.replace(f"{_name}_HERE", _value)
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # as vmrun.runs.records names runs

# nvidia-smi exit codes that mean "no usable NVIDIA GPU here", and the shell's "not found".
_NO_GPU_EXITS = {
    127: "no NVIDIA driver: nvidia-smi not found (or set nvidia_smi in vmrun.toml)",
    126: "no NVIDIA driver: nvidia-smi is not executable",
    9: "no NVIDIA driver loaded",
    12: "no NVIDIA driver: the NVML library is missing",
    6: "no NVIDIA GPU found",
}

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
HISTORY = 8  # utilisation samples kept per GPU: the table's sparkline


# -- parsing --------------------------------------------------------------------------------


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


def watch_argv(nvidia_smi: str, interval: float | None) -> list[str]:
    """argv of the one remote command per host; `interval` None reads once, else it loops."""
    argv = ["bash", "-c", WATCH_SCRIPT, "vmrun-gpus", nvidia_smi]
    argv += [f"--query-gpu={','.join(GPU_FIELDS)}", f"--query-compute-apps={','.join(APP_FIELDS)}"]
    argv.append(CSV_FORMAT)
    if interval is not None:
        argv.append(loop_arg(interval))
    return argv


# -- samples and the fleet model --------------------------------------------------------------


@dataclass(frozen=True)
class HostSample:
    """What one host said at one time: its GPUs and processes, or why there are none.

    state: ok, no-gpu (no driver, nvidia-smi or device), unreachable (never connected),
    disconnected (dropped; retried), error (nvidia-smi failed: retried; or auth, host key...),
    connecting (not heard from yet).
    """

    host: str
    state: str
    time: float
    gpus: tuple[GpuReading, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    message: str | None = None
    exit_code: int = 0  # what this host adds to the exit code when the watch ends here


@dataclass(frozen=True)
class GpuStatus:
    reading: GpuReading
    processes: tuple[GpuProcess, ...]
    history: tuple[float | None, ...]
    idle_for: float | None  # seconds under the idle threshold while a vmrun run holds it
    alert: bool


@dataclass(frozen=True)
class HostStatus:
    sample: HostSample
    gpus: tuple[GpuStatus, ...] = ()

    def to_json(self) -> dict[str, Any]:
        s = self.sample
        index = {g.reading.uuid: g.reading.index for g in self.gpus}
        gpus = []
        for g in self.gpus:
            idle = None if g.idle_for is None else round(g.idle_for, 1)
            gpus.append({**g.reading.to_json(), "idle_for_s": idle, "idle_alert": g.alert})
        return {
            "host": s.host,
            "time": round(s.time, 3),
            "state": s.state,
            "message": s.message,
            "gpus": gpus,
            "processes": [p.to_json(index.get(p.gpu_uuid)) for p in s.processes],
        }


@dataclass
class _GpuTrack:
    history: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY))
    idle_since: float | None = None


class Fleet:
    """Latest status per host plus per-GPU history and the idle alert, in host order.

    Idle alert: a GPU that a process of a vmrun run holds (VMRUN_RUN_ID, see WATCH_SCRIPT)
    but that stays under `idle_threshold` % for `idle_window` seconds or more: the classic
    data-loader bottleneck. Other processes on a GPU never count: their idleness is not ours.
    """

    def __init__(self, hosts: Sequence[str], *, idle_threshold: float, idle_window: float):
        self.hosts = list(hosts)
        self.idle_threshold = idle_threshold
        self.idle_window = idle_window
        self._lock = threading.Lock()
        self._latest: dict[str, HostStatus] = {}
        self._tracks: dict[tuple[str, str], _GpuTrack] = {}

    def update(self, sample: HostSample) -> HostStatus:
        with self._lock:
            gpus = tuple(self._gpu_status(sample, r) for r in sample.gpus)
            status = HostStatus(sample, gpus)
            self._latest[sample.host] = status
            return status

    def _gpu_status(self, sample: HostSample, reading: GpuReading) -> GpuStatus:
        track = self._tracks.setdefault((sample.host, reading.uuid), _GpuTrack())
        track.history.append(reading.utilization)
        procs = tuple(p for p in sample.processes if p.gpu_uuid == reading.uuid)
        util = reading.utilization
        run_holds = any(p.run for p in procs)  # a notebook or someone else's job is no run
        if run_holds and util is not None and util < self.idle_threshold:
            if track.idle_since is None:
                track.idle_since = sample.time
        else:
            track.idle_since = None
        idle_for = None if track.idle_since is None else sample.time - track.idle_since
        alert = idle_for is not None and idle_for >= self.idle_window
        return GpuStatus(reading, procs, tuple(track.history), idle_for, alert)

    def statuses(self) -> list[HostStatus]:
        """Every host in the order given; a host not heard from yet is "connecting"."""
        with self._lock:
            return [
                self._latest.get(h) or HostStatus(HostSample(h, "connecting", time.time()))
                for h in self.hosts
            ]

    def exit_code(self) -> int:
        return max((s.sample.exit_code for s in self.statuses()), default=0)


# -- watching one host ------------------------------------------------------------------------


def nvidia_smi_for(entry: HostEntry) -> str:
    """The host's `nvidia_smi` override from vmrun.toml, else `nvidia-smi` on the PATH."""
    value = entry.vars.get("nvidia_smi", "nvidia-smi")
    if not isinstance(value, str) or not value:
        raise ConfigError(f"host {entry.label}: nvidia_smi must be a path to nvidia-smi")
    return value


class HostWatcher:
    """Streams one host's GPUs until stopped; reconnects with backoff when the host drops.

    Emits a HostSample per nvidia-smi iteration and one per change of state. With
    `once`, it takes a single reading (nvidia-smi without -l) and ends.
    """

    def __init__(
        self,
        entry: HostEntry,
        settings: Settings,
        *,
        interval: float,
        once: bool,
        emit: Callable[[HostSample], None],
        stop: threading.Event,
    ):
        self.label = entry.label
        self.nvidia_smi = nvidia_smi_for(entry)
        self.conn = Connection(entry.spec, settings, label=entry.label)
        self.interval = interval
        self.once = once
        self.emit = emit
        self.stop = stop
        # a one-shot reading must end even on a host that hangs mid-command
        self.once_timeout = max(15.0, 2 * settings.connect_timeout)
        self._delay = BACKOFF_FIRST
        self._connected_once = False
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"gpus-{self.label}")

    def _say(self, state: str, message: str | None = None, code: int = 0) -> None:
        self.emit(HostSample(self.label, state, time.time(), message=message, exit_code=code))

    def _main(self) -> None:
        try:
            while not self.stop.is_set():
                why, state = self._attempt()
                if why is None or self.stop.is_set():
                    return
                self.conn.close()  # also stops anything the last attempt left running
                self._say(state, f"{why}; retrying in {self._delay:g} s")
                if self.stop.wait(self._delay):
                    return
                self._delay = min(self._delay * 2, BACKOFF_MAX)
        finally:
            self.conn.close()

    def _attempt(self) -> tuple[str | None, str]:
        """Connect and stream; return (why to retry, state to show), or (None, "") when done."""
        try:
            self.conn.open()
            self._connected_once = True
            return self._stream(), "error"
        except (UnreachableError, ConnectionLostError) as exc:
            state = "disconnected" if self._connected_once else "unreachable"
            why = exc.message.replace("'bash'", "nvidia-smi")  # argv[0] is the watch script's
            if not self.once:
                return why, state
            if not self.stop.is_set():
                self._say(state, why, exit_code_for(exc))
        except VmrunError as exc:  # host key, auth, bad input: retrying cannot help
            if not self.stop.is_set():
                self._say("error", exc.message, exit_code_for(exc))
        return None, ""

    def _stream(self) -> str | None:
        """Run the watch script on one channel; return why to retry, or None when done."""
        tracker = ProcessTracker(math.inf if self.once else 1.5 * self.interval + 0.5)
        batcher = GpuBatcher()
        errors: deque[str] = deque(maxlen=3)
        pending: list[list[GpuReading]] = []
        owners: dict[int, str | None] = {}

        def on_output(stream: str, data: bytes) -> None:
            text = data.decode("utf-8", "replace")
            if stream == "err":
                tag, _, rest = text.partition(" ")
                if tag == APP_TAG:
                    tracker.feed(rest, time.monotonic())
                elif tag == OWNER_TAG:
                    owner = parse_owner_line(rest)
                    if owner is not None:
                        owners[owner[0]] = owner[1]
                elif text.strip():  # the shell's complaints ("not found")
                    errors.append(text.strip())
                return
            if parse_gpu_line(text) is None:
                if text.strip():  # nvidia-smi prints its failures on stdout
                    errors.append(text.strip())
                return
            for batch in batcher.feed(text):
                if self.once:
                    pending.append(batch)
                else:
                    self._publish(batch, tracker.current(time.monotonic()), owners)

        argv = watch_argv(self.nvidia_smi, None if self.once else self.interval)
        try:
            timeout = self.once_timeout if self.once else None
            beat = None if self.once else HEARTBEAT
            result = self.conn.run(argv, on_output=on_output, timeout=timeout, heartbeat=beat)
        except VmrunError as exc:
            if self.once and not isinstance(exc, (UnreachableError, ConnectionLostError)):
                self._say("error", exc.message, exit_code_for(exc))
                return None
            raise
        if self.stop.is_set():
            return None
        status = result.exit_status
        if status in _NO_GPU_EXITS:
            detail = errors[-1] if errors and status not in (126, 127) else None
            message = _NO_GPU_EXITS[status] + (f" ({detail})" if detail else "")
            self._say("no-gpu", message, ExitCode.REMOTE)
            return None
        if self.once and status == 0 and pending:
            self._publish(pending[-1], tracker.current(time.monotonic()), owners)
            return None
        why = f"nvidia-smi exited with {status}" + (f": {errors[-1]}" if errors else "")
        if status == 0:
            why = "nvidia-smi ended without a GPU row"
        if self.once:
            self._say("error", why, ExitCode.REMOTE)
            return None
        return why

    def _publish(
        self,
        batch: list[GpuReading],
        processes: tuple[GpuProcess, ...],
        owners: dict[int, str | None],
    ) -> None:
        owned = tuple(
            GpuProcess(p.gpu_uuid, p.pid, p.name, p.memory_used, owners.get(p.pid))
            for p in processes
        )
        self._delay = BACKOFF_FIRST  # healthy again: the next drop retries quickly
        self.emit(HostSample(self.label, "ok", time.time(), tuple(batch), owned))


# -- watching the fleet -----------------------------------------------------------------------


class FleetWatch:
    """A HostWatcher per host feeding one queue; the caller drains it and renders."""

    def __init__(
        self,
        entries: Sequence[HostEntry],
        settings: Settings,
        fleet: Fleet,
        *,
        interval: float,
        once: bool,
    ):
        self.fleet = fleet
        self._queue: queue.Queue[HostSample] = queue.Queue()
        self._stop = threading.Event()
        self.watchers = [
            HostWatcher(
                e, settings, interval=interval, once=once, emit=self._queue.put, stop=self._stop
            )
            for e in entries
        ]

    def start(self) -> FleetWatch:
        for watcher in self.watchers:
            watcher.thread.start()
        return self

    @property
    def finished(self) -> bool:
        """Every watcher has ended (possible only in once mode or on errors) and all is read."""
        return self._queue.empty() and not any(w.thread.is_alive() for w in self.watchers)

    def drain(self, timeout: float) -> list[HostStatus]:
        """Wait up to `timeout` for news; return every status that arrived, fleet updated."""
        try:
            samples = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                samples.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return [self.fleet.update(s) for s in samples]

    def stop(self, wait: float = 3.0) -> None:
        """Close every connection, which stops nvidia-smi on every host, waiting at most `wait`.

        A connection still being opened holds its lock until the connect timeout; its closer
        is left behind, and the process exiting drops that socket just the same.
        """
        self._stop.set()
        closers = [
            threading.Thread(target=w.conn.close, daemon=True, name=f"close-{w.label}")
            for w in self.watchers
        ]
        for closer in closers:
            closer.start()
        deadline = time.monotonic() + wait
        for thread in [*closers, *(w.thread for w in self.watchers)]:
            thread.join(max(0.0, deadline - time.monotonic()))
