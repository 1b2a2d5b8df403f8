"""Slow ranks, from the step times the template trainer records per rank (metrics.jsonl's
`rank_step_s`, with `rank_node`): a rank is slow when its step takes SLOW_RATIO times the
median of the others' and at least SLOW_GAP_S more. The trainer names them in the log with
the same rule (vmrun.trainer.template.slow_ranks; a test keeps the two equal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

SLOW_RATIO = 1.2
SLOW_GAP_S = 0.005


@dataclass(frozen=True)
class Slow:
    rank: int
    seconds: float  # its step time
    typical: float  # the median of the others'
    node: int | None = None

    @property
    def ratio(self) -> float:
        return self.seconds / self.typical

    def as_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "step_s": self.seconds,
            "typical_s": self.typical,
            "ratio": round(self.ratio, 2),
        }

    def describe(self) -> str:
        where = f" (node {self.node})" if self.node is not None else ""
        return f"rank {self.rank}{where} slow: {self.ratio:.1f}x"


def slow_ranks(step_s: Sequence[float], nodes: Sequence[int] | None = None) -> list[Slow]:
    found = []
    for rank, mine in enumerate(step_s):
        others = [t for r, t in enumerate(step_s) if r != rank]
        if not others:
            continue
        typical = median(others)
        if typical > 0 and mine >= SLOW_RATIO * typical and mine - typical >= SLOW_GAP_S:
            node = nodes[rank] if nodes is not None and rank < len(nodes) else None
            found.append(Slow(rank, mine, typical, node))
    return found


def from_metrics(line: Mapping[str, Any]) -> list[Slow]:
    """The slow ranks of one metrics.jsonl line (none where it has no per-rank times)."""
    times, nodes = line.get("rank_step_s"), line.get("rank_node")
    if not isinstance(times, list) or not all(isinstance(t, (int, float)) for t in times):
        return []
    if not (isinstance(nodes, list) and len(nodes) == len(times)):
        nodes = None
    return slow_ranks([float(t) for t in times], nodes)


def summary(slow: Sequence[Slow]) -> str:
    """`rank 3 (node 1) slow: 2.1x`, or a node's ranks together; "" when none is slow."""
    return ", ".join(s.describe() for s in slow)
