"""Which hosts an operation works on: names as `-H` takes them (None: the project's hosts,
or VMRUN_HOSTS), or entries a caller has already chosen (the CLI, to label output first);
and `vmrun hosts --check`: whether each answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vmrun.config import Settings
from vmrun.ssh.inventory import HostEntry

Hosts = Sequence[str] | Sequence[HostEntry] | None


def entries_for(hosts: Hosts, settings: Settings) -> list[HostEntry]:
    if hosts and all(isinstance(h, HostEntry) for h in hosts):
        return [h for h in hosts if isinstance(h, HostEntry)]
    from vmrun.ssh import inventory

    return inventory.select_hosts([h for h in hosts or () if isinstance(h, str)], settings)


def check(settings: Settings, hosts: Hosts = None) -> tuple[list[Any], int]:
    """Connect to each host and run `true`: each host's outcome (its time, or the error it
    failed with), in host order, and the worst exit code."""
    from vmrun.ssh.group import Group, worst_exit_code

    with Group(entries_for(hosts, settings), settings) as group:
        outcomes = group.map(lambda e, c: c.run(["true"], check=True))
    return outcomes, worst_exit_code(outcomes)
