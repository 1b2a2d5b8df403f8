"""One exception tree and one table of exit codes.

Every failure vmrun reports is a `VmrunError`; its class decides the exit code, so the CLI
maps errors to codes in exactly one place (`exit_code_for`). Messages are one line that
names the host (when there is one) and says what to do.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes documented in the README (keep the two in step)."""

    OK = 0
    FAILED = 1  # a remote command or run failed (exec returns the worst remote code itself)
    USAGE = 2  # bad input: flags, host specs, vmrun.toml
    HOST_KEY = 10  # unknown or changed host key
    AUTH = 11  # authentication failed
    UNREACHABLE = 12  # DNS failure, refused, no route, connect timeout
    CONNECTION_LOST = 13  # link dropped or stopped answering mid-command
    REMOTE = 14  # the host answered but could not do what was asked (missing tool, no space)
    TIMEOUT = 124  # a remote command hit --timeout (the code timeout(1) uses)
    INTERRUPTED = 130  # Ctrl-C


class VmrunError(Exception):
    """Root of every error vmrun reports; `host` is set when one host is to blame."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, *, host: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.host = host
        self.hint = hint

    def one_line(self) -> str:
        """The single line shown without --debug: `host: what happened; what to do`."""
        text = self.message
        if self.hint:
            text = f"{text}; {self.hint}"
        if self.host and not text.startswith(f"{self.host}:"):
            text = f"{self.host}: {text}"
        return text

    def __str__(self) -> str:
        return self.one_line()


class UsageError(VmrunError):
    exit_code = ExitCode.USAGE


class HostSpecError(UsageError):
    pass


class ConfigError(UsageError):
    pass


class HostKeyError(VmrunError):
    exit_code = ExitCode.HOST_KEY


class UnknownHostKeyError(HostKeyError):
    pass


class ChangedHostKeyError(HostKeyError):
    pass


class AuthError(VmrunError):
    exit_code = ExitCode.AUTH


class UnreachableError(VmrunError):
    exit_code = ExitCode.UNREACHABLE


class ConnectionLostError(VmrunError):
    exit_code = ExitCode.CONNECTION_LOST


class RemoteError(VmrunError):
    exit_code = ExitCode.REMOTE


class OutcomeUnknown(RemoteError):
    """A followed run whose end nobody can confirm (a scheduler that stopped answering): it
    may still run, so nothing that waits for its end (a sweep's next size) may go on."""


class Interrupted(VmrunError):
    """Ctrl-C, after vmrun has cleaned up (closed channels, so remote commands stopped)."""

    exit_code = ExitCode.INTERRUPTED


class Detached(VmrunError):
    """Ctrl-C while following a run that goes on running (`train`, `logs -f`): information,
    not a failure; the message says how to reattach."""

    exit_code = ExitCode.OK


class CommandFailed(VmrunError):
    """A remote command exited non-zero where success was required."""

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        hint: str | None = None,
        exit_status: int = 1,
        output_tail: str = "",
    ):
        super().__init__(message, host=host, hint=hint)
        self.exit_status = exit_status
        self.output_tail = output_tail


class HostsFailed(VmrunError):
    """Several hosts failed in one fan-out; carries each host's error for the summary."""

    def __init__(self, failures: dict[str, BaseException], total: int):
        self.failures = failures
        whys = "; ".join(_host_line(host, err) for host, err in failures.items())
        super().__init__(f"{len(failures)} of {total} hosts failed: {whys}")
        codes = [exit_code_for(err) for err in failures.values()]
        self.exit_code = max(codes) if codes else ExitCode.FAILED


def _host_line(host: str, err: BaseException) -> str:
    text = err.one_line() if isinstance(err, VmrunError) else f"{type(err).__name__}: {err}"
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


def exit_code_for(err: BaseException) -> int:
    """The one mapping from a failure to the process exit code."""
    if isinstance(err, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(err, CommandFailed):
        return err.exit_status if 0 < err.exit_status < 256 else ExitCode.FAILED
    if isinstance(err, VmrunError):
        return int(err.exit_code)
    return ExitCode.FAILED
