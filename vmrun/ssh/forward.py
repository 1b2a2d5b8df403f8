"""A local port forward (what `ssh -L` does) over a connection vmrun already has open.

Each browser connection to 127.0.0.1:PORT here becomes a `direct-tcpip` channel of the
same SSH transport, which the host's sshd connects to DEST:PORT as the host sees it (its
own 127.0.0.1, or a machine it reaches: a compute node behind a login node). So nothing is
opened on the host's firewall, no second login is made (ProxyJump chains included: the
transport is the one `Connection` dialled), and the connection's watchdog, whose keepalive
probes keep idle links alive through NATs, also decides when the link is gone. A lost link
ends the forward with that error; stopping closes the listener and every channel.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vmrun.errors import ConnectionLostError, UsageError
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.connection import Connection

if TYPE_CHECKING:
    import paramiko

LOOPBACK = "127.0.0.1"  # browsers here only: never a port others on the network can reach
PORT_SEARCH = 100  # how far past a busy port to look for a free one
_CHUNK = 65536
_POLL_S = 0.5
HOLD_BEAT_S = 15.0  # the holder ends this long after vmrun was last heard from (as TensorBoard)


def parse_ports(text: str) -> tuple[int | None, int]:
    """`PORT` or `LOCAL:PORT` (as `ssh -L` and `kubectl port-forward` take them): the local
    port asked for (None: PORT, or the next free one) and the port to reach."""
    local, sep, remote = text.strip().rpartition(":")
    ports = [_port(word, text) for word in ((local, remote) if sep else (remote,))]
    return (ports[0], ports[1]) if sep else (None, ports[0])


def _port(word: str, text: str) -> int:
    word = word.strip()
    value = int(word) if word.isascii() and word.isdigit() else 0
    if not 1 <= value <= 65535:
        raise UsageError(
            f"port {text!r}: give PORT or LOCAL:PORT, each a number from 1 to 65535"
            " (e.g. 8888 or 8888:8889)"
        )
    return value


def bind_free(wanted: int, *, search: int = PORT_SEARCH) -> socket.socket:
    """A socket listening on 127.0.0.1 at `wanted`, or at the next free port after it
    (0: any free port); `search` 1: that port or a UsageError."""
    last: OSError | None = None
    ports = [0] if wanted == 0 else range(wanted, min(wanted + search, 65536))
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not TIME_WAIT's
        try:
            sock.bind((LOOPBACK, port))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise
            last = exc
            continue
        return sock
    if search == 1:
        raise UsageError(
            f"local port {wanted} is in use ({last})",
            hint="pick another LOCAL in LOCAL:PORT, or give PORT alone for the next free one",
            code="port-busy",
        )
    raise UsageError(
        f"no free local port from {wanted} to {wanted + search - 1} ({last})",
        hint="pick another with --local-port/--port",
        code="port-busy",
    )


def moved_line(wanted: int, port: int) -> str | None:
    """The one line that says a busy port was replaced, or None when it was not."""
    if wanted and port != wanted:
        return f"local port {wanted} is in use; using {port}"
    return None


class Forward:
    """127.0.0.1:`port` here -> `dest` as the host sees it, over `conn`'s transport."""

    def __init__(
        self,
        conn: Connection,
        dest_host: str,
        dest_port: int,
        *,
        local_port: int,
        exact: bool = False,
    ):
        self.conn = conn
        self.dest = (dest_host, dest_port)
        self.wanted = local_port
        self.exact = exact  # the user named the local port: that one, or an error
        self.port = 0
        self.connections = 0  # accepted so far
        self.refused = 0  # of those, how many the destination refused
        self._listener: socket.socket | None = None
        self._transport: paramiko.Transport | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: set[object] = set()  # live sockets and channels, closed on stop
        self._threads: list[threading.Thread] = []
        self._lost: ConnectionLostError | None = None
        self._out: Reporter = QUIET
        self._holder: paramiko.Channel | None = None  # see _hold

    @property
    def where(self) -> str:
        """The destination in words: `h1's 127.0.0.1:6006`."""
        return f"{self.conn.label}'s {self.dest[0]}:{self.dest[1]}"

    def start(self, out: Reporter = QUIET) -> Forward:
        """Listen here (the wanted port, or the next free one unless `exact`) and start
        accepting; `out` hears about connections the destination refuses (nothing listening
        there yet)."""
        self._transport = self.conn.transport  # opens the connection, or raises its error
        self._out = out
        self._listener = bind_free(self.wanted, search=1 if self.exact else PORT_SEARCH)
        self.port = self._listener.getsockname()[1]
        self._hold()
        self._spawn(self._accept_loop, "vmrun-forward")
        return self

    def _hold(self) -> None:
        """A wrapped command that only waits, for as long as the forward lasts: the host's
        autostop counts it as vmrun's work (forwarded channels run nothing there). Stopping
        closes its channel, and the wrapper ends it. It hears a line every quarter of
        HOLD_BEAT_S, so a client that vanished (a closed laptop: no EOF ever comes) stops
        counting after HOLD_BEAT_S, not when sshd drops the dead TCP connection hours later.
        Forwarding goes on without it."""
        from vmrun.ssh import quoting

        with contextlib.suppress(Exception):
            self.conn.ensure_lib()
            chan = self.conn.open_session()
            self._track(chan)
            chan.exec_command(
                quoting.remote_command(
                    ["sh", "-c", "while sleep 3600; do :; done"], heartbeat=HOLD_BEAT_S
                )
            )
            chan.sendall(quoting.env_header(None))
            self._holder = chan
            self._spawn(self._beat, "vmrun-forward-beat", chan)

    def _beat(self, chan: paramiko.Channel) -> None:
        while not self._stop.wait(HOLD_BEAT_S / 4) and self._holder is chan:
            with contextlib.suppress(Exception):
                chan.send(b"\n")

    def _let_go(self, wait: float) -> None:
        """EOF to the waiting command, and a moment for its wrapper to end it and remove its
        marker (a channel closed at once can take the wrapper with it: a stale marker)."""
        chan, self._holder = self._holder, None
        if chan is not None:
            with contextlib.suppress(Exception):
                chan.shutdown_write()
                chan.status_event.wait(wait)

    def probe(self) -> bool:
        """Whether the destination accepts a connection now (one channel, closed at once)."""
        chan = self._channel(("127.0.0.1", 0))
        if chan is None:
            return False
        chan.close()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped (True) or `timeout` passes (False); a lost connection raises."""
        stopped = self._stop.wait(timeout)
        if self._lost is not None:
            raise self._lost
        return stopped

    def stop(self, timeout: float = 3.0) -> None:
        """Close the listener and every channel and socket; wait (bounded) for the pumps."""
        self._stop.set()
        self._let_go(min(1.0, timeout))
        if self._listener is not None:
            with contextlib.suppress(OSError):  # shutdown: a select() in progress holds it
                self._listener.shutdown(socket.SHUT_RDWR)  # open past close(); not this
            self._listener.close()
        with self._lock:
            live = list(self._open)
            self._open.clear()
        for thing in live:
            with contextlib.suppress(Exception):
                thing.close()  # type: ignore[attr-defined]
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(timeout / max(1, len(self._threads)))

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the work ----------------------------------------------------------------------------

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._transport is not None
        while not self._stop.is_set():
            if not self._transport.is_active():
                self._lose()
                return
            try:
                ready, _, _ = select.select([self._listener], [], [], _POLL_S)
                if not ready:
                    continue
                sock, peer = self._listener.accept()
            except (OSError, ValueError):  # closed by stop()
                return
            self.connections += 1
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._track(sock)
            self._spawn(self._serve, "vmrun-forward-conn", sock, peer)

    def _lose(self) -> None:
        if not self._stop.is_set():
            self._lost = self.conn._lost_error(f"while forwarding port {self.port} to {self.where}")
            self.stop()

    def _track(self, thing: object) -> None:
        with self._lock:
            self._open.add(thing)

    def _release(self, *things: object) -> None:
        with self._lock:
            for thing in things:
                self._open.discard(thing)
        for thing in things:
            with contextlib.suppress(Exception):
                thing.close()  # type: ignore[attr-defined]

    def _channel(self, peer: tuple[str, int]) -> paramiko.Channel | None:
        """A channel to the destination; None when it refuses (nothing listens there)."""
        import paramiko

        assert self._transport is not None
        try:
            return self._transport.open_channel(
                "direct-tcpip", self.dest, peer, timeout=self.conn.settings.connect_timeout
            )
        except paramiko.ChannelException:
            return None
        except (paramiko.SSHException, EOFError, OSError):
            if not self._transport.is_active():
                self._lose()
            return None

    def _serve(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        chan = self._channel(peer)
        if chan is None:
            self._release(sock)
            if not self._stop.is_set():
                self.refused += 1
                if self.refused == 1 or self.refused % 100 == 0:
                    self._out.info(f"nothing answers at {self.where} (is the server running?)")
            return
        self._track(chan)
        try:
            _pump(sock, chan, self._stop)
        finally:
            self._release(sock, chan)


def _pump(sock: socket.socket, chan: paramiko.Channel, stop: threading.Event) -> None:
    """Bytes both ways until both sides have ended (a half-close is passed on) or `stop`."""
    readers: list[Any] = [sock, chan]
    while readers and not stop.is_set():
        try:
            ready, _, _ = select.select(readers, [], [], _POLL_S)
        except (OSError, ValueError):  # a side closed under us (stop)
            return
        if chan.closed and chan in readers and not chan.recv_ready():
            return
        for side in ready:
            try:
                if side is sock:
                    data = sock.recv(_CHUNK)
                    if data:
                        chan.sendall(data)
                    else:
                        chan.shutdown_write()
                        readers.remove(sock)
                else:
                    data = chan.recv(_CHUNK)
                    if data:
                        sock.sendall(data)
                    else:
                        sock.shutdown(socket.SHUT_WR)
                        readers.remove(chan)
            except (OSError, EOFError):
                return
            except Exception:  # paramiko's SSHException: the channel or link is gone
                return
