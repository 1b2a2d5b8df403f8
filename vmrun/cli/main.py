"""Entry point: parse, run, and map every failure to one line and one exit code.

`--version` is answered before typer is even imported, so it costs a bare interpreter.
"""

from __future__ import annotations

import os
import sys

from vmrun import __version__
from vmrun.cli.output import say


def _debug_requested(argv: list[str]) -> bool:
    if os.environ.get("VMRUN_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    for word in argv:  # only the root's flags, before the command word, are vmrun's own
        if word == "--debug":
            return True
        if not word.startswith("-"):
            return False
    return False


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):
        say(f"vmrun {__version__}")
        sys.exit(0)
    sys.exit(run(args))


def run(args: list[str]) -> int:
    """Run the CLI and return the exit code (tests call this in-process)."""
    from vmrun.errors import Detached, VmrunError, exit_code_for

    debug = _debug_requested(args)
    if not args:
        args = ["--help"]  # a bare `vmrun` shows what it can do
    from vmrun.cli import output

    output.DEBUG = debug
    try:
        import typer

        from vmrun.cli.app import build, current_spelling

        args = current_spelling(args)
        command = build(args)
        try:
            result = command.main(args=args, prog_name="vmrun", standalone_mode=False)
        except typer.Abort:
            raise KeyboardInterrupt from None
        return result if isinstance(result, int) else 0
    except KeyboardInterrupt as exc:
        _error_line("interrupted", code="interrupted")
        return exit_code_for(exc)
    except Detached as exc:  # Ctrl-C left a run going on: say how to come back, no error
        output.info_line(exc.one_line())
        return 0
    except VmrunError as exc:
        output.report(exc)
        return exit_code_for(exc)
    except Exception as exc:
        if _is_usage_error(exc):  # bad input: one line and exit 2, --debug or not
            if debug:
                import traceback

                traceback.print_exc()
            ctx = getattr(exc, "ctx", None)
            see = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            _error_line(f"{exc.format_message()}{see}", code="usage")  # type: ignore[attr-defined]
            return int(exc.exit_code)  # type: ignore[attr-defined]
        if debug:
            raise
        _error_line(
            f"internal error: {type(exc).__name__}: {exc} (re-run with --debug for the traceback)",
            code="internal",
        )
        return 1


def _is_usage_error(exc: Exception) -> bool:
    """Typer's (vendored) click errors: bad flags, missing arguments."""
    return hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)


def _error_line(text: str, *, code: str) -> None:
    from vmrun.cli.output import error_line

    error_line(text, code=code)
