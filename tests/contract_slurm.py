"""The Slurm backend over its contract's fakes: the login node is a home on this machine,
where vmrun's login-node scripts run by `sh` as they would over SSH (LoginNode, a STAND-IN
for a Connection), against a small fake scheduler (tests/fake_slurm.py, a STAND-IN for
Slurm) first on the PATH; the project's sync is a copy (STAND-IN for rsync over SSH).
Everything else (the batch script, submission, listing, following, stopping) is the real
code."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fake_slurm
from conftest import install_hostlib, local_argv
from contract_harness import Gate, pid_alive

from vmrun.backends.api import RunRef
from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.job import check_spec
from vmrun.backends.slurm.options import SlurmOptions
from vmrun.errors import CommandFailed
from vmrun.reporting import Reporter
from vmrun.runs.plan import Plan
from vmrun.ssh.channel import command_failed
from vmrun.ssh.result import CommandResult
from vmrun.transfer.types import Progress


class LoginNode:
    """STAND-IN for the login node's Connection: each command runs here, in `home`, with the
    fake Slurm first on the PATH; what a command leaves running goes when it returns, as a
    closed SSH channel's process group does."""

    lib_ready = True

    def __init__(self, label: str, home: Path, bin_dir: Path) -> None:
        self.label = label
        self.home = home
        self.env = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    "LANG": "C.UTF-8"}  # fmt: skip

    def open(self) -> LoginNode:
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
            proc = subprocess.Popen(local_argv(argv, self.home), env={**self.env, **(env or {})},
                                    cwd=self.home, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=True)  # fmt: skip
            fired = threading.Event()  # the command ran past its timeout, and was ended

            def expire() -> None:
                fired.set()
                _kill_group(proc.pid)

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
                _kill_group(proc.pid)
            err.seek(0)
            errors = _Lines("err", on_output)
            errors.feed(err.read())
        if fired.is_set():
            raise CommandFailed(f"{what or argv[0]} timed out after {timeout or 120:g} s",
                                host=self.label, code="timeout")  # fmt: skip
        result = CommandResult(self.label, tuple(argv), status if status >= 0 else 128 - status,
                               out.text(), errors.text(), time.monotonic() - started)  # fmt: skip
        if check and not result.ok:
            raise command_failed(result, what)
        return result

    def capture(
        self, command: str, *, stdin: bytes = b"", what: str = "", **_: Any
    ) -> tuple[int, bytes, str]:
        done = subprocess.run(["sh", "-c", command], env=self.env, cwd=self.home, input=stdin,
                              capture_output=True, timeout=120, check=False)  # fmt: skip
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


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class SlurmHarness(Gate):
    resumes = False  # Slurm requeues a job itself; `start(resume=...)` is refused

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.home = tmp_path / "login-home"
        install_hostlib(self.home)
        self.slurm = tmp_path / "slurm"
        fake_slurm.install(self.slurm, self.slurm / "bin")
        self.conn = LoginNode("bed", self.home, self.slurm / "bin")
        cluster = Cluster("bed", "login", python=sys.executable)
        spec = check_spec(SlurmOptions().job_spec(cluster, None), "python")
        self.backend = SlurmBackend(self.conn, cluster, spec, poll=0.05,  # type: ignore[arg-type]
                                    unanswered_limit=30)  # fmt: skip
        self.backend._sync = self._copy  # type: ignore[method-assign]

    def _copy(self, plan: Plan, code: str, out: Reporter, progress: Progress | None) -> None:
        """STAND-IN for the project's sync over SSH (rsync): the files it would send, copied
        into the code folder on the "shared filesystem" (the login home)."""
        from vmrun.sync.files import project_files

        for name in project_files(plan.project):
            (Path(code) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(plan.project / name, Path(code) / name)

    def __enter__(self) -> SlurmHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        for job in fake_slurm.jobs(self.slurm, None):  # every job's processes, whatever happened
            supervisor = job.dir / "supervisor"
            if supervisor.exists():
                _kill_group(int(supervisor.read_text()))
            if pgid := job.read().get("pgid"):
                _kill_group(int(pgid))

    def plan(self) -> Plan:
        return super().plan()

    def began(self, ref: RunRef) -> bool:
        return super().began()

    def alive(self, ref: RunRef) -> bool:
        state = fake_slurm.Job(self.slurm, str(ref.meta["job_id"])).read()
        began = int(self.began_file.read_text()) if self.began_file.exists() else 0
        return bool(began and pid_alive(began)) or fake_slurm.group_alive(int(state["pgid"]))

    def exists(self, path: str) -> bool:
        return (self.home / path).exists()
