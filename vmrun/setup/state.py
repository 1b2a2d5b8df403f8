"""What setup remembers on a host: each step's fingerprint, run stamp and records in
~/.vmrun/setup/state.json, and the environment it made in ~/.vmrun/host.json."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from vmrun import hostside, remote_paths
from vmrun.setup.playbook import Playbook, Step, fingerprint
from vmrun.ssh.connection import Connection


class SetupState:
    """The steps' stored state (from the facts' read of state.json), updated as steps finish."""

    def __init__(self, stored: Mapping[str, Any]):
        steps = stored.get("steps")
        self.steps: dict[str, dict] = (
            {k: v for k, v in steps.items() if isinstance(v, dict)}
            if isinstance(steps, dict)
            else {}
        )
        self.stamps = {name: str(step.get("stamp", "")) for name, step in self.steps.items()}

    def done(self, step: Step, params: Mapping[str, str], records: dict[str, str]) -> None:
        """A step succeeded (or was adopted): a new stamp, so steps that need it re-run."""
        self.stamps[step.name] = str(time.time_ns())
        self.steps[step.name] = {
            "fingerprint": fingerprint(step, params, self.stamps),
            "stamp": self.stamps[step.name],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "record": records,
        }

    def records(self, book: Playbook) -> dict[str, str]:
        """What the steps recorded (python, torch, cuda...), later steps winning."""
        merged: dict[str, str] = {}
        for step in book.steps:
            rec = (self.steps.get(step.name) or {}).get("record")
            if isinstance(rec, dict):
                merged.update({str(k): str(v) for k, v in rec.items()})
        return merged

    def save(
        self,
        conn: Connection,
        host_record: Mapping[str, str],
        paths: tuple[str, str] = (remote_paths.SETUP_STATE, remote_paths.HOST_RECORD),
    ) -> None:
        """State and the host record (at `paths`) in one atomic write each (temp + mv)."""
        payload = json.dumps({"version": 1, "steps": self.steps}, indent=1, sort_keys=True)
        conn.run(
            [
                *hostside.command("setup_state_save.sh"),
                paths[0],
                payload,
                paths[1],
                json.dumps(dict(host_record), sort_keys=True),
            ],
            check=True,
        )


def parse_records(text: str) -> dict[str, str]:
    """`key=value` lines a recording step printed (other lines are its ordinary output)."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z][a-z0-9_]*", key):
            pairs[key] = value.strip()
    return pairs
