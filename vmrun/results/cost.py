"""What a run cost: its nodes' prices (an amount an hour each: a host's `price` in
vmrun.toml, which `vmrun up` records from the cloud's price list, or a cluster's per node;
USD unless `currency` names another) are written into run.json as it starts, so a report
later needs no price service; the time is the run's own, and each recovery's is its
downtime plus the epochs it did again. Amounts in different currencies are never added:
there is no rate to trust offline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

USD = "USD"


def prices(
    by_node: Mapping[str, Any], currencies: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """run.json's `prices` (node -> an amount an hour), `price_per_hour` (their sum) and
    `currency`, where every node's price is known, in one currency; nothing where one is
    not (a partial sum, or one of mixed currencies, would mislead)."""
    known = {node: float(p) for node, p in by_node.items() if isinstance(p, (int, float))}
    if not by_node or len(known) != len(by_node):
        return {}
    used = {str((currencies or {}).get(node) or USD) for node in by_node}
    if len(used) != 1:
        return {}
    return {
        "prices": known,
        "price_per_hour": round(sum(known.values()), 6),
        "currency": used.pop(),
    }


def alike(price: float | None, nodes: int, currency: str | None = None) -> dict[str, Any]:
    """`prices` for `nodes` nodes of one price (a cluster's `price`, per node)."""
    names = [f"node {i}" for i in range(nodes)]
    return prices(dict.fromkeys(names, price), dict.fromkeys(names, currency))


def charge(seconds: float | None, per_hour: float | None) -> float | None:
    """What `seconds` cost at `per_hour` (None where either is unknown), to the cent."""
    if seconds is None or per_hour is None:
        return None
    return round(seconds / 3600 * per_hour, 2)


def money(amount: float | None, currency: str | None = USD) -> str:
    """`$2.00`, `12.50 DKK`; `-` where unknown."""
    if amount is None:
        return "-"
    if (currency or USD) == USD:
        return f"${amount:,.2f}"
    return f"{amount:,.2f} {currency}"


def price_text(amount: float, currency: str | None = USD) -> str:
    """A price to four digits: `$0.526`, `2.1 DKK`."""
    return f"${amount:.4g}" if (currency or USD) == USD else f"{amount:.4g} {currency}"


def budget_seconds(max_cost: float, per_hour: float, spent_s: float = 0.0) -> float:
    """How much longer a run at `per_hour` may go before it has cost `max_cost`, having run
    `spent_s` already (its earlier attempts)."""
    return max_cost / per_hour * 3600 - spent_s if per_hour > 0 else float("inf")


def recovery_seconds(recovery: Mapping[str, Any], epoch_s: float | None) -> float | None:
    """The time a recovery cost the run: its downtime and the epochs it did again."""
    down = recovery.get("downtime_s")
    redone = recovery.get("epochs_redone") or 0
    if down is None and not (redone and epoch_s):
        return None
    return float(down or 0) + (redone * epoch_s if epoch_s else 0.0)
