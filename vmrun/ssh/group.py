"""Work over many hosts at once: one connection per host, one result or error per host.

A host failing never stops or hides the others; callers get every host's outcome and
decide (usually `raise_for_failures`) how to report them.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from vmrun.config import Settings
from vmrun.errors import HostsFailed, Interrupted
from vmrun.ssh import pool
from vmrun.ssh.connection import Connection
from vmrun.ssh.inventory import HostEntry

T = TypeVar("T")
_SETTLE_S = 3.0  # a closed channel is noticed within drain's 0.5 s wait
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Outcome(Generic[T_co]):
    host: str
    value: T_co | None
    error: BaseException | None
    duration: float

    @property
    def ok(self) -> bool:
        return self.error is None


class Group:
    """Connections to several hosts; each opens on first use and is reused after."""

    def __init__(self, entries: Sequence[HostEntry], settings: Settings):
        self.entries = list(entries)
        self.settings = settings
        self.connections = {
            e.label: pool.connection(e.spec, settings, e.label) for e in self.entries
        }
        for conn in self.connections.values():
            conn.fan_out = len(self.entries)

    def map(
        self,
        fn: Callable[[HostEntry, Connection], T],
        only: Collection[str] | None = None,
        *,
        at_once: int | None = None,
    ) -> list[Outcome[T]]:
        """Run fn(entry, connection) on every host (or those labelled in `only`), at most
        `at_once` (default: the `parallel` setting) at a time, taken in host order; outcomes
        in host order. A host that hangs holds one place until its own deadline, never the
        others'.

        Ctrl-C closes every connection (which stops the remote commands) and raises
        Interrupted; hosts not started by then are not started.
        """
        outcomes: dict[str, Outcome[T]] = {}
        lock = threading.Lock()
        chosen = [e for e in self.entries if only is None or e.label in only]
        waiting = collections.deque(chosen)
        stopped = threading.Event()

        def one(entry: HostEntry) -> None:
            started = time.monotonic()
            value: T | None = None
            error: BaseException | None = None
            try:
                value = fn(entry, self.connections[entry.label])
            except BaseException as exc:  # reported per host, never lost
                error = exc
            with lock:
                outcomes[entry.label] = Outcome(
                    entry.label, value, error, time.monotonic() - started
                )

        def worker() -> None:
            while not stopped.is_set():
                with lock:
                    if not waiting:
                        return
                    entry = waiting.popleft()
                threading.current_thread().name = f"vmrun-{entry.label}"
                one(entry)

        width = max(1, min(at_once or self.settings.parallel, len(chosen)))
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(width)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        except KeyboardInterrupt:
            stopped.set()
            self.close()
            _settle(threads, _SETTLE_S)
            raise Interrupted(
                f"interrupted; closed the connections to {len(self.entries)} host(s), which"
                " stops the commands running there"
            ) from None
        return [outcomes[e.label] for e in chosen]

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(threads: Sequence[threading.Thread], seconds: float) -> None:
    """Give the workers a moment to see their closed channels and return: a daemon thread
    still writing output when the interpreter exits holds stdout's lock, and Python then
    aborts (SIGABRT, "could not acquire lock for <stdout> at interpreter shutdown")."""
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def raise_for_failures(outcomes: Sequence[Outcome[object]], *, one_as_itself: bool = False) -> None:
    """Raise HostsFailed naming every failed host; with `one_as_itself`, a lone failure is
    raised as it is (its own exit code and hint), as a command about one run prefers."""
    failures = {o.host: o.error for o in outcomes if o.error is not None}
    if one_as_itself and len(failures) == 1:
        raise next(iter(failures.values()))
    if failures:
        raise HostsFailed(failures, total=len(outcomes))


def worst_exit_code(outcomes: Sequence[Outcome[object]]) -> int:
    """The highest per-host code: a remote exit status, or vmrun's code for a host's error."""
    from vmrun.errors import exit_code_for

    codes = [0]
    for outcome in outcomes:
        if outcome.error is not None:
            codes.append(exit_code_for(outcome.error))
        else:
            codes.append(int(getattr(outcome.value, "exit_status", 0)))
    return max(codes)
