"""Results are values: what ran where, how it ended, the tail of its output, how long it took."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandResult:
    host: str
    argv: tuple[str, ...]
    exit_status: int  # the remote exit code; 128+N when killed by signal N; 255 if unknown
    stdout_tail: str
    stderr_tail: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def output_tail(self, lines: int = 20) -> str:
        """The last lines of stderr, else stdout: what a failure message should quote."""
        text = self.stderr_tail.strip() or self.stdout_tail.strip()
        return "\n".join(text.splitlines()[-lines:])


class Tail:
    """Keeps the last `max_bytes` of a byte stream and decodes it on demand."""

    def __init__(self, max_bytes: int = 64 * 1024):
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._max = max_bytes

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size - len(self._chunks[0]) >= self._max and len(self._chunks) > 1:
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        data = b"".join(self._chunks)[-self._max :]
        return data.decode("utf-8", "replace")
