"""A run's log on the page, live: one follower per run (`vmrun logs -f`'s own follow, in a
thread), shared by every page open on it. It keeps the lines it has seen, so a page opened
later gets them first, and hands each new line to every page listening.

A follower is never cancelled by a page going away: following ends when the run does (as
`logs -f` does, with its failure rule), so a page closing can never look, to the follow, like
a node that failed. Lines are text, `[host rankN] ...` as the CLI prints them.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vmrun.reporting import Reporter

KEPT_LINES = 20000  # a page opened late gets this many of the newest lines


@dataclass(frozen=True)
class Line:
    """One line of the log (`kind` "log"), or what vmrun said about it ("info", "warn"), or
    its end ("end": the text says how it ended)."""

    seq: int
    kind: str
    text: str
    at: float = field(default_factory=time.time)


Listener = Callable[[Line], None]


class _Tee(Reporter):
    def __init__(self, follower: Follower):
        self.follower = follower

    def output(self, data: bytes) -> None:
        for line in data.decode("utf-8", "replace").splitlines():
            self.follower.add("log", line)

    def info(self, text: str) -> None:
        self.follower.add("info", text)

    def warn(self, text: str) -> None:
        self.follower.add("warn", text)

    def failure(self, error: BaseException) -> None:
        self.follower.add("warn", str(error))


class Follower:
    """`follow(out)` runs in a thread until the run ends; `listen` gives the lines so far
    and then each new one to a page's listener (called from that thread: the listener hands
    it over to its own loop)."""

    def __init__(self, run_id: str, follow: Callable[[Reporter], str]):
        self.run_id = run_id
        self._follow = follow
        self._lock = threading.Lock()
        self._lines: collections.deque[Line] = collections.deque(maxlen=KEPT_LINES)
        self._listeners: set[Listener] = set()
        self._seq = 0
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name=f"follow-{run_id}")

    def start(self) -> Follower:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            how = self._follow(_Tee(self))
        except BaseException as exc:  # the run's failure, or why it could not be followed
            how = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        self.add("end", how)
        self.ended.set()

    def add(self, kind: str, text: str) -> None:
        with self._lock:
            self._seq += 1
            line = Line(self._seq, kind, text)
            self._lines.append(line)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(line)

    def listen(self, listener: Listener) -> list[Line]:
        """The lines so far; every later one goes to `listener` until `leave`."""
        with self._lock:
            self._listeners.add(listener)
            return list(self._lines)

    def leave(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)


class Followers:
    """The followers of this server, one per run; a run that ended is followed afresh when
    a page asks again (its log as it is then)."""

    def __init__(self, make: Callable[[str], Callable[[Reporter], str]]):
        self._make = make
        self._lock = threading.Lock()
        self._by_run: dict[str, Follower] = {}

    def of(self, run_id: str) -> Follower:
        with self._lock:
            found = self._by_run.get(run_id)
            if found is None or found.ended.is_set():
                found = self._by_run[run_id] = Follower(run_id, self._make(run_id)).start()
            return found
