"""Which worker failed first, as torchrun's summary names it (vmrun/hostside/run_failure.py
reads it where the run ran and keeps it in the record's failure.json). torchrun exits 1
whenever a worker fails; the record's exit code is the worker's own, and this says which
rank it was and where, for the follower's line, `status`, notifications and `report`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FILE = "failure.json"


@dataclass(frozen=True)
class WorkerFailure:
    exit: int  # the worker's code (a signal N as 128+N)
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None  # the worker's host name, as torchrun saw it
    signal: str | None = None  # "SIGKILL" when a signal ended it
    launcher_exit: int | None = None  # torchrun's own status (1)

    @classmethod
    def parse(cls, text: str) -> WorkerFailure | None:
        """failure.json's text; None when it is not one."""
        try:
            item = json.loads(text)
            return cls.of(item) if isinstance(item, dict) else None
        except ValueError:
            return None

    @classmethod
    def of(cls, item: dict[str, Any]) -> WorkerFailure | None:
        def number(key: str) -> int | None:
            value = item.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        code = number("exit")
        if code is None:
            return None
        host, sig = item.get("host"), item.get("signal")
        return cls(
            code,
            number("rank"),
            number("local_rank"),
            str(host) if host else None,
            str(sig) if sig else None,
            number("launcher_exit"),
        )

    def who(self, node: str | None = None) -> str:
        """`rank 3 (local rank 1) on h2`: the node vmrun knows it by, else torchrun's host."""
        where = node or self.host
        rank = "a worker" if self.rank is None else f"rank {self.rank}"
        if self.local_rank is not None and self.local_rank != self.rank:
            rank += f" (local rank {self.local_rank})"
        return f"{rank} on {where}" if where else rank

    def describe(self, node: str | None = None) -> str:
        """`rank 3 (local rank 1) on h2 exited with 3` (or `was killed by SIGKILL`)."""
        how = f"was killed by {self.signal}" if self.signal else f"exited with {self.exit}"
        return f"{self.who(node)} {how}"

    def as_json(self, node: str | None = None) -> dict[str, Any]:
        return {
            "node": node,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "host": self.host,
            "exit": self.exit,
            "signal": self.signal,
            "launcher_exit": self.launcher_exit,
        }
