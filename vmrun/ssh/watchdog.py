"""A connection's liveness: OpenSSH's ServerAliveInterval/CountMax for a paramiko transport."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko


class Watchdog(threading.Thread):
    """Declares a connection lost when a keepalive probe goes unanswered too long.

    paramiko's own keepalive never waits for an answer, and TCP notices a silent peer
    only after many minutes; this is OpenSSH's ServerAliveInterval/CountMax. The reason is
    set before the transport is closed, so whoever sees the transport dead sees why.
    """

    def __init__(self, transport: paramiko.Transport, interval: float, count_max: int):
        super().__init__(daemon=True, name="vmrun-watchdog")
        self.transport = transport
        self.interval = interval
        self.dead_after = interval * count_max
        self.stopped = threading.Event()
        self.lost_reason: str | None = None

    def _probe(self, answered: threading.Event) -> None:
        try:
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:
            pass
        finally:
            answered.set()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            if not self.transport.is_active():
                return
            answered = threading.Event()
            threading.Thread(target=self._probe, args=(answered,), daemon=True).start()
            if not answered.wait(self.dead_after) and not self.stopped.is_set():
                self.lost_reason = f"the host stopped answering for {self.dead_after:g} s"
                self.transport.close()
                return
