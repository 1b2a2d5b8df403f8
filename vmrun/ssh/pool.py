"""Connections held open across commands: while a pool is held, every connection to a host
is the pool's one, so a long-lived caller (`vmrun dashboard`) running many operations at
once reaches each host over a single SSH connection, as one CLI command does.

A held connection ignores `close()` from the work that borrowed it (a `Group` leaving its
block); the pool closes it when it is let go. One that was lost is replaced on the next ask.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.ssh.connection import Connection
from vmrun.ssh.hosts import HostSpec

if TYPE_CHECKING:
    import paramiko


class Held(Connection):
    """A pool's connection: borrowers' `close()` leaves it open for the others. Once let
    go it never dials again: a follow that saw another node's connection close must find
    this one gone too (not dial anew and take it for a node that answers)."""

    released = False

    @property
    def transport(self) -> paramiko.Transport:
        if self.released:
            raise self._lost_error("after vmrun let its connections go")
        return super().transport

    def close(self) -> None:
        """Left open for the others (the pool closes it, `release`); one whose link was
        lost is reset, so that its next use dials anew (a watch retrying on it)."""
        if self.broken:
            super().close()

    def release(self) -> None:
        super().close()


class Pool:
    """One connection per host (its spec and label), made on first ask."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[tuple[HostSpec, str], Held] = {}

    def connection(self, spec: HostSpec, settings: Settings, label: str) -> Held:
        with self._lock:
            conn = self._conns.get((spec, label))
            if conn is None or conn.broken:
                conn = self._conns[(spec, label)] = Held(spec, settings, label=label)
            return conn

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:  # every one refuses work before any closes
            conn.released = True
        for conn in conns:
            conn.release()


_lock = threading.Lock()
_held: Pool | None = None


@contextmanager
def holding() -> Iterator[Pool]:
    """Every connection made in this process while the block runs is the pool's (one per
    host); they are closed when it ends."""
    global _held
    with _lock:
        if _held is not None:
            raise RuntimeError("a connection pool is held already")
        pool = _held = Pool()
    try:
        yield pool
    finally:
        with _lock:
            _held = None
        pool.close()


def connection(spec: HostSpec, settings: Settings, label: str) -> Connection:
    """The held pool's connection to the host, else a new one of the caller's own."""
    with _lock:
        pool = _held
    if pool is None:
        return Connection(spec, settings, label=label)
    return pool.connection(spec, settings, label)
