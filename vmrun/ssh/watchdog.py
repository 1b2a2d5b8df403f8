"""A connection's liveness: OpenSSH's ServerAliveInterval/CountMax for a paramiko transport."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko


def answered(transport: paramiko.Transport, within: float) -> bool:
    """One keepalive (`keepalive@openssh.com`, which sshd answers itself, starting no
    process) answered within `within` seconds; paramiko's own request would wait forever."""
    done = threading.Event()

    def probe() -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:  # a closed transport: the caller looks at it
            pass
        finally:
            done.set()

    threading.Thread(target=probe, daemon=True, name="vmrun-keepalive").start()
    return done.wait(within)


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

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            if not self.transport.is_active():
                return
            if not answered(self.transport, self.dead_after) and not self.stopped.is_set():
                self.lost_reason = f"the host stopped answering for {self.dead_after:g} s"
                self.transport.close()
                return
