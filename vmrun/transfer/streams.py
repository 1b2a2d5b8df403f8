"""Raw byte streams to and from a remote command: OpenSSH's `ssh` or a paramiko channel.

Control commands (listings, checksums) run on vmrun's open paramiko connection, one round
trip each, via `capture`. Bulk data runs through an `Engine`: `OpenSshEngine` starts the
`ssh` binary (same host-key policy, see vmrun.ssh.openssh) and moves bytes from its pipe into
files with splice(2), so the data never passes through Python; `ParamikoEngine` is the
fallback with no `ssh` binary, and the faster choice on far-away hosts (its 16 MiB channel
window against OpenSSH's 2 MiB). Raw commands are quoted with `quoting.plain_command` and
run without the kill-on-disconnect wrapper: their stdin carries data, and when the stream
is dropped they die of SIGPIPE or finish on their own.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import select
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from vmrun.errors import ConnectionLostError, RemoteError
from vmrun.ssh.channel import start
from vmrun.ssh.connection import Connection
from vmrun.ssh.result import Tail
from vmrun.transfer.types import BIG_TRANSFER

if TYPE_CHECKING:
    import paramiko

CHUNK = 1 << 20
_READ_AHEAD = 256 * 1024
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Python >= 3.10 on Linux has the constant too)
_SSH_FAILED = 255

# Every OpenSSH child alive now, so an interrupted command can stop them by pid.
_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def stop_all_streams() -> None:
    """Kill every `ssh` child this process started that is still running (Ctrl-C path)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)


class Stream(Protocol):
    """A running remote command: its stdin, its stdout, and how it ended."""

    def send(self, data: bytes | bytearray | memoryview) -> None: ...
    def close_input(self) -> None: ...
    def read(self, size: int) -> bytes: ...
    def copy_to(self, fd: int, count: int, on_chunk: Callable[[int], None]) -> int: ...
    def finish(self) -> tuple[int, str]: ...
    def kill(self) -> None: ...


class Engine(Protocol):
    name: str

    def open(self, command: str) -> Stream: ...


def read_exact(stream: Stream, size: int) -> bytes:
    """Exactly `size` bytes, or fewer only at end of stream."""
    parts = []
    left = size
    while left:
        data = stream.read(left)
        if not data:
            break
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


class _ReadAhead:
    """Small reads (tar headers, small files) served from one big read."""

    def __init__(self, source: Callable[[int], bytes]):
        self.source = source
        self.buf = b""
        self.pos = 0

    def read(self, size: int) -> bytes:
        if self.pos >= len(self.buf):
            self.buf, self.pos = self.source(max(size, _READ_AHEAD)), 0
        data = self.buf[self.pos : self.pos + size]
        self.pos += len(data)
        return data

    def flush_to(self, fd: int, count: int) -> int:
        """Write up to `count` already-read bytes to fd; how many were written."""
        view = memoryview(self.buf)[self.pos : self.pos + count]
        done = len(view)
        while view:
            view = view[os.write(fd, view) :]
        self.pos += done
        return done


# -- OpenSSH ---------------------------------------------------------------------------


