"""The GPUs page's clusters: what `vmrun watch-gpus -C NAME` shows (the GPUs of the nodes
the user's running jobs hold, each read by an `srun --overlap` step over the one connection
to the login node), for each of the project's clusters, live.

`watch-gpus -C` picks its jobs once; a page open for hours sees jobs start and end, so the
jobs are listed again every RESCAN_S: a node of a new job gets its own watch, a node whose
job ended is dropped (its step ended with the job). A cluster that fails is dialled again
later each time (up to BACKOFF_MAX_S: its sshd, or its second factor, may lock out who dials
too often); a cluster no page has asked about for IDLE_S is let go (its steps stopped), and
watched again at the next ask."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from vmrun.config import Settings
from vmrun.errors import VmrunError

if TYPE_CHECKING:
    from vmrun.gpus.fleet import FleetWatch

RESCAN_S = 15.0  # how often a cluster's running jobs are listed again (one squeue)
INTERVAL_S = 2.0  # nvidia-smi's period on each node, as `watch-gpus`' default
TICK_S = 1.0  # how often the page's view of the nodes is brought up to date
BACKOFF_MAX_S = 300.0  # the longest wait before a failing cluster is dialled again
IDLE_S = 60.0  # unasked this long, a cluster's watch ends (the next ask starts it again)


class ClusterGpus:
    """One thread per cluster, started by the first ask and ended IDLE_S after the last;
    `now()` is each cluster's nodes as `watch-gpus -C --json` has them, or why there are
    none."""

    def __init__(self, settings: Settings, clusters: list[str]):
        self._settings = settings
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state: dict[str, dict[str, Any]] = {
            name: {"cluster": name, "hosts": [], "note": "listing its running jobs", "error": None}
            for name in clusters
        }
        self._threads: dict[str, threading.Thread | None] = dict.fromkeys(clusters)
        self._asked = time.monotonic()

    def start(self) -> ClusterGpus:
        with self._lock:
            self._asked = time.monotonic()
            for name, thread in self._threads.items():
                if thread is None:
                    self._threads[name] = thread = threading.Thread(
                        target=self._main, args=(name,), daemon=True, name=f"gpus-{name}"
                    )
                    self._state[name].update(hosts=[], note="listing its running jobs", error=None)
                    thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def now(self) -> dict[str, Any]:
        """Each cluster's nodes; a cluster whose watch ended unasked is watched again."""
        self.start()
        with self._lock:
            return {"clusters": [dict(c, hosts=list(c["hosts"])) for c in self._state.values()]}

    def _set(self, name: str, **values: Any) -> None:
        with self._lock:
            self._state[name].update(values)

    def _idle(self) -> bool:
        return time.monotonic() - self._asked > IDLE_S

    def _main(self, name: str) -> None:
        failures = 0  # in a row: since the jobs were last listed
        while not self._stop.is_set():
            try:
                self._watch(name)
            except Exception as exc:  # any: shown as the cluster's error, never a frozen page
                why = (
                    exc.one_line()
                    if isinstance(exc, VmrunError)
                    else f"{type(exc).__name__}: {exc}"
                )
                with self._lock:  # no error since the last: the jobs were listed in between
                    failures = failures + 1 if self._state[name]["error"] else 1
                    self._state[name].update(error=why, note=None, hosts=[])
            wait = min(RESCAN_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)
            until = time.monotonic() + wait
            while time.monotonic() < until and not self._stop.wait(min(TICK_S, wait)):
                if self._idle():
                    break
            with self._lock:  # decided under the lock: an ask now sees this thread gone
                if self._idle():
                    self._threads[name] = None
                    return

    def _watch(self, name: str) -> None:
        """The cluster's running jobs' nodes, each watched, listed again every RESCAN_S,
        until no page asks; their steps stopped before the connection closes."""
        from vmrun.backends.slurm import gpus, session
        from vmrun.gpus import fleet

        watches: dict[str, FleetWatch] = {}  # a node of a running job (its label): its watch
        with session.cluster_backend(self._settings, name) as slurm:
            try:
                while not self._stop.is_set() and not self._idle():
                    nodes = {n.label: n for n in gpus.running_nodes(slurm, None, None)}
                    for label in [label for label in watches if label not in nodes]:
                        watches.pop(label).stop(wait=0)  # its job ended: so did its step
                    for label, node in nodes.items():
                        if label not in watches:
                            targets = gpus.node_targets(slurm, [node])
                            watched = fleet.Fleet([label], idle_threshold=10.0, idle_window=60.0)
                            watches[label] = fleet.FleetWatch(
                                targets, self._settings, watched, interval=INTERVAL_S, once=False
                            ).start()
                    note = None if nodes else f"no running job of yours on cluster {name}"
                    self._set(name, error=None, note=note)
                    until = time.monotonic() + RESCAN_S
                    while not self._stop.wait(TICK_S):
                        hosts = []
                        for watch in watches.values():
                            watch.drain(0)
                            hosts += [s.to_json() for s in watch.fleet.statuses()]
                        self._set(name, hosts=hosts)
                        if time.monotonic() >= until:
                            break
            finally:
                for watch in watches.values():
                    watch.stop(wait=0)
