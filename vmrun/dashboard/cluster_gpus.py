"""The GPUs page's clusters: what `vmrun watch-gpus -C NAME` shows (the GPUs of the nodes
the user's running jobs hold, each read by an `srun --overlap` step over the one connection
to the login node), for each of the project's clusters, live.

`watch-gpus -C` picks its jobs once; a page open for hours sees jobs start and end, so the
jobs are listed again every RESCAN_S: a node of a new job gets its own watch, a node whose
job ended is dropped (its step ended with the job)."""

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


class ClusterGpus:
    """One thread per cluster, for the server's life, started by the first ask; `now()`
    is each cluster's nodes as `watch-gpus -C --json` has them, or why there are none."""

    def __init__(self, settings: Settings, clusters: list[str]):
        self._settings = settings
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state: dict[str, dict[str, Any]] = {
            name: {"cluster": name, "hosts": [], "note": "listing its running jobs", "error": None}
            for name in clusters
        }
        self._threads = [
            threading.Thread(target=self._main, args=(name,), daemon=True, name=f"gpus-{name}")
            for name in clusters
        ]

    def start(self) -> ClusterGpus:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def now(self) -> dict[str, Any]:
        with self._lock:
            return {"clusters": [dict(c, hosts=list(c["hosts"])) for c in self._state.values()]}

    def _set(self, name: str, **values: Any) -> None:
        with self._lock:
            self._state[name].update(values)

    def _main(self, name: str) -> None:
        watches: dict[str, FleetWatch] = {}  # a node of a running job (its label): its watch
        while not self._stop.is_set():
            try:
                self._watch(name, watches)
            except VmrunError as exc:
                self._set(name, error=exc.one_line(), note=None)
            for watch in watches.values():
                watch.stop(wait=0)
            watches.clear()
            self._stop.wait(RESCAN_S)

    def _watch(self, name: str, watches: dict[str, FleetWatch]) -> None:
        """The cluster's running jobs' nodes, each watched, listed again every RESCAN_S."""
        from vmrun.backends.slurm import gpus, session
        from vmrun.gpus import fleet

        with session.cluster_backend(self._settings, name) as slurm:
            while not self._stop.is_set():
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
