"""Plain, fast terminal output: error lines and host-prefixed streams.

rich is imported only by commands that draw tables or live views; streaming lines and
errors use plain writes so they start instantly and never buffer.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console

DEBUG = False  # set by main() for --debug / VMRUN_DEBUG

_COLOURS = ("36", "35", "33", "32", "34", "96", "95", "93", "92", "94")


def use_colour(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def error_line(text: str, *, code: str) -> None:
    """The one line a failure prints without --debug: `vmrun: error[CODE]: text`, the code
    one of vmrun.errors.CODES (docs/errors.md), for scripts and tests to match."""
    head = f"vmrun: error[{code}]:"
    prefix = f"\033[31m{head}\033[0m" if use_colour(sys.stderr) else head
    sys.stderr.write(f"{prefix} {text}\n")
    sys.stderr.flush()


def report(error: BaseException) -> None:
    """One line for a failure (a host's, in a fan-out); --debug adds its traceback."""
    from vmrun.errors import code_of

    if DEBUG:
        import traceback

        traceback.print_exception(type(error), error, error.__traceback__)
    one_line = getattr(error, "one_line", None)
    text = one_line() if callable(one_line) else f"{type(error).__name__}: {error}"
    error_line(text, code=code_of(error))


def unreached(ref: Any, undone: str) -> int:
    """Name each node of the run (`ref`, a RunRef) that did not answer, and what `undone`
    there; the exit code that says the work is incomplete (the node's error's: 12 for an
    unreachable host), 0 when every node answered."""
    from vmrun.errors import code_of, exit_code_for

    code = 0
    for node, error in ref.unreached.items():
        one_line = getattr(error, "one_line", None)
        why = one_line() if callable(one_line) else f"{type(error).__name__}: {error}"
        why = why.removeprefix(f"{node}: ")
        error_line(
            f"{node}: did not answer, so run {ref.run_id} {undone} ({why})", code=code_of(error)
        )
        code = max(code, exit_code_for(error))
    return code


def say(text: object = "", *, err: bool = False, end: str = "\n") -> None:
    """A line of a command's own result: to stdout (`err`: stderr, as with --json, where
    stdout holds the document alone), written whole and flushed. With `show`, `info_line`,
    `warn_line`, `error_line` and `make_console`, the only ways the CLI writes."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{text}{end}")
    stream.flush()


def make_console(*, err: bool = False, **options: Any) -> Console:
    """A rich Console for a table or a live view (rich is imported only here, when drawn)."""
    from rich.console import Console

    return Console(stderr=err, **options)


def show(data: bytes) -> None:
    """A run's output, as it comes (bytes of whole lines), to stdout."""
    sys.stdout.write(data.decode("utf-8", "replace"))
    sys.stdout.flush()


def info_line(text: str) -> None:
    sys.stderr.write(f"vmrun: {text}\n")
    sys.stderr.flush()


def warn_line(text: str) -> None:
    prefix = "\033[33mvmrun: warning:\033[0m" if use_colour(sys.stderr) else "vmrun: warning:"
    sys.stderr.write(f"{prefix} {text}\n")
    sys.stderr.flush()


class PrefixedWriter:
    """Writes whole lines from many hosts, each prefixed `[host]`, without interleaving."""

    def __init__(self, labels: list[str], *, prefix: bool, to_stderr: bool = False):
        self.prefix = prefix
        self.to_stderr = to_stderr  # (--json: stdout holds the document alone)
        self.width = max((len(label) for label in labels), default=0)
        self.lock = threading.Lock()
        self.colours = {label: _COLOURS[i % len(_COLOURS)] for i, label in enumerate(labels)}

    def line(self, label: str, stream: str, data: bytes) -> None:
        out = sys.stdout if stream == "out" and not self.to_stderr else sys.stderr
        text = data.decode("utf-8", "replace")
        if not text.endswith("\n"):
            text += "\n"
        if self.prefix:
            tag = f"[{label}]".ljust(self.width + 2)
            if use_colour(out):
                tag = f"\033[{self.colours.get(label, '0')}m{tag}\033[0m"
            text = f"{tag} {text}"
        with self.lock:
            out.write(text)
            out.flush()
