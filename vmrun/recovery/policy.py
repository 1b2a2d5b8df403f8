"""What the supervisor does when a run fails (`train --recover`), decided from facts alone so
each case can be driven in the quick tier: restart on the same nodes when every node still
answers (a crashed rank, or a node that went silent and answers again: a blip), replace
the nodes that are gone by spares when some are lost (or are about to be: a spot VM's
interruption notice, after the run saved its work), or give up, with one line saying why:
the recoveries are spent (`--max-recoveries`), the same failure came back without the run
getting further (a crash loop), no spare is left, or the master is lost and its snapshots
with it (no store)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_MAX_RECOVERIES = 5
LOOP = 3  # the same failure this many times in a row at the same epoch is a crash loop


@dataclass(frozen=True)
class Failure:
    """How one attempt ended, as the supervisor found it."""

    nodes: tuple[str, ...]  # the attempt's nodes, master first
    lost: tuple[str, ...] = ()  # of them, those that do not answer
    exit_code: int | None = None  # the run's own, where it ended by itself
    where: str = ""  # the failed node or rank, as the run's failure names it
    epoch: int | None = None  # the newest saved snapshot's epoch when it failed
    stopped: bool = False  # `vmrun stop` ended it: nothing to recover
    noticed: tuple[str, ...] = ()  # of them, those a cloud said will go (a spot notice)
    reached: int | None = None  # the newest epoch it completed (past `epoch`: redone)
    at: float | None = None  # when it failed (its end as a node recorded it, else when found)
    returned: tuple[str, ...] = ()  # of them, those found silent that answer again (a blip)
    running: bool = False  # it still runs on every node: only the follow's streams were lost

    @property
    def redone(self) -> int | None:
        """Epochs the next attempt does again: those after the newest snapshot."""
        if self.reached is None:
            return None
        return max(0, self.reached - (self.epoch or 0))

    @property
    def gone(self) -> tuple[str, ...]:
        """The nodes the next attempt must do without: lost, or about to be."""
        return (*self.lost, *(n for n in self.noticed if n not in self.lost))

    @property
    def signature(self) -> str:
        """What a crash loop repeats: the same way of failing."""
        if self.lost:
            return f"lost {','.join(sorted(self.lost))}"
        if self.noticed:
            return f"spot notice on {','.join(sorted(self.noticed))}"
        if self.returned:
            return f"{','.join(sorted(self.returned))} silent, then back"
        return f"exit {self.exit_code} {self.where}".strip()


@dataclass(frozen=True)
class Recovery:
    """What was decided: `restart` (the same nodes), `replace` (`swap`: lost node -> spare),
    or `give-up` (`why` says it)."""

    action: str
    why: str
    swap: dict[str, str] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()  # the next attempt's nodes, master first
    renew: tuple[str, ...] = ()  # of the swapped, those a new VM replaces (same name)

    @property
    def gives_up(self) -> bool:
        return self.action == "give-up"


def decide(
    failure: Failure,
    earlier: Sequence[Failure],
    spares: Sequence[str],
    *,
    max_recoveries: int = DEFAULT_MAX_RECOVERIES,
    has_store: bool = False,
    renewable: Sequence[str] = (),
) -> Recovery:
    """The next step after `failure`, the recoveries before it being `earlier` (oldest
    first) and `spares` the hosts still free to take a lost node's place; `renewable`: the
    nodes a new VM of the same spec may replace (a `vmrun up` cluster's), once the spares
    are spent."""
    if len(earlier) >= max_recoveries:
        return Recovery(
            "give-up", f"{len(earlier)} recoveries already, the most allowed (--max-recoveries)"
        )
    looped = [f for f in earlier[-(LOOP - 1) :] if f.signature == failure.signature]
    if len(looped) == LOOP - 1 and all(f.epoch == failure.epoch for f in looped):
        at = "" if failure.epoch is None else f" at epoch {failure.epoch}"
        return Recovery(
            "give-up",
            f"a crash loop: {failure.signature}{at}, {LOOP} times in a row without getting further",
        )
    gone = failure.gone
    if not gone and failure.returned:  # a blip: the node, its env and its files are back
        back = ", ".join(failure.returned)
        return Recovery(
            "restart",
            f"{back} stopped answering, then answered again: again on the same nodes",
            nodes=failure.nodes,
        )
    if not gone:
        return Recovery(
            "restart",
            f"{failure.signature or 'it failed'}: again on the same nodes",
            nodes=failure.nodes,
        )
    master, what = failure.nodes[0], failure.signature
    if master in gone and not has_store:
        return Recovery("give-up", f"{what}: the master's snapshots go with it (no --store)")
    free = [s for s in spares if s not in failure.nodes]
    swap = dict(zip(gone, free, strict=False))
    renew = tuple(n for n in gone if n not in swap and n in renewable)
    if len(swap) + len(renew) < len(gone):
        return Recovery("give-up", f"{what} and {len(free) or 'no'} spare(s) left")
    swap |= {n: n for n in renew}
    nodes = tuple(swap.get(n, n) for n in failure.nodes)
    said = ", ".join(
        f"{old} by a new VM" if old in renew else f"{old} by {new}" for old, new in swap.items()
    )
    return Recovery("replace", f"{what}: replaced {said}", swap, nodes, renew)
