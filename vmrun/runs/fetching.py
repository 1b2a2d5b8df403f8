"""`vmrun train --fetch-every S`: pull a run's new checkpoints while it runs, so the newest one
is here even if the VM is lost, and its results once it has finished.

A thread beside the log follower, on the same connections (each round is a few channels,
one listing round trip when nothing changed): every S seconds the `checkpoints` of the run
on each of its nodes, leaving files modified in the last SETTLE seconds for the next
round (they may still be written). Into `results/<run-id>/` (a folder per node when
several), as `vmrun fetch` would put them. The nodes are fetched from concurrently
(vmrun.ssh.group), each node's notes kept together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from vmrun.errors import VmrunError
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry

SETTLE = 0.5  # shorter than `fetch --watch`'s 2 s: snapshots are rewritten every few seconds,
# and a file that changes while it travels fails its checksum and comes next round anyway


def _borrowed_group(conns: Sequence[Connection]) -> Group:
    """A Group over connections the caller already holds, for Group.map's fan-out (a thread
    per node, an outcome per node, Ctrl-C closing the connections); no new connections."""
    group = Group([], conns[0].settings if conns else None)  # type: ignore[arg-type]
    group.entries = [HostEntry(conn.spec, name=conn.label) for conn in conns]
    group.connections = {conn.label: conn for conn in conns}
    return group


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
        self.group = _borrowed_group(self.conns)

    def start(self) -> Fetcher:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            self.round("checkpoints", settle=SETTLE)

    def round(self, what: str, *, settle: float = 0.0) -> None:
        """One fetch of `what` from every node at once (a slow or far node no longer holds
        the others back); a node that fails is noted, not fatal. Each node's notes are
        written together, in node order, once every node is done."""
        with self.lock:
            outcomes = self.group.map(lambda _entry, conn: self._fetch_one(conn, what, settle))
        unexpected: BaseException | None = None
        for outcome in outcomes:
            if isinstance(outcome.error, VmrunError):
                message = outcome.error.message
                self.note(f"{outcome.host}: fetching {what} failed this round: {message}")
            elif outcome.error is not None:
                unexpected = unexpected or outcome.error  # a bug: not hidden as a note
            elif outcome.value:
                self.note(f"{outcome.host}: {outcome.value}")
        if unexpected is not None:
            raise unexpected

    def _fetch_one(self, conn: Connection, what: str, settle: float) -> str:
        """Fetch `what` of the run from one node; what arrived, in words ("" for nothing)."""
        from vmrun.runs.outputs import locate_run, resolve_what
        from vmrun.transfer.download import download
        from vmrun.transfer.types import Options

        location = locate_run(conn, self.rid)
        host_dir = conn.label.replace("/", "_") if len(self.conns) > 1 else None
        specs = resolve_what(what, location, host_dir=host_dir)
        report = download(conn, specs, self.dest, Options(settle=settle))
        if not report.fetched:
            return ""
        names = ", ".join(report.fetched[:3]) + (" ..." if len(report.fetched) > 3 else "")
        return f"fetched {names} ({report.fetched_bytes} bytes)"

    def finish(self, *, results: bool) -> None:
        """Stop the rounds; with `results` (the run ended well) fetch everything it made."""
        self.stopped.set()
        self.thread.join(timeout=600)
        if results:
            self.round("results")
