"""What vmrun reads off UCloud's jobs and products: the SSH address a VM's job announces,
its state, and a product's price an hour.

UCloud gives a VM no address field: its provider posts a job update whose text says how to
log in (im2/pkg/integrations/k8s/shared/ssh.go: `SSH: Connected! Available at: ssh
ucloud@HOST -p PORT`; older: `SSH Access: ssh ucloud@HOST`). The newest such line counts:
a suspended VM's port is released and a new one announced when it runs again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# a job's states (shared/pkg/orchestrators/jobs.go); the last three are ends
IN_QUEUE, RUNNING, SUSPENDED = "IN_QUEUE", "RUNNING", "SUSPENDED"
ENDED = ("SUCCESS", "FAILURE", "EXPIRED")
_SSH = re.compile(
    r"\bssh\s+(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9.\-:\[\]]+)(?:\s+-p\s*(?P<port>\d+))?"
)
# accountingFrequency -> minutes per charged period (core2/pkg/orchestrator/job.go)
_PERIOD_MIN = {"PERIODIC_MINUTE": 1, "PERIODIC_HOUR": 60, "PERIODIC_DAY": 1440}


@dataclass(frozen=True)
class SshAt:
    user: str
    host: str
    port: int


def ssh_at(job: Mapping[str, Any]) -> SshAt | None:
    """The login the job's newest SSH update announces; None while there is none."""
    for update in reversed(list(job.get("updates") or [])):
        text = str((update or {}).get("status") or "")
        for line in reversed(text.splitlines()):
            if "ssh" not in line.lower():
                continue
            found = _SSH.search(line)
            if found:
                host = found.group("host").strip("[]")
                return SshAt(found.group("user") or "ucloud", host, int(found.group("port") or 22))
    return None


def state_of(job: Mapping[str, Any]) -> str:
    return str((job.get("status") or {}).get("state") or "")


def labels_of(job: Mapping[str, Any]) -> Mapping[str, str]:
    return (job.get("specification") or {}).get("labels") or {}


@dataclass(frozen=True)
class Price:
    """What a product costs an hour per VM, in its category's unit (DKK on UCloud)."""

    per_hour: float
    unit: str


def price_of(product: Mapping[str, Any]) -> Price | None:
    """A ProductV2's price an hour (`price` per accounting period, money in millionths);
    None for a product whose unit is not money (core-hours, GPU-hours) or a period vmrun
    does not know; 0 for a free one."""
    category = product.get("category") or {}
    unit = category.get("accountingUnit") or {}
    if category.get("freeToUse"):
        return Price(0.0, str(unit.get("name") or ""))
    minutes = _PERIOD_MIN.get(str(category.get("accountingFrequency") or ""))
    price = product.get("price")
    if minutes is None or not isinstance(price, (int, float)) or not unit.get("floatingPoint"):
        return None
    return Price(round(price / 1e6 * 60 / minutes, 6), str(unit.get("name") or ""))
