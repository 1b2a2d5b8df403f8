"""Which hosts an operation works on: names as `-H` takes them (None: the project's hosts,
or VMRUN_HOSTS), or entries a caller has already chosen (the CLI, to label output first);
and `vmrun hosts --check`: whether each answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from vmrun.config import Settings
from vmrun.ssh.inventory import HostEntry

if TYPE_CHECKING:
    from vmrun.ssh.connection import Connection
    from vmrun.ssh.result import CommandResult

Hosts = Sequence[str] | Sequence[HostEntry] | None


def entries_for(hosts: Hosts, settings: Settings) -> list[HostEntry]:
    if hosts and all(isinstance(h, HostEntry) for h in hosts):
        return [h for h in hosts if isinstance(h, HostEntry)]
    from vmrun.ssh import inventory

    return inventory.select_hosts([h for h in hosts or () if isinstance(h, str)], settings)


def check(
    settings: Settings, hosts: Hosts = None, answered: Callable[[str, float], None] | None = None
) -> tuple[list[Any], int]:
    """Connect to each host and run `true` (given connect_timeout to end, as the check's
    own deadline: a host that lets us in and then hangs fails too): each host's outcome
    (its time, or the error it failed with), in host order, and the worst exit code.
    `answered(host, seconds)` hears each host that answered, as it does."""
    import time

    from vmrun.ssh.group import Group, worst_exit_code

    def one(entry: HostEntry, conn: Connection) -> CommandResult:
        began = time.monotonic()
        result = conn.run(["true"], check=True, timeout=settings.connect_timeout)
        if answered is not None:
            answered(entry.label, time.monotonic() - began)
        return result

    with Group(entries_for(hosts, settings), settings) as group:
        outcomes = group.map(one)
    return outcomes, worst_exit_code(outcomes)
