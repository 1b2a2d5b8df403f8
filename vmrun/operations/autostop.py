"""The autostop watchdog on a set of hosts: install it (every host checked first, so that a
host that cannot power itself off leaves all untouched), read what each one is doing, remove
it. Each host's result, or its error, comes back as a value; nothing is printed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from vmrun.config import Settings
from vmrun.errors import UsageError
from vmrun.operations.hostlist import Hosts, entries_for
from vmrun.ssh.group import Outcome, worst_exit_code

if TYPE_CHECKING:
    from vmrun.autostop.settings import Autostop
    from vmrun.autostop.status import AutostopStatus
    from vmrun.autostop.watchdog import Cancelled, Installed

T = TypeVar("T")


@dataclass(frozen=True)
class PerHost(Generic[T]):
    """Each host's outcome (its value, or the error it failed with), in host order."""

    outcomes: list[Outcome[T]]

    @property
    def exit_code(self) -> int:
        """0 when every host answered; else the worst host's code (12: unreachable)."""
        return worst_exit_code(self.outcomes)


@dataclass(frozen=True)
class Applied:
    """What `install` did. `off`: the hosts autostop is off for (left as they are);
    `configs`: the watchdog settings each other host got; `checked`: every host's check;
    `outcomes`: each install, empty when a check failed (then no host was touched)."""

    off: list[str] = field(default_factory=list)
    configs: dict[str, Autostop] = field(default_factory=dict)
    checked: list[Outcome[str]] = field(default_factory=list)
    outcomes: list[Outcome[Installed]] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        """A host failed its check, so the watchdog was installed on none."""
        return not all(o.ok for o in self.checked)

    @property
    def exit_code(self) -> int:
        return worst_exit_code(self.checked if self.refused else self.outcomes)


def install(settings: Settings, hosts: Hosts = None, *, required: bool) -> Applied:
    """Install (or update) the watchdog on `hosts` (names, or entries already chosen; None:
    the project's) where autostop is on. `required`: a host with no period set raises
    UsageError (else it is left out, as `vmrun setup` does)."""
    from vmrun.autostop import watchdog
    from vmrun.autostop.settings import for_host
    from vmrun.ssh.group import Group

    entries = entries_for(hosts, settings)
    configs = {e.label: for_host(settings, e) for e in entries}
    unset = settings.sources["autostop"] == "default"
    own = ("autostop", "autostop_budget")  # a budget alone (`up --max-cost`) needs no period
    missing = [e.label for e in entries if unset and not any(k in e.vars for k in own)]
    if required and missing:
        raise UsageError(
            f"no autostop period for {', '.join(missing)}",
            hint='give one (`vmrun autostop 30m`) or set autostop = "30m" in vmrun.toml',
        )
    off = [label for label, cfg in configs.items() if cfg is None and label not in missing]
    plan = {label: cfg for label, cfg in configs.items() if cfg is not None}
    if not plan:
        return Applied(off)
    with Group([e for e in entries if e.label in plan], settings) as group:
        checked = group.map(lambda e, conn: watchdog.check(conn, plan[e.label]))
        if not all(o.ok for o in checked):
            return Applied(off, plan, checked)
        outcomes = group.map(lambda e, conn: watchdog.install(conn, plan[e.label]))
    return Applied(off, plan, checked, outcomes)


def status(settings: Settings, hosts: Hosts = None) -> PerHost[AutostopStatus]:
    """Each host's watchdog: its period, how long idle, what keeps it awake."""
    from vmrun.autostop.watchdog import read_status
    from vmrun.ssh.group import Group

    with Group(entries_for(hosts, settings), settings) as group:
        return PerHost(group.map(lambda e, conn: read_status(conn)))


def cancel(settings: Settings, hosts: Hosts = None) -> PerHost[Cancelled]:
    """Remove the watchdog completely (process, boot entry, files) from each host."""
    from vmrun.autostop import watchdog
    from vmrun.ssh.group import Group

    with Group(entries_for(hosts, settings), settings) as group:
        return PerHost(group.map(lambda e, conn: watchdog.cancel(conn)))
