"""What vmrun tells its user while it works, through one object made by the caller and handed
down (the CLI makes a terminal one; a library user takes the quiet default or their own).

Every library function that speaks takes `out: Reporter` rather than callbacks: `info` for a
step worth knowing, `warn` for something the user should act on, `output` for a run's own
output (bytes of whole lines, as the run printed them), `failure` for one host's or node's
error in a fan-out that goes on. Calls may come from several threads at once (one per host);
an implementation keeps each call's text whole.
"""

from __future__ import annotations

import threading


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


QUIET = Reporter()


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
