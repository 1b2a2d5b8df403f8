"""The connection pool `vmrun dashboard` holds: while it is held, every group of hosts gets
the one connection per host, a group's close leaves it open for the others, and once the
pool lets go no connection of it dials again (a log follow must see every node gone)."""

from __future__ import annotations

import pytest

from vmrun.config import load_settings
from vmrun.errors import ConnectionLostError
from vmrun.ssh import pool
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.inventory import HostEntry

ENTRIES = [HostEntry(HostSpec("a.example")), HostEntry(HostSpec("b.example"))]


def test_without_a_pool_each_group_has_its_own_connections() -> None:
    settings = load_settings()
    first, second = Group(ENTRIES, settings), Group(ENTRIES, settings)
    assert first.connections["a.example"] is not second.connections["a.example"]
    assert not isinstance(first.connections["a.example"], pool.Held)


def test_a_held_pool_gives_every_group_one_connection_per_host() -> None:
    settings = load_settings()
    with pool.holding() as held:
        with Group(ENTRIES, settings) as first:
            conns = dict(first.connections)
        second = Group(ENTRIES, settings)
        assert second.connections == conns  # the same objects, left open by the first
        assert len(held) == 2
        assert isinstance(pool.connection(HostSpec("a.example"), settings, "a.example"), Connection)
        with pytest.raises(RuntimeError, match="held already"), pool.holding():
            pass
    released = conns["a.example"]
    assert isinstance(released, pool.Held) and released.released
    with pytest.raises(ConnectionLostError):
        released.transport  # noqa: B018  (it must not dial anew)
    assert not isinstance(Group(ENTRIES, settings).connections["a.example"], pool.Held)
