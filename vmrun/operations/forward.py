"""A port of a host (or of a cluster's compute node, through the login node) on this
machine's 127.0.0.1, over vmrun's own SSH connection (vmrun.ssh.forward): nothing is opened
on the host's firewall."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.errors import UsageError
from vmrun.reporting import QUIET, Reporter

if TYPE_CHECKING:
    from vmrun.ssh.forward import Forward
    from vmrun.ssh.inventory import HostEntry


@contextmanager
def forwarding(
    settings: Settings,
    port: int,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    node: str | None = None,
    local_port: int | None = None,
    exact: bool = False,
    out: Reporter = QUIET,
) -> Iterator[Forward]:
    """`port` of the one host (or of `node` as the host or login node reaches it) at
    127.0.0.1:`local_port` here (default: `port`; the next free one if it is taken, unless
    `exact`), started; stopped when the block ends. `out` hears of connections the
    destination refuses (nothing listens there yet)."""
    from vmrun.ssh.connection import Connection
    from vmrun.ssh.forward import Forward, bind_free

    entry = one_host(settings, hosts, cluster)
    wanted = port if local_port is None else local_port
    if exact:  # the port asked for, or one line before any connecting
        bind_free(wanted, search=1).close()
    with Connection(entry.spec, settings, label=entry.label) as conn:
        fwd = Forward(conn, node or "127.0.0.1", port, local_port=wanted, exact=exact)
        fwd.start(out)
        try:
            yield fwd
        finally:
            fwd.stop()


def one_host(settings: Settings, hosts: list[str] | None, cluster: str | None) -> HostEntry:
    """The one place to forward through: the cluster's login node, or exactly one host."""
    from vmrun.backends.select import Target, door_entries

    entries = door_entries(Target.of(hosts=hosts, cluster=cluster), settings)
    if len(entries) != 1:
        names = ", ".join(e.label for e in entries)
        raise UsageError(
            f"forward goes through one host; {len(entries)} are selected ({names}):"
            " name one with -H"
        )
    return entries[0]
