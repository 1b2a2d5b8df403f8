"""`train --store`: a run's outputs copied to its bucket from the node that holds them, as
they are written, by the run's agent on each node (hostside/store_copier.py, passes of
hostside/store_sync.sh: rclone, beside the run, never part of it: a copy that fails is
tried again and said in the run's log, the run goes on). Each run goes
to STORE/RUN_ID/ (its output folder as written) and STORE/RUN_ID/.vmrun/ (its record: log,
run.json, provenance, exit code), so a run outlives its hosts. Here: the check before a
run starts, what the node is told, and where the copy stands (`status`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from vmrun import hostside
from vmrun.errors import UsageError
from vmrun.ssh.connection import Connection
from vmrun.store_url import StoreURL
from vmrun.stores.access import Access

RECORD = ".vmrun"  # the run's record under its place in the bucket


def run_place(store: StoreURL, run_id: str) -> StoreURL:
    return store.join(run_id)


def check_store(
    conn: Connection, place: StoreURL, access: Access, python: str = "", probe: str = "started"
) -> None:
    """Before the run: the node has the mover and the bucket takes a write (`.vmrun/PROBE`:
    the master's is the first object of the run's record, `started`; every other node
    writes its own, as two writes of one object make a mover's read-back fail). Refused
    with the fix, nothing started."""
    from vmrun.stores.mover import MIN_VERSION, TOOL_HINT, store_error

    result = conn.run(
        hostside.command("store_sync.sh", "check", place.path, python, probe),
        env={"VMRUN_STORE_CONFIG": access.mover_config()},
        what=f"the check of {place}",
    )
    if result.exit_status == 0:
        return
    said = result.output_tail(5).strip().splitlines()
    if result.exit_status == 5:
        words = said[-1].split() if said else []
        found = words[1] if len(words) > 1 and words[0] == "tool" else "none"
        raise UsageError(
            f"--store: no rclone {MIN_VERSION} or later on {conn.label} (found: {found})",
            host=conn.label,
            hint=TOOL_HINT.format(host=conn.label),
            code="store-tool-missing",
        )
    raise store_error(said or ["the bucket refused the run's first file"], conn.label, place)


@dataclass(frozen=True)
class StoreState:
    """Where a run's copy to its bucket stands, from the node's store.json (host clock):
    every node copies what its ranks wrote, so each node says its own."""

    to: str
    # syncing, ok, failing, done, gave-up, replaced (a newer attempt copies now), waiting
    # (a node that copies outputs only, before its master claimed the attempt); copied (as
    # the bucket holds it, listed there: `status --store`)
    state: str
    at: float  # when the copier last wrote this
    synced: float | None = None  # the last copy that went through
    failing_since: float | None = None
    files: int = 0  # waiting to be copied (while failing)
    nbytes: int = 0
    error: str = ""
    role: str = "record"  # record (the master: the run's record too) or outputs
    waits: tuple[str, ...] = ()  # checkpoints' .metadata held until their shards are there
    conflicts: tuple[str, ...] = ()  # files another node sent with other bytes: kept here

    @classmethod
    def parse(cls, text: str) -> StoreState | None:
        try:
            raw: Any = json.loads(text)
        except ValueError:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("state"), str):
            return None

        def number(key: str) -> float | None:
            value = raw.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        def names(key: str) -> tuple[str, ...]:
            value = raw.get(key)
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        return cls(
            to=str(raw.get("to") or ""),
            state=raw["state"],
            at=number("at") or 0.0,
            synced=number("synced"),
            failing_since=number("failing_since"),
            files=int(number("files") or 0),
            nbytes=int(number("bytes") or 0),
            error=str(raw.get("error") or ""),
            role=str(raw.get("role") or "record"),
            waits=names("waits"),
            conflicts=names("conflicts"),
        )

    def behind(self, now: float | None = None) -> float | None:
        """Seconds since the bucket last had everything (None: never yet)."""
        if self.synced is None or self.state == "copied":  # the bucket knows not what waits
            return None
        if self.state in ("ok", "done"):
            return 0.0
        return max(0.0, (now if now is not None else time.time()) - self.synced)

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        return {
            "to": self.to,
            "state": self.state,
            "behind_s": self.behind(now),
            "files_waiting": self.files,
            "bytes_waiting": self.nbytes,
            "error": self.error or None,
            "role": self.role,
            "metadata_waiting": list(self.waits),
            "conflicts": list(self.conflicts),
        }

    def describe(self, now: float | None = None) -> str:
        """`bucket: up to date`, `bucket: 3 files (48.0 MiB) behind for 40 s: ...`."""
        if self.state == "done":
            return f"{self.to}: all there"
        if self.state == "gave-up":
            return f"{self.to}: gave up ({self.error}); the files are on the host"
        if self.state == "replaced":
            return f"{self.to}: a newer attempt copies there now; nothing more from this host"
        if self.state == "failing":
            since = (now or time.time()) - (self.failing_since or self.at)
            return (
                f"{self.to}: {self.files} file(s) ({self.nbytes / 2**20:.1f} MiB) behind for"
                f" {since:.0f} s: {self.error}"
            )
        if self.state == "syncing":
            return f"{self.to}: first copy under way"
        if self.state == "waiting":
            return f"{self.to}: waits for the run's master to claim this attempt there"
        if self.state == "copied":
            return f"{self.to}: last copied {time.strftime('%m-%d %H:%M', time.localtime(self.at))}"
        notes = []
        if self.waits:
            notes.append(f"{len(self.waits)} checkpoint(s) wait for shards before their .metadata")
        if self.conflicts:
            notes.append(f"not overwritten (another node's there): {', '.join(self.conflicts)}")
        return f"{self.to}: up to date" + (f"; {'; '.join(notes)}" if notes else "")