class OpenSshStream:
    def __init__(self, argv: list[str], label: str):
        self.label = label
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        )
        with _live_lock:
            _live.add(self.proc)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._out = self.proc.stdout.fileno()
        self._in = self.proc.stdin.fileno()
        for fd in (self._out, self._in):
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, _F_SETPIPE_SZ, CHUNK)
        self._err = Tail(16 * 1024)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()
        self._splice = hasattr(os, "splice")
        self._ahead = _ReadAhead(lambda n: os.read(self._out, n))

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while data := self.proc.stderr.read(65536):
            self._err.feed(data)

    def send(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._in, view) :]

    def close_input(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def read(self, size: int) -> bytes:
        return self._ahead.read(size)

    def copy_to(self, fd: int, count: int, on_chunk: Callable[[int], None]) -> int:
        """Move up to `count` bytes of stdout into `fd` (zero-copy with splice)."""
        done = self._ahead.flush_to(fd, count)
        if done:
            on_chunk(done)
        while done < count:
            want = min(CHUNK, count - done)
            if self._splice:
                try:
                    n = os.splice(self._out, fd, want)
                except OSError:
                    self._splice = False
                    continue
            else:
                data = os.read(self._out, want)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            if n == 0:
                break
            done += n
            on_chunk(n)
        return done

    def finish(self) -> tuple[int, str]:
        self.close_input()
        status = self.proc.wait()
        self._err_thread.join(timeout=5)
        with _live_lock:
            _live.discard(self.proc)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return status, self._err.text()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class OpenSshEngine:
    name = "openssh"

    def __init__(self, conn: Connection):
        from vmrun.ssh.openssh import ssh_argv

        conn.ensure_lib()  # its streams run vmrun's host-side files, over a connection of their own
        assert conn.target is not None
        self._argv = lambda command: ssh_argv(conn.target, conn.settings, command)  # type: ignore[arg-type]
        self.label = conn.label

    def open(self, command: str) -> OpenSshStream:
        return OpenSshStream(self._argv(command), self.label)


def ssh_command_for(conn: Connection, remote_command: str) -> list[str]:
    """The OpenSSH argv the engine would use (for benchmarks and debugging)."""
    from vmrun.ssh.openssh import ssh_argv

    conn.open()
    if conn.target is None:
        raise RemoteError("not connected", host=conn.label)
    return ssh_argv(conn.target, conn.settings, remote_command)


# -- paramiko --------------------------------------------------------------------------


class ParamikoStream:
    def __init__(self, conn: Connection, command: str):
        self.conn = conn
        self.chan: paramiko.Channel = conn.open_session()
        try:
            start(self.chan, command)
        except Exception:
            self.chan.close()
            raise lost(conn, "while starting a transfer") from None
        # paramiko's own buffer deletes from its front on every recv (slow for small reads)
        self._ahead = _ReadAhead(self.chan.recv)

    def send(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self.chan.sendall(bytes(data))
        except (OSError, EOFError):  # paramiko: EOFError once the transport is closed
            raise lost(self.conn, "while sending data") from None

    def close_input(self) -> None:
        with contextlib.suppress(Exception):
            self.chan.shutdown_write()

    def read(self, size: int) -> bytes:
        return self._ahead.read(size)

    def copy_to(self, fd: int, count: int, on_chunk: Callable[[int], None]) -> int:
        done = self._ahead.flush_to(fd, count)
        if done:
            on_chunk(done)
        while done < count:
            data = self.chan.recv(min(CHUNK, count - done))
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            done += len(data)
            on_chunk(len(data))
        return done

    def finish(self) -> tuple[int, str]:
        self.close_input()
        err = Tail(16 * 1024)
        while True:
            while self.chan.recv_stderr_ready():
                err.feed(self.chan.recv_stderr(65536))
            if self.chan.exit_status_ready():
                break
            if self.chan.closed or not self.chan.get_transport().is_active():
                break
            select.select([self.chan], [], [], 0.2)
        while self.chan.recv_stderr_ready():
            err.feed(self.chan.recv_stderr(65536))
        status = self.chan.recv_exit_status() if self.chan.exit_status_ready() else -1
        self.chan.close()
        return (status if 0 <= status < 256 else _SSH_FAILED), err.text()

    def kill(self) -> None:
        self.chan.close()


class ParamikoEngine:
    name = "paramiko"

    def __init__(self, conn: Connection):
        self.conn = conn
        conn.ensure_lib()  # its streams run vmrun's host-side files

    def open(self, command: str) -> ParamikoStream:
        return ParamikoStream(self.conn, command)


# -- control commands ------------------------------------------------------------------


def lost(conn: Connection, doing: str) -> ConnectionLostError:
    return ConnectionLostError(
        f"connection lost {doing}",
        host=conn.label,
        hint="check the host and the network, then run the same command again (it resumes)",
    )


def capture(
    conn: Connection, command: str, *, stdin: bytes = b"", what: str = "a command"
) -> tuple[int, bytes, str]:
    """Run a raw command on the open connection: (exit status, stdout bytes, stderr text)."""
    try:
        return conn.capture(command, stdin=stdin, what=what)
    except ConnectionLostError as exc:
        raise lost(conn, exc.message.removeprefix("connection lost ")) from None


def measure_rtt(conn: Connection, samples: int = 3) -> float:
    """The best of a few SSH-level round trips (keepalive requests), in seconds; one is
    enough when it is already far beyond FAR_RTT (what it decides does not hang on a few
    milliseconds there)."""
    transport = conn.transport
    best = float("inf")
    for _ in range(samples):
        started = time.perf_counter()
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:
            raise lost(conn, "while measuring the round-trip time") from None
        best = min(best, time.perf_counter() - started)
        if best > 4 * FAR_RTT:
            break
    return best


def relayed(conn: Connection) -> bool:
    """The connection reaches its host through a ProxyJump or ProxyCommand."""
    conn.open()
    target = conn.target
    return target is not None and bool(target.proxy_jump or target.proxy_command)


def shares_a_jump(conn: Connection) -> bool:
    """Reached through a jump host in a command that works on several hosts: each OpenSSH
    process would log in to the jump host anew, and 16 at once pass its sshd's MaxStartups
    (10 by default), which drops the rest; vmrun's own connections share one login there
    (vmrun.ssh.jumps), so the bytes go over them instead."""
    return conn.fan_out > 1 and relayed(conn)


def choose_engine(
    conn: Connection, *, wanted: str, nbytes: int, rtt: float | None = None
) -> Engine:
    """`auto` picks by the measured path and the size (benchmarks/transfer.py's docstring):

    - direct and near (RTT < FAR_RTT): OpenSSH's client from BIG_TRANSFER bytes (1.5x
      paramiko's rate; its ~0.2 s connect pays off from about 128 MiB), else paramiko's open
      connection (no second handshake);
    - direct and far: paramiko (its 16 MiB window beats OpenSSH's 2 MiB one);
    - through a jump host or ProxyCommand: OpenSSH from RELAYED_TRANSFER bytes while the RTT
      is under RELAYED_FAR_RTT: paramiko relays in this process, every byte decrypted twice
      in Python (23 MB/s against OpenSSH's 35 MB/s on a 50 MiB fetch); but never when the
      command works on several hosts (`shares_a_jump`).

    `rtt`, when the caller measured it already, saves measuring it again.
    """
    from vmrun.ssh.openssh import ssh_binary

    if wanted == "paramiko":
        return ParamikoEngine(conn)
    if wanted == "openssh":
        if ssh_binary() is None:
            raise RemoteError("VMRUN_TRANSFER_ENGINE=openssh but no `ssh` binary on PATH")
        return OpenSshEngine(conn)
    if ssh_binary() is None:
        return ParamikoEngine(conn)
    if relayed(conn):
        if shares_a_jump(conn):
            return ParamikoEngine(conn)
        if nbytes >= RELAYED_TRANSFER and (rtt or measure_rtt(conn)) < RELAYED_FAR_RTT:
            return OpenSshEngine(conn)
        return ParamikoEngine(conn)
    if nbytes >= BIG_TRANSFER and (rtt or measure_rtt(conn)) < FAR_RTT:
        return OpenSshEngine(conn)
    return ParamikoEngine(conn)


def plan_streams(
    conn: Connection, *, wanted: str, nbytes: int, streams: int = 0
) -> tuple[Engine, int]:
    """The engine and how many streams to run at once for `nbytes` of big files.

    One SSH channel carries at most its window per round trip (sshd's and OpenSSH's 2 MiB:
    88 MB/s at 20 ms, 22 MB/s at 80 ms), so a far host gets one stream per STREAM_RTT of
    round trip, each over an OpenSSH connection of its own (its own process: the ciphers
    run on several cores), as many as the host's MaxStartups lets start at once, at most
    MAX_STREAMS. Without an `ssh` binary (or with VMRUN_TRANSFER_ENGINE=paramiko) one
    stream: several paramiko channels on one connection twice ended without an exit status
    in benchmarks/push.py (512 MiB at 20 ms, 1 GiB at 80 ms; cause not found, never in a
    test), so they run (as many as MaxSessions allows) only when `streams`
    (VMRUN_TRANSFER_STREAMS) asks for a number.
    """
    from vmrun.ssh.openssh import ssh_binary

    if streams <= 0 and nbytes < PARALLEL_BYTES:
        return choose_engine(conn, wanted=wanted, nbytes=nbytes), 1
    several = wanted == "openssh" or (
        wanted == "auto" and ssh_binary() is not None and not shares_a_jump(conn)
    )
    if streams > 0:
        engine = choose_engine(conn, wanted="openssh" if several else "paramiko", nbytes=nbytes)
        if not several:
            streams = min(streams, server_limits(conn)[1] - 1)  # channels: MaxSessions
        return engine, max(1, min(streams, MAX_STREAMS))
    rtt, limits = link_facts(conn)
    if rtt < FAR_RTT or not several:  # paramiko's channels on one connection: see above
        return choose_engine(conn, wanted=wanted, nbytes=nbytes, rtt=rtt), 1
    engine = choose_engine(conn, wanted="openssh", nbytes=nbytes)
    startups, _sessions = limits or (10, 10)
    room = startups - 2
    want = math.ceil(rtt / STREAM_RTT)
    return engine, max(1, min(want, room, MAX_STREAMS))


class _LinkFacts(threading.Thread):
    """The round trip and sshd's limits of one connection, asked at once in the background."""

    def __init__(self, conn: Connection) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.rtt: float | None = None
        self.limits: tuple[int, int] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        reader = threading.Thread(target=self._limits, daemon=True)
        reader.start()
        try:
            self.rtt = measure_rtt(self.conn)
        except BaseException as exc:  # handed to the caller in link_facts
            self.error = exc
        reader.join()

    def _limits(self) -> None:
        with contextlib.suppress(Exception):  # sshd's defaults then
            self.limits = server_limits(self.conn)


_ASKED: weakref.WeakKeyDictionary[Connection, _LinkFacts] = weakref.WeakKeyDictionary()


def prefetch_link_facts(conn: Connection) -> None:
    """Start asking the round trip and sshd's limits now (a push with big files does while
    it lists the host's folder and checks its disk), so that planning its streams finds
    them answered instead of spending its own round trips on them (at 80 ms: ~0.2 s)."""
    if conn not in _ASKED:
        asked = _ASKED[conn] = _LinkFacts(conn)
        asked.start()


def link_facts(conn: Connection) -> tuple[float, tuple[int, int] | None]:
    """The round trip and sshd's limits (None: not read), asked earlier or now."""
    asked = _ASKED.pop(conn, None)
    if asked is None:
        asked = _LinkFacts(conn)
        asked.start()
    asked.join()
    if asked.error is not None or asked.rtt is None:
        raise asked.error or lost(conn, "while measuring the round-trip time")
    return asked.rtt, asked.limits


def server_limits(conn: Connection) -> tuple[int, int]:
    """(MaxStartups' first number, MaxSessions) of the host's sshd, as far as it shows them."""
    from vmrun import hostside
    from vmrun.ssh import quoting

    command = quoting.plain_command(hostside.command("transfer_limits.sh"))
    status, out, _err = capture(conn, command, what="reading sshd's limits")
    words = out.split()
    if status != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
        return 10, 10  # sshd's defaults
    return int(words[0]), int(words[1])


FAR_RTT = 0.005
RELAYED_TRANSFER = 32 << 20  # the two engines are even here through a jump (1.4-1.6 s)
RELAYED_FAR_RTT = 0.05  # OpenSSH's 2 MiB window: 40 MB/s at 50 ms, paramiko's relay ceiling
PARALLEL_BYTES = 64 << 20  # files this big are cut into ranges (vmrun.transfer.records.RANGED)
STREAM_RTT = 0.005  # one more stream for every this much round trip
MAX_STREAMS = 8
