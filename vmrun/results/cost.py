"""What a run cost: its nodes' prices (USD an hour each: a host's `price` in vmrun.toml,
which `vmrun up` records from the cloud's price list, or a cluster's per node) are written
into run.json as it starts, so a report later needs no price service; the time is the
run's own, and each recovery's is its downtime plus the epochs it did again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def prices(by_node: Mapping[str, Any]) -> dict[str, Any]:
    """run.json's `prices` (node -> USD an hour) and `price_per_hour` (their sum), where
    every node's price is known; nothing where one is not (a partial sum would mislead)."""
    known = {node: float(p) for node, p in by_node.items() if isinstance(p, (int, float))}
    if not by_node or len(known) != len(by_node):
        return {}
    return {"prices": known, "price_per_hour": round(sum(known.values()), 6)}


def alike(price: float | None, nodes: int) -> dict[str, Any]:
    """`prices` for `nodes` nodes of one price (a cluster's `price`, per node)."""
    return prices({f"node {i}": price for i in range(nodes)})


def dollars(seconds: float | None, per_hour: float | None) -> float | None:
    """USD for `seconds` at `per_hour` (None where either is unknown), to the cent."""
    if seconds is None or per_hour is None:
        return None
    return round(seconds / 3600 * per_hour, 2)


def recovery_seconds(recovery: Mapping[str, Any], epoch_s: float | None) -> float | None:
    """The time a recovery cost the run: its downtime and the epochs it did again."""
    down = recovery.get("downtime_s")
    redone = recovery.get("epochs_redone") or 0
    if down is None and not (redone and epoch_s):
        return None
    return float(down or 0) + (redone * epoch_s if epoch_s else 0.0)
