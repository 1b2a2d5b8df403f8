"""`vmrun train --fetch-every S`: pull a run's new checkpoints while it runs, so the newest one
is here even if the VM is lost, and its results once it has finished.

A thread beside the log follower, on the same connections (each round is a few channels,
one listing round trip when nothing changed): every S seconds the `checkpoints` of the run
on each of its nodes, leaving files modified in the last SETTLE seconds for the next
round (they may still be written). Into `results/<run-id>/` (a folder per node when
several), as `vmrun fetch` would put them. The nodes are fetched from concurrently
(vmrun.ssh.group), what each node's round says kept together. Detaching (Ctrl-C) abandons a round
under way at once: its streams are killed, and a file cut short stays under its temporary
name, to resume next time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from vmrun.errors import RemoteError, VmrunError
from vmrun.reporting import Reporter
from vmrun.runs.outputs import RunLocation
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.transfer.types import Cancel

ABANDON_S = 2.0  # how long an abandoned round may take to notice (then left to the daemon)
SETTLE = 0.5  # shorter than `fetch --watch`'s 2 s: snapshots are rewritten every few seconds,
# and a file that changes while it travels fails its checksum and comes next round anyway


class Fetcher:
    """Rounds of fetching over the caller's connections (its Group: no new connection); where
    the run's files are on each node is looked up once, in the first round."""

    def __init__(
        self,
        group: Group,
        nodes: Sequence[str],
        rid: str,
        dest: Path,
        every: float,
        out: Reporter,
    ):
        self.group = group
        self.nodes = set(nodes)
        self.rid = rid
        self.dest = dest
        self.every = every
        self.out = out
        self.stopped = threading.Event()
        self.cancel = Cancel()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="vmrun-fetcher")
        self.lock = threading.Lock()
        self.locations: dict[str, RunLocation] = {}

    def start(self) -> Fetcher:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            self.round("checkpoints", settle=SETTLE)

    def round(self, what: str, *, settle: float = 0.0) -> list[str]:
        """One fetch of `what` from every node at once (a slow or far node no longer holds
        the others back); a node that fails is said, not fatal, and named in the list
        returned. What each node's round says is written together, in node order, once every node
        is done."""
        with self.lock:
            outcomes = self.group.map(
                lambda _entry, conn: self._fetch_one(conn, what, settle), only=self.nodes
            )
        unexpected: BaseException | None = None
        failed = [o.host for o in outcomes if o.error is not None]
        if self.cancel.event.is_set():
            return failed  # abandoned: vmrun is leaving, and says nothing more of it
        for outcome in outcomes:
            if isinstance(outcome.error, VmrunError):
                message = outcome.error.message
                self.out.info(f"{outcome.host}: fetching {what} failed this round: {message}")
            elif outcome.error is not None:
                unexpected = unexpected or outcome.error  # a bug: not hidden as a line
            elif outcome.value:
                self.out.info(f"{outcome.host}: {outcome.value}")
        if unexpected is not None:
            raise unexpected
        return failed

    def _fetch_one(self, conn: Connection, what: str, settle: float) -> str:
        """Fetch `what` of the run from one node; what arrived, in words ("" for nothing)."""
        from vmrun.runs.outputs import locate_run, resolve_what
        from vmrun.transfer.download import download
        from vmrun.transfer.types import Options

        location = self.locations.get(conn.label)
        if location is None:  # once per node: the run's folders do not move while it runs
            location = self.locations[conn.label] = locate_run(conn, self.rid)
        host_dir = conn.label.replace("/", "_") if len(self.nodes) > 1 else None
        specs = resolve_what(what, location, host_dir=host_dir)
        report = download(conn, specs, self.dest, Options(settle=settle, cancel=self.cancel))
        if report.failed:  # the round failed on this node: said, and named by `round`
            name, why = next(iter(report.failed.items()))
            more = f" (and {len(report.failed) - 1} more)" if len(report.failed) > 1 else ""
            raise RemoteError(
                f"{name} did not arrive: {why}{more}", host=conn.label, code="transfer-failed"
            )
        if not report.fetched:
            return ""
        names = ", ".join(report.fetched[:3]) + (" ..." if len(report.fetched) > 3 else "")
        return f"fetched {names} ({report.fetched_bytes} bytes)"

    def finish(self, *, results: bool) -> list[str]:
        """Stop the rounds; with `results` (the run ended) fetch everything it made, and
        return the nodes that final fetch failed on."""
        self.stopped.set()
        self.thread.join(timeout=600)
        return self.round("results") if results else []

    def abandon(self) -> None:
        """Stop at once (detaching): a round under way is cut short, not waited for. Its
        streams are killed; a round trip stuck on a silent link ends when its connection is
        closed (vmrun is leaving: the caller would close it next)."""
        self.stopped.set()
        self.cancel.set()
        self.thread.join(timeout=0.2)
        if self.thread.is_alive():
            for node in self.nodes:
                self.group.connections[node].close()
            self.thread.join(timeout=ABANDON_S)
