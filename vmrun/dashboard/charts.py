"""What a run page's charts get beyond its metrics: each rank's step time by epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def rank_series_json(path: Path) -> dict[str, Any]:
    """Each rank's step time by epoch (`rank_series`: rank -> [[epoch, s], ...]) and each
    rank's node (`rank_node`), from the run's metrics here; null where not recorded."""
    from vmrun.results.history import rank_series

    series, nodes = rank_series(path)
    return {
        "rank_series": {str(r): [list(p) for p in s] for r, s in series.items()} or None,
        "rank_node": list(nodes) if nodes else None,
    }
