"""Which hosts an operation works on: names as `-H` takes them (None: the project's hosts,
or VMRUN_HOSTS), or entries a caller has already chosen (the CLI, to label output first)."""

from __future__ import annotations

from collections.abc import Sequence

from vmrun.config import Settings
from vmrun.ssh.inventory import HostEntry

Hosts = Sequence[str] | Sequence[HostEntry] | None


def entries_for(hosts: Hosts, settings: Settings) -> list[HostEntry]:
    if hosts and all(isinstance(h, HostEntry) for h in hosts):
        return [h for h in hosts if isinstance(h, HostEntry)]
    from vmrun.ssh import inventory

    return inventory.select_hosts([h for h in hosts or () if isinstance(h, str)], settings)
