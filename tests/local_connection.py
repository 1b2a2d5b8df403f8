"""One STAND-IN for the SSH connection in quick tests of host-side code: the command runs on
this machine, in a home of its own, by the argv vmrun would send (tests/contract_hosts.py,
contract_slurm.py, test_stores.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conftest import local_argv

from vmrun.errors import CommandFailed
from vmrun.ssh.channel import command_failed
from vmrun.ssh.result import CommandResult


class LocalConnection:
    """STAND-IN for a Connection (a host's, a login node's): each command runs here, in
    `home`, as this user, with `bin_dir` (a fake scheduler) first on the PATH; its output
    streams in whole lines, its env comes as the environment, and what it leaves running goes
    when it returns, as a closed SSH channel's process group does."""

    lib_ready = True

    def __init__(self, label: str, home: Path, bin_dir: Path | None = None) -> None:
        self.label = label
        self.home = home
        path = f"{bin_dir}:{os.environ['PATH']}" if bin_dir else os.environ["PATH"]
        self.env = {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8"}

    def open(self) -> LocalConnection:
        return self

    def ensure_lib(self) -> None:
        """install_hostlib put vmrun's host-side files in the home already."""

    def run(
        self,
        argv: Sequence[str],
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        what: str | None = None,
        check: bool = False,
        **_: Any,
    ) -> CommandResult:
        started = time.monotonic()
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                local_argv(argv, self.home),
                env={**self.env, **(env or {})},
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
            fired = threading.Event()  # the command ran past its timeout, and was ended

            def expire() -> None:
                fired.set()
                kill_group(proc.pid)

            timer = threading.Timer(timeout or 120, expire)
            timer.start()
            out = _Lines("out", on_output)
            try:
                assert proc.stdout is not None
                for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
                    out.feed(chunk)
                status = proc.wait()
            finally:
                timer.cancel()
                kill_group(proc.pid)
            err.seek(0)
            errors = _Lines("err", on_output)
            errors.feed(err.read())
        if fired.is_set():
            raise CommandFailed(
                f"{what or argv[0]} timed out after {timeout or 120:g} s",
                host=self.label,
                code="timeout",
            )
        result = CommandResult(
            self.label,
            tuple(argv),
            status if status >= 0 else 128 - status,
            out.text(),
            errors.text(),
            time.monotonic() - started,
        )
        if check and not result.ok:
            raise command_failed(result, what)
        return result

    def capture(
        self, command: str, *, stdin: bytes = b"", what: str = "", **_: Any
    ) -> tuple[int, bytes, str]:
        done = subprocess.run(
            ["sh", "-c", command],
            env=self.env,
            cwd=self.home,
            input=stdin,
            capture_output=True,
            timeout=120,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr.decode(errors="replace")


class _Lines:
    """A stream's bytes, kept, and handed on in whole lines as the real channel does."""

    def __init__(self, stream: str, on_output: Callable[[str, bytes], None] | None) -> None:
        self.stream, self.on_output = stream, on_output
        self.data, self.rest = b"", b""

    def feed(self, data: bytes) -> None:
        self.data += data
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            if self.on_output is not None:
                self.on_output(self.stream, line + b"\n")

    def text(self) -> str:
        if self.rest and self.on_output is not None:
            self.on_output(self.stream, self.rest)
            self.rest = b""
        return self.data.decode(errors="replace")


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
