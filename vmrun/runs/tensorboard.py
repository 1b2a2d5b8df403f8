"""A run's TensorBoard: which folders hold its event files, and TensorBoard on the host that
has them, alive exactly as long as the SSH channel that started it.

TensorBoard runs where the files are (the run's master node, or a cluster's login node over
the shared filesystem), with the run's own python, bound to the host's 127.0.0.1; vmrun
forwards to it over its connection (vmrun.ssh.forward). It is started under vmrun's command
wrapper with a heartbeat (vmrun/hostside/command_wrapper.sh), so Ctrl-C here, a vmrun
killed outright (its connection closes) or a link gone silent all end TensorBoard's whole
process group on the host: nothing is left running there.
"""

from __future__ import annotations

import contextlib
import posixpath
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError, VmrunError
from vmrun.results.record import RunRecord
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection

if TYPE_CHECKING:
    import paramiko

HEARTBEAT_S = 15.0  # the host stops TensorBoard this long after vmrun was last heard from
RELOAD_S = 5  # how often TensorBoard looks for new events
EVENTS = "events.out.tfevents.*"
AUTO_DIRS = ("runs", "lightning_logs")  # the default folders of SummaryWriter and Lightning
NO_TENSORBOARD, NO_PYTHON, NOTHING_TO_SERVE = 3, 4, 5  # tensorboard_serve.sh's exits
PORT_LINE = re.compile(rb"TensorBoard \S+ at http://[^\s/]+:(\d+)/")
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class LogDir:
    """A folder of event files on the host (relative to the home, or absolute)."""

    name: str  # its group in TensorBoard (and its folder under results/<run-id>/ here)
    path: str
    required: bool  # served even before it exists; otherwise only if it exists
    own: bool = False  # the run's own output folder (what `vmrun fetch metrics` brings)


def host_path(item: str, workdir: str) -> str:
    """A --logdir as the host sees it: relative to the run's work dir, `~/x` from the home
    (commands start there), or absolute."""
    item = item.strip()
    if not item or "\n" in item or "\x00" in item:
        raise UsageError(f"--logdir {item!r}: expected a folder on the host")
    if item.startswith("/"):
        return posixpath.normpath(item)
    if item == "~" or item.startswith("~/"):
        return posixpath.normpath(item[2:] or ".")
    if item.startswith("~"):
        raise UsageError(f"--logdir {item}: ~user paths are not supported; give the full path")
    return posixpath.normpath(posixpath.join(workdir or ".", item))


def log_dirs(record: RunRecord, out_dir: str, extra: Sequence[str] = ()) -> list[LogDir]:
    """The folders to serve for a run: its output folder (a template's results/<run-id>; a
    script's outputs are its work dir, too wide to walk, so not that), `runs/` and
    `lightning_logs/` of its work dir when they exist, and every --logdir."""
    workdir = record.launch.workdir or (record.job.code_dir if record.job else "")
    workdir = posixpath.normpath(workdir) if workdir else ""
    template = record.template
    found: list[LogDir] = []
    if out_dir and out_dir != workdir:
        found.append(LogDir(posixpath.basename(out_dir), out_dir, template, own=True))
    if workdir:
        found += [LogDir(name, f"{workdir}/{name}", False) for name in AUTO_DIRS]
    found += [
        LogDir(posixpath.basename(p.rstrip("/")) or "logdir", p, True)
        for p in (host_path(item, workdir) for item in extra)
    ]
    kept = _distinct(found)
    if len(kept) > 1:
        for d in kept:
            if "," in d.path:
                raise UsageError(
                    f"TensorBoard cannot serve {d.path!r} beside other folders (a comma in"
                    " the path)",
                    hint="give only that folder: --logdir",
                )
    return _named(kept)


def _distinct(found: Sequence[LogDir]) -> list[LogDir]:
    """Each folder once (required if any mention is), and none inside a folder that is
    always served (TensorBoard would show its runs twice)."""
    merged: dict[str, LogDir] = {}
    for d in found:
        seen = merged.get(d.path)
        if seen is None:
            merged[d.path] = d
        else:
            merged[d.path] = LogDir(
                seen.name, d.path, seen.required or d.required, seen.own or d.own
            )
    always = [d.path for d in merged.values() if d.required]
    return [
        d
        for d in merged.values()
        if not any(d.path.startswith(top.rstrip("/") + "/") for top in always)
    ]


def _named(dirs: Sequence[LogDir]) -> list[LogDir]:
    """Names TensorBoard and a local folder both take (no `:` or `,`), each used once."""
    named: list[LogDir] = []
    used: set[str] = set()
    for d in dirs:
        base = _NAME.sub("-", d.name).strip("-.") or "logdir"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        named.append(LogDir(name, d.path, d.required, d.own))
    return named


