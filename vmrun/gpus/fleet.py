"""The fleet watch: one watcher per host streaming its GPUs, and the model of the whole fleet.

Cost to the hosts is the point. Each host gets ONE SSH connection with ONE channel, for as
long as the watch lasts, running the watch script (`vmrun.gpus.nvidia_smi`): two
nvidia-smi processes in loop mode, and nothing started per refresh or per process. No rich
here: rendering lives in `vmrun.cli.gpus_view`.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vmrun.autostop.status import TAG as AUTOSTOP_TAG
from vmrun.autostop.status import AutostopStatus
from vmrun.compat import StrEnum
from vmrun.config import Settings
from vmrun.errors import (
    ConnectionLostError,
    ExitCode,
    UnreachableError,
    VmrunError,
    error_object,
    exit_code_for,
)
from vmrun.gpus.health import HostHealth, read_host
from vmrun.gpus.nvidia_smi import (
    APP_TAG,
    HEARTBEAT,
    NO_GPU_EXITS,
    OWNER_TAG,
    GpuBatcher,
    GpuProcess,
    GpuReading,
    ProcessTracker,
    parse_gpu_line,
    parse_owner_line,
)
from vmrun.gpus.targets import Target

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
HISTORY = 8  # utilisation samples kept per GPU: the table's sparkline
HEALTH_EVERY = 60.0  # seconds between two reads of a host's GPU health (`nvidia-smi -q`)


# -- samples and the fleet model --------------------------------------------------------------


class HostState(StrEnum):
    """A host's state in the watch (and in `--json`)."""

    OK = "ok"
    NO_GPU = "no-gpu"  # no driver, nvidia-smi or device
    UNREACHABLE = "unreachable"  # never connected
    DISCONNECTED = "disconnected"  # dropped; retried
    ERROR = "error"  # nvidia-smi failed (retried), or auth, host key...
    CONNECTING = "connecting"  # not heard from yet


@dataclass(frozen=True)
class HostSample:
    """What one host said at one time: its GPUs and processes, or why there are none."""

    host: str
    state: HostState
    time: float
    gpus: tuple[GpuReading, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    message: str | None = None
    exit_code: int = 0  # what this host adds to the exit code when the watch ends here
    code: str | None = None  # the error code (vmrun.errors.CODES) when the state is a failure
    autostop: AutostopStatus | None = None  # its autostop watchdog, when it has one
    health: HostHealth | None = None  # its GPUs' health (`nvidia-smi -q`, Xids), once a minute


@dataclass(frozen=True)
class GpuStatus:
    reading: GpuReading
    processes: tuple[GpuProcess, ...]
    history: tuple[float | None, ...]
    idle_for: float | None  # seconds under the idle threshold while a vmrun run holds it
    alert: bool
    flags: tuple[str, ...] = ()  # what is wrong with it or slows it (vmrun.gpus.health)


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
            gpus.append(
                {
                    **g.reading.to_json(),
                    "idle_for_s": idle,
                    "idle_alert": g.alert,
                    "health": list(g.flags),
                }
            )
        return {
            "host": s.host,
            "time": round(s.time, 3),
            "state": s.state,
            "message": s.message,
            "code": s.code,
            "error": s.code and error_object(s.code, s.message or s.state, s.exit_code or None),
            "gpus": gpus,
            "processes": [p.to_json(index.get(p.gpu_uuid)) for p in s.processes],
            "autostop": s.autostop.to_json() if s.autostop and s.autostop.installed else None,
        }


@dataclass
class _GpuTrack:
    history: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY))
    idle_since: float | None = None


