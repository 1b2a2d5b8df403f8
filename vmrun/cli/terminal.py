"""The CLI's output object: the one `Reporter` every command hands down (`TERMINAL`, or a
`Terminal(json=True)` for a command's --json), with its progress and host-steps parts drawn
by the views (fetch_view, setup_view) on a terminal."""

from __future__ import annotations

import sys

from vmrun.cli.output import info_line, report, show, warn_line
from vmrun.reporting import HostSteps, Progress, Reporter


class Terminal(Reporter):
    """The CLI's Reporter: infos and warnings to stderr as `vmrun: ...` lines, a run's output
    to stdout as it comes, a host's failure as its error line (with --debug, its traceback);
    transfers and setup's host steps as live views on a terminal, else plain lines.
    `live`: views that redraw are welcome (not with --json or fetch --watch); `json`: stdout
    holds one JSON document, so every line goes to stderr."""

    def __init__(self, *, live: bool = True, json: bool = False):
        self.live = live and not json
        self.json = json

    def info(self, text: str) -> None:
        info_line(text)

    def warn(self, text: str) -> None:
        warn_line(text)

    def output(self, data: bytes) -> None:
        show(data)

    def failure(self, error: BaseException) -> None:
        report(error)

    def progress(self, *, several: bool = False, live: bool = True) -> Progress:
        from vmrun.cli.fetch_view import make_progress

        return make_progress(prefix=several, live=live and self.live and sys.stderr.isatty())

    def host_steps(self) -> HostSteps:
        from vmrun.cli.setup_view import Watch

        return Watch(live=self.live and sys.stdout.isatty(), to_stderr=self.json)


TERMINAL = Terminal()