class HostBoard:
    """TensorBoard on one host for as long as this object's channel lives."""

    def __init__(
        self,
        conn: Connection,
        python: str,
        dirs: Sequence[LogDir],
        *,
        fix: str = "",
        reload: int = RELOAD_S,
        beat: float = HEARTBEAT_S,
    ):
        self.conn = conn
        self.python = python
        self.dirs = list(dirs)
        self.fix = fix  # how to install tensorboard there, for the message that it is missing
        self.reload = reload
        self.beat = beat
        self.port: int | None = None
        self.served: list[tuple[str, str]] = []  # (name, folder) as the host found them
        self.status: int | None = None
        self.error: VmrunError | None = None
        self._tail: deque[str] = deque(maxlen=20)
        self._ready = threading.Event()
        self._done = threading.Event()
        self._chan: paramiko.Channel | None = None

    def argv(self) -> list[str]:
        words = [w for d in self.dirs for w in ("need" if d.required else "may", d.name, d.path)]
        return [*hostside.command("tensorboard_serve.sh"), self.python, str(self.reload), *words]

    def start(self, timeout: float = 120.0) -> int:
        """Start it and return its port on the host, once TensorBoard listens there."""
        command = quoting.remote_command(self.argv(), heartbeat=self.beat)
        self.conn.ensure_lib()
        chan = self._chan = self.conn.open_session()
        try:
            chan.exec_command(command)
            chan.sendall(quoting.env_header(None))
        except Exception:
            chan.close()
            raise self.conn._lost_error("while starting TensorBoard") from None
        threading.Thread(target=self._drain, daemon=True, name="vmrun-tensorboard").start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self._done.is_set():
                self.check()
            if time.monotonic() > deadline:
                self.stop()
                raise RemoteError(
                    f"TensorBoard did not start within {timeout:g} s{self._last()}",
                    host=self.conn.label,
                    code="tensorboard-failed",
                )
        assert self.port is not None
        return self.port

    def ended(self, timeout: float = 0.0) -> bool:
        """Whether its channel has ended (waiting up to `timeout` for that)."""
        return self._done.wait(timeout)

    def check(self) -> None:
        """Raise why TensorBoard is gone, if it is."""
        if not self._done.is_set():
            return
        if self.error is not None:
            raise self.error
        raise self._ended_error()

    def stop(self, grace: float = 10.0) -> bool:
        """End TensorBoard there (EOF on the channel: the wrapper kills its process group)
        and wait, bounded, until it is gone; False if that could not be confirmed."""
        chan = self._chan
        if chan is None:
            return True
        if not self._done.is_set():
            with contextlib.suppress(Exception):
                chan.shutdown_write()
        ended = self._done.wait(grace)
        chan.close()
        return ended and self.error is None

    # -- the channel ---------------------------------------------------------------------------

    def _drain(self) -> None:
        import paramiko

        chan = self._chan
        assert chan is not None
        partial = {"out": b"", "err": b""}
        beat_due = [time.monotonic()]

        def deliver(stream: str, data: bytes) -> None:
            *lines, partial[stream] = (partial[stream] + data).split(b"\n")
            for line in lines:
                self._line(stream, line)

        def tick() -> None:  # a line every quarter of the heartbeat: three may be lost
            if time.monotonic() >= beat_due[0] and not chan.eof_sent:
                beat_due[0] = time.monotonic() + self.beat / 4
                with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                    chan.send(b"\n")

        try:
            self.status = self.conn.drain(chan, deliver, "while serving TensorBoard", tick)
        except VmrunError as exc:
            self.error = exc
        finally:
            chan.close()
            self._done.set()

    def _line(self, stream: str, line: bytes) -> None:
        if stream == "out" and line.startswith(b"vmrun-serving "):
            name, _, folder = line.decode("utf-8", "replace")[14:].partition(" ")
            self.served.append((name, folder))
            return
        found = PORT_LINE.search(line)
        if found and self.port is None:
            self.port = int(found.group(1))
            self._ready.set()
        elif line.strip():
            self._tail.append(line.decode("utf-8", "replace").strip())

    def _last(self) -> str:
        return f": {self._tail[-1]}" if self._tail else ""

    def _ended_error(self) -> VmrunError:
        host = self.conn.label
        if self.status == NO_TENSORBOARD:
            return RemoteError(
                f"{self.python} there has no tensorboard",
                host=host,
                hint=self.fix or None,
                code="tensorboard-failed",
            )
        if self.status == NO_PYTHON:
            return RemoteError(
                f"the run's python {self.python} is not there", host=host, code="tensorboard-failed"
            )
        if self.status == NOTHING_TO_SERVE:
            looked = ", ".join(d.path for d in self.dirs) or "no folder"
            return RemoteError(
                f"no TensorBoard logs there yet (looked in {looked})",
                host=host,
                hint="name the folder the run writes them to with --logdir DIR",
                code="tensorboard-failed",
            )
        return RemoteError(
            f"TensorBoard exited with {self.status}{self._last()}",
            host=host,
            code="tensorboard-failed",
        )
