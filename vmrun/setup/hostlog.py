"""One host's setup log (.vmrun/logs/setup-HOST.log) and its live events, in one place."""

from __future__ import annotations

import re
import time
from pathlib import Path

from vmrun.setup.report import EventCallback


class HostLog:
    """Appends to the host's log file (when there is one) and tells the live view."""

    def __init__(self, label: str, log_dir: Path | None, on_event: EventCallback | None = None):
        self.label = label
        self.on_event = on_event or (lambda host, text: None)
        self.path: Path | None = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.@-]+", "_", label)
            self.path = log_dir / f"setup-{safe}.log"

    def write(self, text: str) -> None:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(text if text.endswith("\n") else text + "\n")

    def event(self, text: str) -> None:
        """A change of what the host is doing: logged with the time, and shown live."""
        self.write(f"== {time.strftime('%H:%M:%S')} {text}")
        self.on_event(self.label, text)
