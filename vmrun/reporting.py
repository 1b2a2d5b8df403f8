"""What vmrun tells its user while it works, through one object made by the caller and handed
down (the CLI makes a terminal one; a library user takes the quiet default or their own).

Every library function that speaks takes `out: Reporter` rather than callbacks: `info` for a
step worth knowing, `warn` for something the user should act on, `output` for a run's own
output (bytes of whole lines, as the run printed them), `failure` for one host's or node's
error in a fan-out that goes on; and two parts for what goes on at once on many hosts:
`progress()`, the bytes and steps of transfers and pulls, and `host_steps()`, each host's
step in a setup. Calls may come from several threads at once (one per host); an
implementation keeps each call's text whole.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext


class Progress:
    """Transfers and long steps as they go, per host (all no-ops here); called from one
    thread per host. One that is also a context manager (a live view) is entered around
    the work."""

    def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
        """A transfer to (or from) `host` starts; `via`: the host it comes from, when not here."""

    def file_begin(self, host: str, path: str, size: int, offset: int) -> None: ...
    def advance(self, host: str, nbytes: int) -> None: ...
    def file_end(self, host: str, path: str, ok: bool) -> None: ...
    def warn(self, host: str, text: str) -> None: ...
    def step(self, host: str, what: str, done: int, total: int | None) -> None:
        """A step before the transfer that is not one (an image pull): `done` of `total`
        bytes (None: not known yet)."""


class HostSteps:
    """Each host's step while setup works on many at once (calls come from one thread per
    host): the CLI's live table is one. This one hears nothing."""

    def watching(self, hosts: list[str]) -> AbstractContextManager[object]:
        """Around the hosts' parallel work: a live view draws while it lasts."""
        return nullcontext()

    def event(self, host: str, text: str) -> None:
        """The host's step now ("connecting", a step's name, "done", "failed", ...)."""

    def progress(self, host: str, text: str, notable: bool) -> None:
        """A download's progress within the current step; `notable`: its end, or one line
        every few seconds (what a log without a live view keeps)."""


class Reporter:
    """Says nothing: the default for a library caller that wants only the return values."""

    def info(self, text: str) -> None:
        """A step worth knowing: `vmrun: text` on a terminal."""

    def warn(self, text: str) -> None:
        """Something the user should look at; the work goes on."""

    def output(self, data: bytes) -> None:
        """A run's own output, whole lines, as they come (a log reader's raw chunks go to a
        `vmrun.runs.lines.Prefixer`, the Reporter that makes them whole lines)."""

    def failure(self, error: BaseException) -> None:
        """One place's failure in a fan-out that goes on (the summary raises, if any)."""

    def progress(self, *, several: bool = False, live: bool = True) -> Progress:
        """What reports the transfers and pulls about to start: `several` hosts at once (a
        line names its host), `live`: a view that redraws is welcome (not between a run's
        own lines). Here: only their warnings, as `warn`s."""
        return _Warnings(self)

    def host_steps(self) -> HostSteps:
        """What hears each host's step in a setup. Quiet here."""
        return HostSteps()


class _Warnings(Progress):
    def __init__(self, out: Reporter):
        self.out = out

    def warn(self, host: str, text: str) -> None:
        self.out.warn(f"{host}: {text}")


QUIET = Reporter()


class Passing(Reporter):
    """Passes what it hears to `out`: the base of a Reporter that adds to a run's output
    (a prefixer, a watcher of its lines) and says the rest as told."""

    def __init__(self, out: Reporter):
        self.out = out

    def info(self, text: str) -> None:
        self.out.info(text)

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def failure(self, error: BaseException) -> None:
        self.out.failure(error)

    def output(self, data: bytes) -> None:
        self.out.output(data)


class Recorder(Reporter):
    """Keeps what was said, in order, for tests and for callers that render it later."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.said: list[tuple[str, str]] = []  # (kind, text): kind is "info" or "warn"
        self.outputs: list[bytes] = []  # each `output` call's bytes, as they came
        self.failures: list[BaseException] = []

    def info(self, text: str) -> None:
        with self._lock:
            self.said.append(("info", text))

    def warn(self, text: str) -> None:
        with self._lock:
            self.said.append(("warn", text))

    def output(self, data: bytes) -> None:
        with self._lock:
            self.outputs.append(bytes(data))

    def failure(self, error: BaseException) -> None:
        with self._lock:
            self.failures.append(error)

    @property
    def data(self) -> bytes:
        """All the output, joined."""
        with self._lock:
            return b"".join(self.outputs)

    @property
    def lines(self) -> list[str]:
        """Every info and warning, in order."""
        with self._lock:
            return [text for _, text in self.said]
