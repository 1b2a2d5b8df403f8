"""One host's setup log (.vmrun/logs/setup-HOST.log) and its live events, in one place."""

from __future__ import annotations

import re
import time
from pathlib import Path

from vmrun.reporting import HostSteps
from vmrun.setup.progress import Progress

PROGRESS_EVERY = 10.0  # seconds between the download progress lines of the log


class HostLog:
    """Appends to the host's log file (when there is one) and tells the live view."""

    def __init__(
        self,
        label: str,
        log_dir: Path | None,
        steps: HostSteps | None = None,
    ):
        self.label = label
        self.steps = steps or HostSteps()
        self._progress_said = (time.monotonic(), "")  # when the log last had one, and which
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
        self._progress_said = (time.monotonic(), "")
        self.steps.event(self.label, text)

    def progress(self, progress: Progress) -> None:
        """A download's progress: shown live each time, and logged when it ends and every
        PROGRESS_EVERY seconds before (pip's raw lines come four times a second)."""
        text, now = progress.text(), time.monotonic()
        said_at, said = self._progress_said
        notable = text != said and (progress.finished or now - said_at >= PROGRESS_EVERY)
        if notable:
            self.write(f".. {time.strftime('%H:%M:%S')} {text}")
            self._progress_said = (now, text)
        self.steps.progress(self.label, text, notable)
