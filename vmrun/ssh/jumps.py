"""Jump hosts, shared: every host reached through one jump host goes over one connection to it.

Dialing the jump host afresh for each host behind it made 32 hosts behind a bastion 32
handshakes at once on the bastion's sshd, past OpenSSH's default MaxStartups (10): sshd
dropped the rest and they looked dead. Now the first host through a jump host opens the
connection and the others open channels on it (direct-tcpip, which neither MaxStartups nor
MaxSessions counts); the handshakes with the hosts behind it take turns, `jump_handshakes`
at a time, so the jump host's sshd and network are never flooded either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Protocol


class Shareable(Protocol):
    """What a jump host's connection must offer (vmrun.ssh.connection.Connection does)."""

    @property
    def broken(self) -> bool: ...

    def close(self) -> None: ...


class _Jump:
    def __init__(self, conn: Shareable, handshakes: int):
        self.conn = conn
        self.users = 0
        self.turns = threading.BoundedSemaphore(handshakes)


_lock = threading.Lock()
_open: dict[Hashable, _Jump] = {}


class Lease:
    """One host's hold on a shared jump connection. `close` lets go (once; the connection
    closes with its last holder), so a dial that fails or is aborted never closes a
    connection other hosts still use."""

    def __init__(self, key: Hashable, jump: _Jump):
        self._key = key
        self._jump = jump
        self._held = True
        self._turn = False
        self._turn_lock = threading.Lock()  # end_turn may come from an aborting thread too

    @property
    def conn(self) -> Shareable:
        return self._jump.conn

    def take_turn(self, given_up: Callable[[], bool]) -> bool:
        """Wait for a handshake turn through this jump host; False if `given_up` first."""
        while not self._jump.turns.acquire(timeout=0.05):
            if given_up():
                return False
        with self._turn_lock:
            self._turn = True
        return True

    def end_turn(self) -> None:
        with self._turn_lock:
            turn, self._turn = self._turn, False
        if turn:
            self._jump.turns.release()

    def close(self) -> None:
        self.end_turn()
        with _lock:
            if not self._held:
                return
            self._held = False
            self._jump.users -= 1
            last = self._jump.users == 0
            if last and _open.get(self._key) is self._jump:
                del _open[self._key]
        if last:
            self._jump.conn.close()


def lease(key: Hashable, handshakes: int, make: Callable[[], Shareable]) -> Lease:
    """A hold on the jump connection `key` names, opened by `make` if there is none (or the
    one there is has broken: its holders keep it until they let go)."""
    with _lock:
        jump = _open.get(key)
        if jump is None or jump.conn.broken:
            jump = _open[key] = _Jump(make(), handshakes)
        jump.users += 1
        return Lease(key, jump)


def open_count() -> int:
    """Jump connections held now (for tests: none may be left once every host is closed)."""
    with _lock:
        return len(_open)
