"""One folder from several nodes of a run: which node sends each file.

Each node writes its own files (a sharded checkpoint's shards: each rank's on its node, the
metadata on the master), so a run's outputs are the union of every node's. A path that one
node holds comes from it; one that several hold with the same bytes comes once, from the
first of them in the run's node order (the master first); the same path with different
bytes is a conflict: the first one's is kept under the name and the others' are left on
their nodes, each said, never written over it. Sizes decide where they differ; where they
agree the nodes' SHA-256 do (asked only for those paths: `in_doubt`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vmrun.transfer.download import Listed


@dataclass(frozen=True)
class Conflict:
    """A path two or more nodes hold with different bytes: `kept` is the node whose copy
    came (or stays) under the name, `left` those whose copies stayed on them."""

    path: str
    kept: str
    left: tuple[str, ...]

    def line(self) -> str:
        others = ", ".join(self.left)
        return (
            f"{self.path}: {others} {'holds' if len(self.left) == 1 else 'hold'} other bytes"
            f" than {self.kept}; {self.kept}'s is fetched, {others}'s left there"
        )


@dataclass(frozen=True)
class Merge:
    """Which node sends each path, and the paths whose copies differ."""

    sources: Mapping[str, str]  # local path -> the node it comes from
    conflicts: tuple[Conflict, ...] = ()

    def share(self, node: str) -> frozenset[str]:
        """The paths this node sends."""
        return frozenset(p for p, n in self.sources.items() if n == node)


def in_doubt(order: Sequence[str], held: Mapping[str, Mapping[str, Listed]]) -> dict[str, set[str]]:
    """Per node, the paths whose bytes must be compared by checksum: files held by several
    nodes at the same size."""
    sizes: dict[str, dict[str, int]] = {}
    for node in order:
        for path, item in held.get(node, {}).items():
            if item.size >= 0:
                sizes.setdefault(path, {})[node] = item.size
    doubt: dict[str, set[str]] = {}
    for path, by_node in sizes.items():
        for node, size in by_node.items():
            if sum(s == size for s in by_node.values()) > 1:
                doubt.setdefault(node, set()).add(path)
    return doubt


def merge(
    order: Sequence[str],
    held: Mapping[str, Mapping[str, Listed]],
    digests: Mapping[str, Mapping[str, str]],
) -> Merge:
    """Who sends what (`order`: the run's nodes, the master first; `held`: what each node
    would send; `digests`: the SHA-256 `in_doubt` asked each node for). A checksum that did
    not come counts as different bytes: nothing is overwritten on a guess."""
    sources: dict[str, str] = {}
    conflicts: list[Conflict] = []
    paths = dict.fromkeys(p for node in order for p in held.get(node, {}))
    for path in paths:
        holders = [n for n in order if path in held.get(n, {})]
        first = holders[0]
        sources[path] = first
        mine = _identity(held[first][path], digests.get(first, {}).get(path))
        left = tuple(
            n
            for n in holders[1:]
            if mine is None or _identity(held[n][path], digests.get(n, {}).get(path)) != mine
        )
        if left:
            conflicts.append(Conflict(path, first, left))
    return Merge(sources, tuple(conflicts))


def _identity(item: Listed, digest: str | None) -> tuple[int, str] | None:
    """What two copies must share to be the same bytes (None: not known)."""
    if item.size < 0:
        return (-1, item.link)
    return None if digest is None else (item.size, digest)
