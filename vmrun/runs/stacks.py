"""Every rank's Python stack, read on its host (hostside/stacks.py: py-spy's JSON), and
where each rank is: ranks in the same place print once, so a hang's odd rank stands out
("ranks 0-2: all_reduce at train.py:88; rank 3: in load at data.py:41").

A rank's place is its main thread's innermost frame in the user's own code (not the
standard library's or an installed package's), with the call it is in there: the
innermost frame inside that call that is not a wrapper (torch's c10d logger wraps each
collective), so `dist.all_reduce(t)` on line 88 reads `all_reduce at train.py:88`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# frames that only pass a call through: the callee named is the next one in
_WRAPPERS = frozenset(
    {
        "wrapper",
        "inner",
        "_fn",
        "decorate_context",
        "__call__",
        "_call_impl",
        "_wrapped_call_impl",
        "wrapped",
        "_wrap",
    }
)
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
# torch.distributed's calls a rank waits in for the others
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "gather",
        "scatter",
        "send",
        "recv",
    }
)


@dataclass(frozen=True)
class Frame:
    name: str
    file: str  # py-spy's short name: the path within its package, or the script's name
    path: str
    line: int

    @property
    def own(self) -> bool:
        """The user's code, not Python's or a package's."""
        return not any(part in self.path for part in _LIBRARY) and not self.path.startswith("<")

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class RankStack:
    """One rank's stacks (its threads, each innermost frame first), or why there are none."""

    rank: int
    node: str
    pid: int = 0
    threads: tuple[tuple[str, tuple[Frame, ...]], ...] = ()  # (thread name, frames)
    error: str = ""

    @property
    def main(self) -> tuple[Frame, ...]:
        """The main thread's frames (else the first thread's)."""
        for name, frames in self.threads:
            if name == "MainThread":
                return frames
        return self.threads[0][1] if self.threads else ()

    def _mine_and_callee(self) -> tuple[Frame | None, Frame | None]:
        frames = self.main
        mine = next((i for i, f in enumerate(frames) if f.own), None)
        if mine is None:
            return None, None
        inner = reversed(frames[:mine])
        return frames[mine], next((f for f in inner if f.short_name not in _WRAPPERS), None)

    @property
    def call(self) -> str:
        """The call the rank is in from its own code (`all_reduce`), "" if none."""
        _, callee = self._mine_and_callee()
        return callee.short_name if callee is not None and not self.error else ""

    @property
    def place(self) -> str:
        """Where the rank is, as printed."""
        if self.error:
            return f"no stack: {self.error}"
        frames = self.main
        if not frames:
            return "no Python frames"
        at, callee = self._mine_and_callee()
        if at is None:
            top = frames[0]
            return f"in {top.short_name} at {top.file}:{top.line}"
        if callee is None:
            return f"in {at.short_name} at {at.file}:{at.line}"
        return f"{callee.short_name} at {at.file}:{at.line}"


def parse_line(line: str, node: str | None) -> RankStack | None:
    """One line of hostside/stacks.py's output (None: not a rank's); `node` None: the host
    name the line carries (a cluster's nodes, all reached through its login node)."""
    try:
        said = json.loads(line)
    except ValueError:
        return None
    if not isinstance(said, dict) or "rank" not in said:
        return None
    threads = []
    for thread in said.get("threads") or ():
        frames = tuple(
            Frame(
                str(f.get("name") or "?"),
                str(f.get("short_filename") or f.get("filename")),
                str(f.get("filename") or ""),
                int(f.get("line") or 0),
            )
            for f in thread.get("frames") or ()
        )
        threads.append((str(thread.get("thread_name") or thread.get("thread_id")), frames))
    where = node if node is not None else str(said.get("host") or "?")
    return RankStack(
        int(said["rank"]),
        where,
        int(said.get("pid") or 0),
        tuple(threads),
        str(said.get("error") or ""),
    )


def parse(text: str, node: str | None) -> list[RankStack]:
    return [s for line in text.splitlines() if (s := parse_line(line, node)) is not None]


def spans(numbers: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> `0-2,5`."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


@dataclass(frozen=True)
class Group:
    """Ranks in one place."""

    place: str
    stacks: tuple[RankStack, ...] = field(default_factory=tuple)

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.stacks]

    @property
    def label(self) -> str:
        ranks = self.ranks
        word = "ranks" if len(ranks) > 1 else "rank"
        nodes = list(dict.fromkeys(s.node for s in self.stacks))
        return f"{word} {spans(ranks)} ({', '.join(nodes)})"


