"""`vmrun tensorboard --local`: a run's event files fetched here, round after round, and served
by a TensorBoard on this machine, for a host whose python has no tensorboard (or no way to
get it), or to keep the curves when the VM is gone.

The files land where `vmrun fetch metrics` puts them (results/<run-id>/), with vmrun's
incremental, verified downloads (vmrun.transfer), so a round with nothing new is one
listing. A grown event file arrives as a new file renamed over the old one: TensorBoard's
fast loader (its Rust data server) keeps reading the old one it has open and never sees
the new events, so this TensorBoard runs with `--load_fast=false`, whose reader opens the
file by its name on every reload. TensorBoard is a child process here, never imported.
"""

from __future__ import annotations

import importlib.util
import posixpath
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from vmrun.errors import VmrunError
from vmrun.reporting import QUIET, Reporter
from vmrun.runs.outputs import RunLocation, local_run_dir, resolve_what
from vmrun.runs.tensorboard import EVENTS, PORT_LINE, RELOAD_S, LogDir
from vmrun.ssh.connection import Connection
from vmrun.ssh.forward import bind_free
from vmrun.transfer.types import FetchSpec


def fetch_specs(location: RunLocation, dirs: Sequence[LogDir]) -> list[FetchSpec]:
    """What to fetch: the run's own folder as `vmrun fetch metrics` does, the others' event
    files into a folder each under results/<run-id>/."""
    local = local_run_dir(location.run_id, None)
    specs: list[FetchSpec] = []
    for d in dirs:
        if d.own:
            specs += resolve_what("metrics", location)
        else:
            target = posixpath.join(local, d.name)
            specs.append(FetchSpec(remote=d.path, local=target, select=(EVENTS,), label=d.path))
    return specs


def tensorboard_here() -> bool:
    """Whether this interpreter can run TensorBoard (found, not imported)."""
    return importlib.util.find_spec("tensorboard") is not None


class LocalBoard:
    """Fetch rounds from one host into `dest`, and a local TensorBoard serving them."""

    def __init__(
        self,
        conn: Connection,
        specs: Sequence[FetchSpec],
        dest: Path,
        logdir: Path,
        *,
        every: float,
        out: Reporter = QUIET,
    ):
        self.conn = conn
        self.specs = list(specs)
        self.dest = dest
        self.logdir = logdir
        self.every = every
        self.out = out
        self.fetched = 0  # event and metrics files fetched so far
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._tail: deque[str] = deque(maxlen=20)
        self._failure = ""

    def fetch_round(self) -> int:
        """One round: fetch what is new; how many files came (a failure is said, not raised)."""
        from vmrun.transfer.download import download
        from vmrun.transfer.types import Options

        try:
            report = download(self.conn, self.specs, self.dest, Options())
        except VmrunError as exc:
            if exc.message != self._failure:
                self._failure = exc.message
                self.out.info(f"fetching failed: {exc.one_line()}; serving what is here")
            return 0
        self._failure = ""
        for path, why in report.failed.items():
            self.out.info(f"{path}: {why} (next round tries again)")
        self.fetched += len(report.fetched)
        return len(report.fetched)

    def start(self, wanted: int, timeout: float = 120.0) -> int:
        """The first round, TensorBoard started on 127.0.0.1 (the wanted port or the next
        free one), the later rounds in a thread; its port once it listens."""
        self.fetch_round()
        self.logdir.mkdir(parents=True, exist_ok=True)
        with bind_free(wanted) as probe:
            port = probe.getsockname()[1]
        argv = [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(self.logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast=false",
            "--reload_interval",
            str(RELOAD_S),
        ]
        from vmrun.runs.local import die_with_vmrun

        self.proc = subprocess.Popen(  # in vmrun's process group: a closed terminal ends it too
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_vmrun,  # and a vmrun killed by SIGKILL
        )
        ready = threading.Event()
        threading.Thread(target=self._read, args=(ready,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.1):
            self.check()
            if time.monotonic() > deadline:
                self.stop()
                raise VmrunError(f"TensorBoard here did not start within {timeout:g} s")
        threading.Thread(target=self._rounds, daemon=True, name="vmrun-tb-fetch").start()
        return port

    def wait(self, timeout: float) -> bool:
        """Block until stopped (True) or `timeout` passes (False)."""
        return self._stop.wait(timeout)

    def check(self) -> None:
        """Raise if TensorBoard here has ended."""
        if self.proc is not None and self.proc.poll() is not None:
            last = f": {self._tail[-1]}" if self._tail else ""
            raise VmrunError(f"TensorBoard here exited with {self.proc.returncode}{last}")

    def stop(self) -> None:
        """Stop fetching and end TensorBoard (TERM, then KILL after 5 s)."""
        self._stop.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _read(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            if PORT_LINE.search(line):
                ready.set()
            elif line.strip():
                self._tail.append(line.decode("utf-8", "replace").strip())

    def _rounds(self) -> None:
        while not self._stop.wait(self.every):
            got = self.fetch_round()
            if got and not self._stop.is_set():
                self.out.info(f"fetched {got} new file(s)")
