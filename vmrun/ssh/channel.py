"""Commands over an open connection: one SSH channel per command, streamed, with its exit
status told apart from a lost connection.

`Channels` holds this half of `Connection` (the other half, opening, is in
`vmrun.ssh.connection`): it needs only a live transport and a way to name the loss.
"""

from __future__ import annotations

import abc
import contextlib
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from vmrun.config import Settings
from vmrun.errors import CommandFailed, ConnectionLostError, ExitCode, RemoteError, UsageError
from vmrun.ssh import quoting
from vmrun.ssh.result import CommandResult, Tail

if TYPE_CHECKING:
    import paramiko

_LOCKS = threading.Lock()  # makes each connection's install lock
# (stream, line) where stream is "out" or "err" and line keeps its b"\n" when it had one.
OutputCallback = Callable[[str, bytes], None]


class Channels(abc.ABC):
    """Running commands on a host; the subclass supplies the transport."""

    label: str
    settings: Settings
    # this host's copy of vmrun's host-side files is known to be in place (vmrun.ssh.hostlib):
    # until then each command goes under the guard that checks it in the same round trip
    lib_ready: bool = False

    @property
    @abc.abstractmethod
    def transport(self) -> paramiko.Transport:
        """A live transport (opened on first use), or ConnectionLostError."""

    @abc.abstractmethod
    def _lost_error(self, doing: str) -> ConnectionLostError:
        """The error for a connection that went away while `doing` something."""

    def open_session(self) -> paramiko.Channel:
        import paramiko

        transport = self.transport
        try:
            return transport.open_session(timeout=self.settings.connect_timeout)
        except paramiko.ChannelException as exc:
            raise RemoteError(
                f"the host refused a new session ({exc.text})",
                host=self.label,
                hint="raise MaxSessions in the host's sshd_config",
            ) from None
        except (paramiko.SSHException, EOFError, OSError):
            raise self._lost_error("while opening a session") from None

    def run(
        self,
        argv: Iterable[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        check: bool = False,
        on_output: OutputCallback | None = None,
        heartbeat: float | None = None,
        what: str | None = None,
        activity: bool = True,
    ) -> CommandResult:
        """Run argv on the host; stream lines to `on_output`; return a CommandResult.
        `what` names it in messages (a lost connection, a timeout, a failure): the vmrun
        operation it is a step of; by default `describe(argv)`.

        The command runs under `quoting.remote_command`'s wrapper: env arrives over stdin,
        and the command's process group is killed if this channel goes away, or, with
        `heartbeat`, once the host has heard nothing from here for that many seconds (for
        endless commands, so that even a client gone during a link cut leaves nothing).
        `activity`: False for what only looks, which must not keep an autostop host up.
        """
        argv = tuple(argv)
        try:
            command = quoting.remote_command(argv, cwd=cwd, heartbeat=heartbeat, activity=activity)
            header = quoting.env_header(env)
        except ValueError as exc:
            raise UsageError(str(exc), host=self.label) from None
        what = what or describe(argv)
        guarded = not self.lib_ready
        if guarded:
            from vmrun.ssh import hostlib

            command = hostlib.guard(command)
            if on_output is not None:
                on_output = _hide_stale(on_output)
        started = time.monotonic()
        out, err = Tail(), Tail()
        chan = self.open_session()
        try:
            try:
                start(chan, command)
                chan.sendall(header)
            except Exception:
                # the guard, finding the host's files stale, ends without reading the
                # input: a send cut short by its end is its answer, read below
                if not (guarded and chan.exit_status_ready()):
                    raise self._lost_error(f"while starting {what}") from None
            status = self._pump(chan, what, out, err, on_output, timeout, started, heartbeat)
        finally:
            chan.close()
        if guarded and self._lib_installed(status, err.text()):
            return self.run(
                argv,
                env=env,
                cwd=cwd,
                timeout=timeout,
                check=check,
                on_output=on_output,
                heartbeat=heartbeat,
                what=what,
                activity=activity,
            )
        result = CommandResult(
            host=self.label,
            argv=argv,
            exit_status=status,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            duration=time.monotonic() - started,
        )
        if check and not result.ok:
            raise command_failed(result, what)
        return result

    def _pump(
        self,
        chan: paramiko.Channel,
        what: str,
        out: Tail,
        err: Tail,
        on_output: OutputCallback | None,
        timeout: float | None,
        started: float,
        heartbeat: float | None = None,
    ) -> int:
        import paramiko  # loaded already: this connection is open

        partial = {"out": b"", "err": b""}
        beat_due = [started]  # a line every quarter of `heartbeat`: three may be lost

        def deliver(stream: str, data: bytes) -> None:
            (out if stream == "out" else err).feed(data)
            if on_output is None:
                return
            buf = partial[stream] + data
            *lines, partial[stream] = buf.split(b"\n")
            for line in lines:
                on_output(stream, line + b"\n")

        def tick() -> None:
            now = time.monotonic()
            if heartbeat is not None and now >= beat_due[0]:
                beat_due[0] = now + heartbeat / 4
                with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                    chan.send(b"\n")  # a dead link is drain's to report, not this
            if timeout is not None and now - started > timeout:
                raise CommandFailed(
                    f"{what} timed out after {timeout:g} s and was stopped",
                    host=self.label,
                    exit_status=int(ExitCode.TIMEOUT),
                    output_tail=err.text() or out.text(),
                    code="timeout",
                )

        status = self.drain(chan, deliver, f"while running {what}", tick)
        if on_output is not None:
            for stream in ("out", "err"):
                if partial[stream]:
                    on_output(stream, partial[stream])
        return status

    def drain(
        self,
        chan: paramiko.Channel,
        deliver: Callable[[str, bytes], None],
        doing: str,
        tick: Callable[[], None] | None = None,
    ) -> int:
        """Read stdout and stderr until the command ends; the one place that tells an exit
        status from a lost connection. `tick` runs between waits (deadlines)."""
        while True:
            got = False
            while chan.recv_ready():
                deliver("out", chan.recv(65536))
                got = True
            while chan.recv_stderr_ready():
                deliver("err", chan.recv_stderr(65536))
                got = True
            if got:
                continue
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                break
            if chan.closed or not chan.get_transport().is_active():
                if chan.exit_status_ready():
                    break
                raise self._lost_error(doing)
            if tick is not None:
                tick()
            select.select([chan], [], [], 0.5)
        status = chan.recv_exit_status()
        if status < 0 and not chan.get_transport().is_active():
            # paramiko marks a channel "exited" when its transport dies; no status came.
            raise self._lost_error(doing)
        return status if 0 <= status < 256 else 255  # -1: killed by a signal

    def capture(
        self, command: str, *, stdin: bytes = b"", what: str = "a command"
    ) -> tuple[int, bytes, str]:
        """Run a raw command string (no wrapper; stdin is sent, then closed) and keep all of
        its stdout: for listings and byte streams that `run`'s tails would cut."""
        if stdin:
            self.ensure_lib()  # a guard that runs nothing would leave stdin unread
        if self.lib_ready:
            return self._capture(command, stdin, what)
        from vmrun.ssh import hostlib

        status, out, err = self._capture(hostlib.guard(command), b"", what)
        if self._lib_installed(status, err):
            return self._capture(command, stdin, what)
        return status, out, err

    def ensure_lib(self) -> None:
        """Make sure vmrun's host-side files are in place before a command that does not go
        through `run` or `capture` (a stream, a forward): one round trip, on a connection
        that has run nothing yet."""
        if not self.lib_ready:
            from vmrun.ssh import hostlib

            what = "checking vmrun's host-side files"
            status, _out, err = self._capture(hostlib.guard("true"), b"", what)
            self._lib_installed(status, err)

    def _lib_installed(self, status: int, stderr: str) -> bool:
        """After a guarded command: True if it ran nothing because files were stale, which
        are then sent (so the caller runs it again); either way the host's copy is now in
        place."""
        from vmrun.ssh import hostlib

        files = hostlib.stale(status, stderr)
        if files is not None:
            with self._lib_lock():  # commands started at once found it stale together
                if not self.lib_ready:
                    self._install_lib(files)
                    self.lib_ready = True
        self.lib_ready = True
        return files is not None

    def _lib_lock(self) -> threading.Lock:
        with _LOCKS:
            lock: threading.Lock | None = self.__dict__.get("_lib_install_lock")
            if lock is None:
                lock = self.__dict__["_lib_install_lock"] = threading.Lock()
        return lock

    def _install_lib(self, files: list[str]) -> None:
        from vmrun.ssh import hostlib

        what = "installing vmrun's host-side files"
        code, _out, err = self._capture(hostlib.install_command(), hostlib.bundle(files), what)
        if code != 0:
            last = err.strip().splitlines()[-1] if err.strip() else ""
            raise RemoteError(
                f"{what} in ~/{hostlib.lib_dir()} failed (exit {code})"
                + (f": {last}" if last else ""),
                host=self.label,
                hint="the host needs sh, tar, gzip, mktemp and sha256sum, and room in the home",
            )

    def _capture(self, command: str, stdin: bytes, what: str) -> tuple[int, bytes, str]:
        chan = self.open_session()
        out: list[bytes] = []
        err = Tail(16 * 1024)
        try:
            try:
                start(chan, command)
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
            except Exception:
                raise self._lost_error(f"while starting {what}") from None

            def deliver(stream: str, data: bytes) -> None:
                if stream == "out":
                    out.append(data)
                else:
                    err.feed(data)

            status = self.drain(chan, deliver, f"while running {what}")
        finally:
            chan.close()
        return status, b"".join(out), err.text()


def start(chan: paramiko.Channel, command: str) -> None:
    """Ask the host to run `command` on a new channel without waiting for its answer, so that
    what follows (stdin, the end of input) leaves in the same round trip, as OpenSSH's client
    does (paramiko's exec_command waits one round trip for it: 80 ms a command on a far
    host). A refused request closes the channel with no exit status: `drain` reports it."""
    import paramiko
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    transport: Any = chan.transport
    if chan.closed or chan.eof_sent or not chan.active or transport is None:
        raise paramiko.SSHException("Channel is not open")
    request = Message()
    request.add_byte(cMSG_CHANNEL_REQUEST)
    request.add_int(chan.remote_chanid)
    request.add_string("exec")
    request.add_boolean(True)
    request.add_string(command)
    transport._send_user_message(request)


def _hide_stale(on_output: OutputCallback) -> OutputCallback:
    """`on_output` less the guard's own line (a stale host copy: the command runs again)."""
    from vmrun.ssh.hostlib import STALE_MARK

    def deliver(stream: str, line: bytes) -> None:
        if not (stream == "err" and line.startswith(STALE_MARK.encode())):
            on_output(stream, line)

    return deliver


def describe(argv: tuple[str, ...]) -> str:
    """What a command is, in messages, when its caller did not say: the host-side file it
    runs (`sh ~/.vmrun/lib/<v>/run_list.sh ...`: 'run_list'), the name a script runs under
    (`sh -c SCRIPT NAME ...`: its $0), else the command line, cut short (the first word
    alone, `sh` for every script, told nothing)."""
    from vmrun.hostside import script_name

    name = script_name(argv)
    if name is not None:
        return repr(name)
    if len(argv) > 3 and argv[1] == "-c" and argv[3]:
        return repr(argv[3])
    return command_line(argv)


def run_for_output(
    conn: Channels, argv: Iterable[str], **options: Any
) -> tuple[CommandResult, str]:
    """`conn.run`, and its whole standard output (a result keeps only the last 64 KiB:
    `nvidia-smi -q` of eight GPUs, or many ranks' stacks, are longer)."""
    chunks: list[bytes] = []

    def keep(stream: str, data: bytes) -> None:
        if stream == "out":
            chunks.append(data)

    result = conn.run(argv, on_output=keep, **options)
    return result, b"".join(chunks).decode(errors="replace")


def command_line(argv: tuple[str, ...]) -> str:
    """A user's command as it is shown in messages: quoted, at most 60 characters."""
    line = quoting.join(argv)
    return repr(line if len(line) <= 60 else line[:57] + "...")


def command_failed(result: CommandResult, what: str | None = None) -> CommandFailed:
    tail = result.output_tail(5)
    detail = f": {tail.splitlines()[-1]}" if tail else ""
    return CommandFailed(
        f"{what or describe(result.argv)} exited with {result.exit_status}{detail}",
        host=result.host,
        exit_status=result.exit_status,
        output_tail=result.output_tail(),
    )
