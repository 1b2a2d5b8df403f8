from __future__ import annotations

import re
from pathlib import Path

from vmrun.errors import (
    AuthError,
    ChangedHostKeyError,
    CommandFailed,
    ConfigError,
    ConnectionLostError,
    ExitCode,
    HostsFailed,
    Interrupted,
    RemoteError,
    UnknownHostKeyError,
    UnreachableError,
    UsageError,
    VmrunError,
    code_of,
    exit_code_for,
)


def test_one_mapping_from_error_to_exit_code() -> None:
    cases = {
        ConfigError("x"): ExitCode.USAGE,
        UnknownHostKeyError("x"): ExitCode.HOST_KEY,
        ChangedHostKeyError("x"): ExitCode.HOST_KEY,
        AuthError("x"): ExitCode.AUTH,
        UnreachableError("x"): ExitCode.UNREACHABLE,
        ConnectionLostError("x"): ExitCode.CONNECTION_LOST,
        RemoteError("x"): ExitCode.REMOTE,
        Interrupted("x"): ExitCode.INTERRUPTED,
        VmrunError("x"): ExitCode.FAILED,
        KeyboardInterrupt(): ExitCode.INTERRUPTED,
        ValueError("x"): ExitCode.FAILED,
        CommandFailed("x", exit_status=7): 7,
        CommandFailed("x", exit_status=124): 124,
        CommandFailed("x", exit_status=-1): ExitCode.FAILED,
    }
    for error, code in cases.items():
        assert exit_code_for(error) == code, error


def test_one_mapping_from_error_to_its_code() -> None:
    """The class gives the code; a raise site may name a more specific one of its class."""
    cases = {
        ConfigError("x"): "bad-config",
        ChangedHostKeyError("x"): "host-key-changed",
        UnreachableError("x"): "host-unreachable",
        UsageError("x"): "usage",
        UsageError("x", code="run-not-found"): "run-not-found",
        CommandFailed("x", exit_status=124, code="timeout"): "timeout",
        VmrunError("x"): "failed",
        KeyboardInterrupt(): "interrupted",
        ValueError("x"): "internal",
    }
    for error, code in cases.items():
        assert code_of(error) == code, error


def test_one_line_names_the_host_and_the_fix() -> None:
    err = UnreachableError(
        "connection refused by 1.2.3.4 port 22", host="gpu1", hint="check that sshd runs there"
    )
    assert (
        err.one_line() == "gpu1: connection refused by 1.2.3.4 port 22; check that sshd runs there"
    )
    assert str(err) == err.one_line()
    assert VmrunError("gpu1: already named", host="gpu1").one_line() == "gpu1: already named"


def test_hosts_failed_takes_the_worst_code() -> None:
    err = HostsFailed({"a": AuthError("x"), "b": ConnectionLostError("y")}, total=3)
    assert err.exit_code == ExitCode.CONNECTION_LOST
    assert err.one_line() == "2 of 3 hosts failed: a: x; b: y"


def test_the_docs_document_every_exit_code() -> None:
    """docs/errors.md's table and ExitCode are one list: nothing missing on either side."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", page, re.M)}
    assert documented == {int(code) for code in ExitCode}
