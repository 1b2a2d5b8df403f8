"""`vmrun train --fetch-every S`: pull a run's new checkpoints while it runs, so the newest one
is here even if the VM is lost, and its results once it has finished.

A thread beside the log follower, on the same connections (each round is a few channels,
one listing round trip when nothing changed): every S seconds the `checkpoints` of the run
on each of its nodes, leaving files modified in the last SETTLE seconds for the next
round (they may still be written). Into `results/<run-id>/` (a folder per node when
several), as `vmrun fetch` would put them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from vmrun.connection import Connection
from vmrun.errors import VmrunError

SETTLE = 0.5  # shorter than `fetch --watch`'s 2 s: snapshots are rewritten every few seconds,
# and a file that changes while it travels fails its checksum and comes next round anyway


class Fetcher:
    def __init__(
        self,
        conns: Sequence[Connection],
        rid: str,
        dest: Path,
        every: float,
        note: Callable[[str], None],
    ):
        self.conns = list(conns)
        self.rid = rid
        self.dest = dest
        self.every = every
        self.note = note
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="vmrun-fetcher")
        self.lock = threading.Lock()

    def start(self) -> Fetcher:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            self.round("checkpoints", settle=SETTLE)

    def round(self, what: str, *, settle: float = 0.0) -> None:
        """One fetch of `what` from every node; a node that fails is noted, not fatal."""
        from vmrun.fetch_what import locate_run, resolve_what
        from vmrun.transfer import Options, download

        with self.lock:
            for conn in self.conns:
                try:
                    location = locate_run(conn, self.rid)
                    host_dir = conn.label.replace("/", "_") if len(self.conns) > 1 else None
                    specs = resolve_what(what, location, host_dir=host_dir)
                    report = download(conn, specs, self.dest, Options(settle=settle))
                except VmrunError as exc:
                    self.note(f"{conn.label}: fetching {what} failed this round: {exc.message}")
                    continue
                if report.fetched:
                    names = ", ".join(report.fetched[:3]) + (
                        " ..." if len(report.fetched) > 3 else ""
                    )
                    self.note(f"{conn.label}: fetched {names} ({report.fetched_bytes} bytes)")

    def finish(self, *, results: bool) -> None:
        """Stop the rounds; with `results` (the run ended well) fetch everything it made."""
        self.stopped.set()
        self.thread.join(timeout=600)
        if results:
            self.round("results")