class Fleet:
    """Latest status per host plus per-GPU history and the idle alert, in host order.

    Idle alert: a GPU that a process of a vmrun run holds (VMRUN_RUN_ID, see vmrun.gpus.nvidia_smi)
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
        flags = sample.health.flags().get(reading.index, ()) if sample.health else ()
        return GpuStatus(reading, procs, tuple(track.history), idle_for, alert, flags)

    def statuses(self) -> list[HostStatus]:
        """Every host in the order given; a host not heard from yet is "connecting"."""
        with self._lock:
            return [
                self._latest.get(h) or HostStatus(HostSample(h, HostState.CONNECTING, time.time()))
                for h in self.hosts
            ]

    def exit_code(self) -> int:
        return max((s.sample.exit_code for s in self.statuses()), default=0)


# -- watching one host ------------------------------------------------------------------------


class HostWatcher:
    """Streams one host's GPUs until stopped; reconnects with backoff when the host drops.

    Emits a HostSample per nvidia-smi iteration and one per change of state. With
    `once`, it takes a single reading (nvidia-smi without -l) and ends.
    """

    def __init__(
        self,
        target: Target,
        settings: Settings,
        *,
        interval: float,
        once: bool,
        deliver: Callable[[HostSample], None],
        stop: threading.Event,
    ):
        self.label = target.label
        self.target = target
        self.conn = target.conn
        self.interval = interval
        self.once = once
        self.deliver = deliver
        self.stop = stop
        # a one-shot reading must end even on a host that hangs mid-command
        self.once_timeout = max(15.0, 2 * settings.connect_timeout)
        self._delay = BACKOFF_FIRST
        self._connected_once = False
        self.autostop: AutostopStatus | None = None
        self.health: HostHealth | None = None
        self._health_due = 0.0
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"gpus-{self.label}")

    def _say(
        self,
        state: HostState,
        message: str | None = None,
        exit_code: int = 0,
        code: str | None = None,
    ) -> None:
        self.deliver(
            HostSample(
                self.label,
                state,
                time.time(),
                message=message,
                exit_code=exit_code,
                code=code,
                autostop=self.autostop,
                health=self.health,
            )
        )

    def _main(self) -> None:
        try:
            while not self.stop.is_set():
                why, state, error = self._attempt()
                if why is None or self.stop.is_set():
                    return
                if not self.target.shared:  # else the channel's end stopped it already
                    self.conn.close()  # also stops anything the last attempt left running
                self._say(state, f"{why}; retrying in {self._delay:g} s", code=error)
                if self.stop.wait(self._delay):
                    return
                self._delay = min(self._delay * 2, BACKOFF_MAX)
        finally:
            if not self.target.shared:
                self.conn.close()

    def _attempt(self) -> tuple[str | None, HostState, str | None]:
        """Connect and stream; return (why to retry, state to show, its error code), or
        (None, _, _) when done."""
        try:
            self.conn.open()
            self._connected_once = True
            return self._stream(), HostState.ERROR, "nvidia-smi-failed"
        except (UnreachableError, ConnectionLostError) as exc:
            state = HostState.DISCONNECTED if self._connected_once else HostState.UNREACHABLE
            why = exc.message
            if not self.once:
                return why, state, exc.code
            if not self.stop.is_set():
                self._say(state, why, exit_code_for(exc), exc.code)
        except VmrunError as exc:  # host key, auth, bad input: retrying cannot help
            if not self.stop.is_set():
                self._say(HostState.ERROR, exc.message, exit_code_for(exc), exc.code)
        return None, HostState.OK, None

    def _stream(self) -> str | None:
        """Run the watch script on one channel; return why to retry, or None when done."""
        out = _WatchOutput(self)
        self._read_health()
        argv = self.target.command(None if self.once else self.interval)
        try:
            timeout = self.once_timeout if self.once else None
            beat = None if self.once else HEARTBEAT
            result = self.conn.run(  # watching is no activity that keeps an autostop host up
                argv,
                on_output=out.feed,
                timeout=timeout,
                heartbeat=beat,
                what="nvidia-smi",
                activity=False,
            )
        except VmrunError as exc:
            if self.once and not isinstance(exc, (UnreachableError, ConnectionLostError)):
                self._say(HostState.ERROR, exc.message, exit_code_for(exc), exc.code)
                return None
            raise
        if self.stop.is_set():
            return None
        return self._ended(result.exit_status, out)

    def _ended(self, status: int, out: _WatchOutput) -> str | None:
        """The watch script ended with `status`: say what that means; return why to retry,
        or None when done (no GPU, or `once` and its one sample is shown)."""
        errors = out.errors
        if status in NO_GPU_EXITS:
            detail = errors[-1] if errors and status not in (126, 127) else None
            message = NO_GPU_EXITS[status] + (f" ({detail})" if detail else "")
            self._say(HostState.NO_GPU, message, ExitCode.REMOTE, code="no-gpu")
            return None
        if self.once and status == 0 and out.pending:
            out.publish(out.pending[-1])
            return None
        why = f"nvidia-smi exited with {status}" + (f": {errors[-1]}" if errors else "")
        if status == 0:
            why = "nvidia-smi ended without a GPU row"
        if self.once:
            self._say(HostState.ERROR, why, ExitCode.REMOTE, code="nvidia-smi-failed")
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
        if not self.once and time.monotonic() >= self._health_due:
            threading.Thread(
                target=self._read_health, daemon=True, name=f"health-{self.label}"
            ).start()
        sample = HostSample(self.label, HostState.OK, time.time(), tuple(batch), owned)
        self.deliver(replace(sample, autostop=self.autostop, health=self.health))

    def _read_health(self) -> None:
        """The host's GPU health, on a channel of its own (once a minute at most): a failed
        read keeps the last one, and never stops the watch."""
        self._health_due = time.monotonic() + HEALTH_EVERY
        if self.target.nvidia_smi is None:
            return
        with contextlib.suppress(VmrunError):
            self.health = read_host(self.conn, self.target.nvidia_smi)


# -- watching the fleet -----------------------------------------------------------------------


class _WatchOutput:
    """What one run of the watch script says: GPU rows on stdout (nvidia-smi's failures
    too), tagged lines on stderr (processes, their owners, the autostop state) and the
    shell's complaints. `once` keeps the batches for the end; else each is published."""

    def __init__(self, watcher: HostWatcher):
        self.watcher = watcher
        self.tracker = ProcessTracker(math.inf if watcher.once else 1.5 * watcher.interval + 0.5)
        self.batcher = GpuBatcher()
        self.errors: deque[str] = deque(maxlen=3)
        self.pending: list[list[GpuReading]] = []
        self.owners: dict[int, str | None] = {}

    def feed(self, stream: str, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        if stream == "err":
            self._tagged(text)
        elif parse_gpu_line(text) is None:
            if text.strip():  # nvidia-smi prints its failures on stdout
                self.errors.append(text.strip())
        else:
            for batch in self.batcher.feed(text):
                if self.watcher.once:
                    self.pending.append(batch)
                else:
                    self.publish(batch)

    def _tagged(self, text: str) -> None:
        tag, _, rest = text.partition(" ")
        if tag == APP_TAG:
            self.tracker.feed(rest, time.monotonic())
        elif tag == OWNER_TAG:
            owner = parse_owner_line(rest)
            if owner is not None:
                self.owners[owner[0]] = owner[1]
        elif tag == AUTOSTOP_TAG:
            self.watcher.autostop = AutostopStatus.from_watch_line(self.watcher.label, rest)
        elif text.strip():  # the shell's complaints ("not found")
            self.errors.append(text.strip())

    def publish(self, batch: list[GpuReading]) -> None:
        self.watcher._publish(batch, self.tracker.current(time.monotonic()), self.owners)


class FleetWatch:
    """A HostWatcher per host feeding one queue; the caller drains it and renders."""

    def __init__(
        self,
        targets: Sequence[Target],
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
                t, settings, interval=interval, once=once, deliver=self._queue.put, stop=self._stop
            )
            for t in targets
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
        conns = {id(w.conn): w for w in self.watchers}  # a shared connection closes once
        closers = [
            threading.Thread(target=w.conn.close, daemon=True, name=f"close-{w.label}")
            for w in conns.values()
        ]
        for closer in closers:
            closer.start()
        deadline = time.monotonic() + wait
        for thread in [*closers, *(w.thread for w in self.watchers)]:
            thread.join(max(0.0, deadline - time.monotonic()))
