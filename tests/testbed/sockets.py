"""TCP from the test process itself: reachability checks and free loopback ports."""

from __future__ import annotations

import socket


def can_connect(addr: str, port: int = 22, timeout: float = 1.0) -> bool:
    """TCP connect from the calling process's namespace (the root namespace)."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
