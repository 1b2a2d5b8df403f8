"""The supervisor's own check of a run's nodes, independent of the log streams it follows.

A VM that is lost sends no reset: its peers' sockets and the supervisor's log stream just go
quiet, and a stream that was never opened (a node that did not answer when the follow began)
would notice nothing at all. So every node is asked a trivial command every `period` seconds
on a connection of its own; one that has not answered for `lost_after` seconds (the
`keepalive_interval` x `keepalive_count_max` rule every connection keeps) is declared lost
through `on_lost`, once. The supervisor closes that node's log stream with the reason, and
the failure rule runs as for any loss. The nodes an earlier recovery replaced (`retired`)
are asked too, until one answers again: `on_back` is told, once (the supervisor stops the
replaced attempt that may still run there)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType

Ask = Callable[[str, float], None]  # ask(node, timeout): returns when it answered, else raises


class Heartbeat:
    """Threads asking each node in turn (`ask`), until the block ends or the node is lost
    (a retired node: until it answers). `lost`: the nodes declared lost, with how long they
    were silent."""

    def __init__(
        self,
        nodes: Sequence[str],
        ask: Ask,
        on_lost: Callable[[str, str], None],
        *,
        period: float,
        lost_after: float,
        forget: Callable[[str], None] = lambda node: None,
        retired: Sequence[str] = (),
        on_back: Callable[[str], None] = lambda node: None,
    ):
        self.nodes = list(nodes)
        self.ask, self.on_lost, self.forget, self.on_back = ask, on_lost, forget, on_back
        self.period, self.lost_after = period, lost_after
        self.lost: dict[str, float] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._beat, args=(n,), daemon=True, name=f"vmrun-beat-{n}")
            for n in self.nodes
        ] + [
            threading.Thread(target=self._back, args=(n,), daemon=True, name=f"vmrun-back-{n}")
            for n in retired
            if n not in self.nodes
        ]

    def __enter__(self) -> Heartbeat:
        for t in self._threads:
            t.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        deadline = time.monotonic() + 1.0  # one second for them all: they are daemons
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _beat(self, node: str) -> None:
        answered = time.monotonic()
        while not self._stop.wait(self.period):
            left = answered + self.lost_after - time.monotonic()
            try:
                self.ask(node, max(1.0, left))
                answered = time.monotonic()
                continue
            except Exception:  # any failure to answer is silence
                self.forget(node)  # its connection is asked anew next time
            silent = time.monotonic() - answered
            if silent >= self.lost_after and not self._stop.is_set():
                self.lost[node] = silent
                self.on_lost(node, f"it did not answer the supervisor for {silent:.0f} s")
                return

    def _back(self, node: str) -> None:
        while not self._stop.wait(self.period):
            try:
                self.ask(node, self.lost_after)
            except Exception:  # still gone
                self.forget(node)
                continue
            if not self._stop.is_set():
                self.on_back(node)
            return