def group(stacks: Sequence[RankStack]) -> list[Group]:
    """Ranks by place; the place with the lowest rank first."""
    by_place: dict[str, list[RankStack]] = {}
    for stack in sorted(stacks, key=lambda s: s.rank):
        by_place.setdefault(stack.place, []).append(stack)
    return [Group(place, tuple(found)) for place, found in by_place.items()]


def waiting(stacks: Sequence[RankStack]) -> str:
    """Who holds a collective up: `ranks 0-2 wait in all_reduce for rank 3`, when some ranks
    sit in one collective and the others (with a stack) are somewhere else; else ""."""
    known = [s for s in stacks if not s.error and s.main]
    inside = [s for s in known if s.call in COLLECTIVES]
    calls = {s.call for s in inside}
    away = [s for s in known if s.call not in COLLECTIVES]
    if len(calls) != 1 or not away:
        return ""
    word = "ranks" if len(inside) > 1 else "rank"
    late = "ranks" if len(away) > 1 else "rank"
    return (
        f"{word} {spans(s.rank for s in inside)} wait in {calls.pop()} for {late}"
        f" {spans(s.rank for s in away)}"
    )


def lines(stacks: Sequence[RankStack], *, full: bool = False) -> list[str]:
    """What `vmrun stacks` prints: a line per place, then who holds a collective up;
    `full`: each place's main-thread stack (its first rank's) and the other threads'
    innermost frames beneath it."""
    out = []
    for found in group(stacks):
        out.append(f"{found.label}: {found.place}")
        first = found.stacks[0]
        if not full or first.error:
            continue
        for frame in first.main:
            out.append(f"    {frame.name} ({frame.file}:{frame.line})")
        for name, frames in first.threads:
            if frames is not first.main and frames:
                out.append(f"  thread {name}: {frames[0].name} ({frames[0].file}:{frames[0].line})")
    held = waiting(stacks)
    return [*out, held] if held else out


def as_json(stack: RankStack) -> dict[str, Any]:
    return {
        "rank": stack.rank,
        "node": stack.node,
        "pid": stack.pid,
        "place": stack.place,
        **({"error": stack.error} if stack.error else {}),
        "threads": [
            {
                "name": name,
                "frames": [
                    {"name": f.name, "file": f.file, "path": f.path, "line": f.line} for f in frames
                ],
            }
            for name, frames in stack.threads
        ],
    }


def keep(stacks: Sequence[RankStack], folder: Path) -> Path:
    """rank-R.json for each rank and stacks.txt (the grouped summary, whole stacks) in
    `folder`, made if need be; the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for stack in stacks:
        (folder / f"rank-{stack.rank}.json").write_text(json.dumps(as_json(stack), indent=1))
    (folder / "stacks.txt").write_text("\n".join(lines(stacks, full=True)) + "\n")
    return folder


@dataclass(frozen=True)
class Flight:
    """One rank's flight recorder dump, as read on its host (hostside/stacks.py): the
    default group's last collective it enqueued (its number and name) and completed."""

    rank: int
    node: str
    enqueued: int = -1
    op: str = ""
    completed: int = -1
    error: str = ""


def parse_flights(text: str, node: str | None) -> list[Flight]:
    found = []
    for line in text.splitlines():
        if not line.startswith('{"fr": '):
            continue
        try:
            fr = json.loads(line)["fr"]
            found.append(
                Flight(
                    int(fr["rank"]),
                    node or str(fr.get("host") or "?"),
                    int(fr.get("enqueued", -1)),
                    str(fr.get("op") or ""),
                    int(fr.get("completed", -1)),
                    str(fr.get("error") or ""),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda f: f.rank)


def flight_verdict(flights: Sequence[Flight]) -> str:
    """Who has not arrived, from the dumps: `ranks 0-2 reached collective #30 (gloo:
    all_reduce); rank 3 did not (its last: #29)`; "" when every rank is at the same one."""
    known = [f for f in flights if not f.error and f.enqueued >= 0]
    if not known:
        return ""
    last = max(f.enqueued for f in known)
    there = [f.rank for f in known if f.enqueued == last]
    behind = [f for f in known if f.enqueued < last]
    op = next((f.op for f in known if f.enqueued == last and f.op), "")
    head = (
        f"flight recorder: {'ranks' if len(there) > 1 else 'rank'} {spans(there)} reached"
        f" collective #{last}" + (f" ({op})" if op else "")
    )
    if not behind:
        return f"{head}, every rank with a dump"
    lasts = ", ".join(f"#{f.enqueued}" for f in behind)
    word = "ranks" if len(behind) > 1 else "rank"
    return f"{head}; {word} {spans(f.rank for f in behind)} did not (last: {lasts})"
