"""One SSH connection per host, opened once and reused for all the work of a command.

Built on paramiko directly, not Fabric (the layer over it), because Fabric's defaults are
wrong here: it auto-adds unknown host keys (AutoAddPolicy) and never loads known_hosts, sets
no TCP_NODELAY (3x slower handshakes), has no way to notice a link that went silent, and
imports invoke eagerly (slower start-up). This module opens connections: ~/.ssh/config,
ProxyJump chains, strict host keys, ssh-agent and keys, a connect timeout, and a watchdog
that declares the connection lost when the host stops answering liveness probes, so no call
hangs forever. Running commands over it is `vmrun.ssh.channel`'s part.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.config import Settings
from vmrun.errors import (
    AuthError,
    ConnectionLostError,
    HostKeyError,
    UnreachableError,
    UsageError,
    VmrunError,
)
from vmrun.ssh.channel import Channels
from vmrun.ssh.dial import Dial, tcp_connect, transport_factory
from vmrun.ssh.hosts import HostSpec, parse_host
from vmrun.ssh.jumps import Lease
from vmrun.ssh.sshconfig import Target, resolve
from vmrun.ssh.watchdog import Watchdog, answered

if TYPE_CHECKING:
    import paramiko

_MAX_JUMPS = 8
_REFUSED_TRIES = 12  # a handshake sshd dropped unanswered (MaxStartups), tried again ...
_REFUSED_BACKOFF_S = 0.05  # ... after 0.05, 0.1, 0.2 ... s, with jitter, ...
_REFUSED_BACKOFF_MAX_S = 1.0  # ... at most this long each; the waits are not connect_timeout's
_BANNER_FAILED = "Error reading SSH protocol banner"
# paramiko's words when it has no key and no agent to try: an auth problem, not a network one
_NO_KEYS = "No authentication methods available"
_AUTH_HINT = (
    "check the user name, add your public key to ~/.ssh/authorized_keys on the host, or set"
    " IdentityFile in ~/.ssh/config (`ssh-keygen` makes a key; `ssh-add` loads one into"
    " ssh-agent)"
)

logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


@dataclass(frozen=True)
class _Link:
    """An open connection's parts. Replaced whole, never edited, so a reader that took it
    under the lock holds a transport and the watchdog that speaks for that transport."""

    client: paramiko.SSHClient
    transport: paramiko.Transport
    watchdog: Watchdog
    jump: Lease | None  # the hold on a shared jump host's connection

    def close(self) -> None:
        self.watchdog.stopped.set()
        self.client.close()
        if self.jump is not None:
            self.jump.close()


class Connection(Channels):
    """A lazily opened, thread-safe SSH connection to one host."""

    def __init__(
        self,
        host: HostSpec | str,
        settings: Settings,
        *,
        label: str | None = None,
        via: tuple[HostSpec, ...] | None = None,
        _depth: int = 0,
    ):
        self.spec = parse_host(host) if isinstance(host, str) else host
        self.settings = settings
        self.label = label or self.spec.label
        self._via = via  # jump hosts forced by a longer ProxyJump chain
        self._depth = _depth
        self._lock = threading.Lock()
        self._link: _Link | None = None  # read and replaced only under _lock
        self._dial: Dial | None = None  # the dial under way, if any (also under _lock)
        self.target: Target | None = None
        self.fan_out = 1  # hosts the command works on (vmrun.ssh.group sets it)

    def open(self) -> Connection:
        self._current_link()
        return self

    def _current_link(self) -> _Link:
        """The open link, dialing it first if need be. The lock is held only to look and to
        install: the dial itself runs outside it, so close() never waits for one (it aborts
        it), and other threads wanting the link wait for that one dial's outcome."""
        while True:
            with self._lock:
                if self._link is not None:
                    return self._link
                dial, mine = self._dial, self._dial is None
                if mine:
                    dial = self._dial = Dial()
            assert dial is not None
            if not mine:
                dial.done.wait()
                if dial.error is not None:
                    raise dial.error
                continue
            try:
                link = self._connect(dial)
                with self._lock:
                    if self._dial is dial and dial.settle():
                        self._dial, self._link = None, link
                        return link
                link.close()  # closed (or out of time) just as it opened
                raise self._dial_error(dial, None)
            except BaseException as exc:
                with self._lock:
                    if self._dial is dial:
                        self._dial = None
                dial.error = exc
                raise
            finally:
                dial.done.set()

    @property
    def transport(self) -> paramiko.Transport:
        link = self._current_link()
        if not link.transport.is_active():
            raise _lost(self.label, link, "the connection is closed")
        return link.transport

    @property
    def broken(self) -> bool:
        """Opened once and lost since (a jump host's connection is then dialed anew)."""
        with self._lock:
            link = self._link
        return link is not None and not link.transport.is_active()

    def _lost_error(self, doing: str) -> ConnectionLostError:
        with self._lock:
            link = self._link
        return _lost(self.label, link, doing)

    def ping(self, timeout: float) -> None:
        """One keepalive answered by the host's sshd itself within `timeout` (dialing first
        if need be): no process is started there, so a loaded host still answers, and a
        paused or cut-off one does not (ConnectionLostError)."""
        transport = self.transport
        if not answered(transport, timeout) or not transport.is_active():
            raise self._lost_error(f"while asked for a keepalive ({timeout:g} s)")

    def lose(self, reason: str) -> None:
        """Declare it lost as its watchdog would (`reason` said by every command on it): a
        check of its own (vmrun.recovery.heartbeat) found the host silent."""
        with self._lock:
            link = self._link
        if link is not None:
            link.watchdog.lost_reason = reason
            link.transport.close()

    def close(self) -> None:
        """Close it now; a dial under way is aborted (it fails with ConnectionLostError)."""
        with self._lock:
            link, self._link = self._link, None
            dial, self._dial = self._dial, None
        if dial is not None:
            dial.abort("closed")
        if link is not None:
            link.close()

    def __enter__(self) -> Connection:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening -------------------------------------------------------------------------

    def _connect(self, dial: Dial) -> _Link:
        """Open the link within ONE connect_timeout for DNS, TCP, banner, key exchange and
        login together: a timer aborts the dial when it passes, whatever phase it is in.
        Waiting for a turn behind other handshakes through the same jump host is not counted;
        a handshake the host's sshd dropped before saying a word (past its MaxStartups) is
        tried again with backoff, and the backoff is not counted either: the host answered at
        once, it is busy with other handshakes (often this run's own), not slow."""
        settings = self.settings
        clock = _Clock(settings.connect_timeout, lambda: dial.abort("timed out"))
        try:
            target = self.target = resolve(self.spec, settings.ssh_config)
            client, jump = self._dial_until_answered(target, dial, clock)
        except BaseException as exc:
            if dial.aborted is None or (not dial.ssh_started and dial.aborted != "closed"):
                raise  # DNS and TCP say their own timeouts
            raise self._dial_error(dial, exc) from None
        finally:
            clock.cancel()
        transport = client.get_transport()
        assert transport is not None
        watchdog = Watchdog(transport, settings.keepalive_interval, settings.keepalive_count_max)
        watchdog.start()
        return _Link(client, transport, watchdog, jump)

    def _dial_until_answered(
        self, target: Target, dial: Dial, clock: _Clock
    ) -> tuple[paramiko.SSHClient, Lease | None]:
        for attempt in range(_REFUSED_TRIES):
            first = self.settings.connect_timeout  # (what the messages say)
            sock, jump = self._open_socket(target, clock.left() if attempt else first, dial)
            dial.ssh_started = True
            dial.hold(sock)
            try:
                if jump is not None:
                    clock.pause()
                    if not jump.take_turn(lambda: dial.aborted is not None):
                        raise EOFError("closed while waiting for a turn")
                    clock.run()
                client = self._handshake(target, sock, dial, clock.deadline())
                return client, jump
            except _Refused as refused:
                _close_quietly(sock, jump)
                if attempt + 1 == _REFUSED_TRIES:
                    raise refused.error from None
                clock.pause()
                _backoff(attempt, dial)
                clock.run()
            except BaseException:
                _close_quietly(sock, jump)
                raise
            finally:
                if jump is not None:
                    jump.end_turn()
        raise AssertionError("unreachable")

    def _dial_error(self, dial: Dial, exc: BaseException | None) -> VmrunError:
        """Why an aborted dial failed: closed meanwhile, or out of time."""
        if dial.aborted == "timed out":
            target = self.target
            where = f"{target.hostname} port {target.port}" if target else self.label
            return UnreachableError(
                f"no SSH session with {where} within {self.settings.connect_timeout:g} s"
                " (connect_timeout: DNS, TCP, SSH handshake and login together)",
                host=self.label,
                hint="check that the port is sshd's and the host is not overloaded,"
                " or raise --connect-timeout",
            )
        return _lost(self.label, None, "while connecting")

    def _new_client(self, target: Target) -> tuple[paramiko.SSHClient, list[Path]]:
        """A client that knows the host keys of every known_hosts file, and is strict about
        the rest unless accept-new is on; also the files it read (for the messages)."""
        import paramiko

        from vmrun.ssh.hostkeys import known_keys, make_policy

        settings = self.settings
        client = paramiko.SSHClient()
        known_files = [p for p in (*target.known_hosts_files, settings.known_hosts) if p.is_file()]
        name = target.host_key_name
        known = client.get_host_keys()  # only this host's keys: checked as the files' would be
        for path in known_files:
            try:
                found = known_keys(path, name)
            except OSError as exc:
                raise HostKeyError(f"cannot read {path}: {exc.strerror}", host=self.label) from None
            have: Any = known.lookup(name) or {}
            for keytype, key in found.items():
                if keytype not in have:  # the first file's wins
                    known.add(name, keytype, key)
        client.set_missing_host_key_policy(
            make_policy(
                label=self.label,
                accept_new=settings.accept_new_host_key,
                managed=settings.known_hosts,
            )
        )
        return client, known_files

    def _handshake(
        self, target: Target, sock: Any, dial: Dial, deadline: float
    ) -> paramiko.SSHClient:
        """SSH over the open socket: key exchange, host key check, authentication (each
        phase within what is left of the dial's time; `dial` holds the transport to abort)."""
        client, known_files = self._new_client(target)
        identities = [str(p) for p in target.identity_files if p.is_file()]
        timeout = max(0.1, deadline - time.monotonic())
        try:
            # With `sock` given, paramiko uses hostname/port only to name the known_hosts entry.
            client.connect(
                target.key_host,
                port=target.key_port,
                username=target.user,
                key_filename=identities or None,  # type: ignore[arg-type]  # takes a list too
                look_for_keys=not target.identity_files,
                allow_agent=not target.identities_only,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                sock=sock,
                transport_factory=lambda *a, **kw: dial.hold(transport_factory(*a, **kw)),
            )
        except Exception as exc:
            client.close()
            raise self._handshake_error(exc, target, identities, known_files) from None
        return client

    def _handshake_error(
        self, exc: Exception, target: Target, identities: list[str], known_files: list[Path]
    ) -> Exception:
        """paramiko's exception as vmrun's: what went wrong, and what to do."""
        import paramiko

        from vmrun.ssh.hostkeys import changed_key_error

        if isinstance(exc, paramiko.BadHostKeyException):
            return changed_key_error(
                self.label, target.host_key_name, exc.key, exc.expected_key, known_files
            )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return AuthError(
                f"the key for {target.user}@{target.hostname} needs a passphrase",
                host=self.label,
                hint="load it into ssh-agent with `ssh-add KEYFILE`",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            tried = ", ".join(identities) or "ssh-agent and ~/.ssh/id_*"
            return AuthError(
                f"authentication failed for user {target.user!r} (tried {tried})",
                host=self.label,
                hint=_AUTH_HINT,
            )
        if isinstance(exc, paramiko.SSHException) and str(exc) == _NO_KEYS:
            return self._no_key_error(target)
        if _dropped_unanswered(exc):
            return _Refused(
                UnreachableError(
                    f"sshd at {target.hostname} port {target.port} closed {_REFUSED_TRIES}"
                    " connections before its banner (too many handshakes at once: MaxStartups)",
                    host=self.label,
                    hint="lower --parallel (or jump_handshakes), or raise MaxStartups in the"
                    " host's sshd_config",
                    code="handshake-refused",
                )
            )
        if isinstance(exc, (paramiko.SSHException, EOFError, OSError)):
            return UnreachableError(
                f"SSH handshake with {target.hostname} port {target.port} failed: "
                f"{exc or type(exc).__name__}",
                host=self.label,
                hint="check that the port is sshd's and the host is not overloaded",
            )
        return exc  # a VmrunError of the host-key policy, or a bug: as it is

    def _no_key_error(self, target: Target) -> AuthError:
        """paramiko found nothing to offer, so the host was never asked: say where vmrun
        looked, since the fix is on this machine (a key, IdentityFile, ssh-agent)."""
        if target.identity_files:
            looked = "IdentityFile " + ", ".join(str(p) for p in target.identity_files)
            looked += " not found"
        else:
            looked = "no ~/.ssh/id_* key"
        if target.identities_only:
            looked += "; IdentitiesOnly keeps ssh-agent out"
        else:
            looked += ", and ssh-agent offered none"
        return AuthError(
            f"no SSH key to log in as {target.user!r} with ({looked})",
            host=self.label,
            hint=_AUTH_HINT,
        )

    def _open_socket(self, target: Target, timeout: float, dial: Dial) -> tuple[Any, Lease | None]:
        """A byte stream to the host's sshd, and the hold on its jump host's connection."""
        jumps = self._via if self._via is not None else target.proxy_jump
        if jumps:
            dial.ssh_started = True  # the jump host's own dial says its DNS and TCP errors
            return self._open_via_jump(jumps, target, timeout, dial)
        if target.proxy_command:
            import paramiko

            try:
                return dial.hold(paramiko.ProxyCommand(target.proxy_command)), None
            except Exception as exc:
                raise UnreachableError(
                    f"ProxyCommand failed to start: {exc}", host=self.label
                ) from None
        return tcp_connect(target.hostname, target.port, timeout, self.label), None

    def _open_via_jump(
        self, jumps: tuple[HostSpec, ...], target: Target, timeout: float, dial: Dial
    ) -> tuple[Any, Lease]:
        """ProxyJump: a direct-tcpip channel through the last jump host, whose connection
        every host reached through it shares (vmrun.ssh.jumps).

        `a,b,c` means: reach c through b through a, so c's own connection gets `via=(a, b)`.
        """
        import paramiko

        from vmrun.ssh import jumps as shared

        if self._depth >= _MAX_JUMPS:
            raise UsageError(
                f"ProxyJump chain longer than {_MAX_JUMPS} hops (a loop?)", host=self.label
            )
        *earlier, last = jumps
        via = tuple(earlier) or None
        settings = self.settings
        jump = shared.lease(
            (last, via, id(settings), self._depth),
            settings.jump_handshakes,
            lambda: Connection(last, settings, via=via, _depth=self._depth + 1),
        )
        dial.hold(jump)
        conn = jump.conn
        assert isinstance(conn, Connection)
        try:
            transport = conn.transport
        except VmrunError as exc:
            jump.close()
            raise type(exc)(
                f"jump host {last.label}: {exc.message}", host=self.label, hint=exc.hint
            ) from None
        try:
            where = (target.hostname, target.port)
            chan = transport.open_channel("direct-tcpip", where, ("127.0.0.1", 0), timeout=timeout)
            return chan, jump
        except paramiko.ChannelException as exc:
            jump.close()
            raise UnreachableError(
                f"jump host {last.label} cannot reach {target.hostname} port {target.port}"
                f" ({exc.text})",
                host=self.label,
                hint="check HostName/Port as the jump host sees them",
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            jump.close()
            raise UnreachableError(f"jump host {last.label}: {exc}", host=self.label) from None


class _Refused(Exception):
    """A handshake the host's sshd dropped before its banner; `error` if it stays so."""

    def __init__(self, error: UnreachableError):
        super().__init__(error.message)
        self.error = error


def _dropped_unanswered(exc: BaseException) -> bool:
    """sshd past MaxStartups accepts and closes at once: the banner read meets EOF or a
    reset, not a timeout."""
    import paramiko

    return (
        isinstance(exc, paramiko.SSHException)
        and str(exc).startswith(_BANNER_FAILED)
        and isinstance(exc.__context__, (EOFError, ConnectionResetError))
    )


def _backoff(attempt: int, dial: Dial) -> None:
    """Sleep before another try (0.05 s doubling up to 1 s, jittered), cut short if the dial
    ends."""
    pause = min(_REFUSED_BACKOFF_S * (2**attempt), _REFUSED_BACKOFF_MAX_S)
    pause *= random.uniform(0.5, 1.5)
    end = time.monotonic() + pause
    while dial.aborted is None and time.monotonic() < end:
        time.sleep(min(0.05, end - time.monotonic()))
    if dial.aborted is not None:
        raise EOFError("the dial ended while waiting to try again")


def _close_quietly(sock: Any, jump: Lease | None) -> None:
    with contextlib.suppress(Exception):
        sock.close()
    if jump is not None:
        jump.close()


class _Clock:
    """connect_timeout as a budget: a timer calls `expire` once it is spent. `pause` stops
    spending it (waiting for a turn is not the host's slowness), `run` goes on."""

    def __init__(self, seconds: float, expire: Callable[[], None]):
        self._left = seconds
        self._expire = expire
        self._since = 0.0
        self._timer: threading.Timer | None = None
        self.run()

    def run(self) -> None:
        self._since = time.monotonic()
        self._timer = threading.Timer(max(0.0, self._left), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def pause(self) -> None:
        self.cancel()
        self._left -= time.monotonic() - self._since

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def left(self) -> float:
        return max(0.05, self._since + self._left - time.monotonic())

    def deadline(self) -> float:
        return self._since + self._left


def _lost(label: str, link: _Link | None, doing: str) -> ConnectionLostError:
    """The loss as the link's own watchdog saw it; a link closed here says so."""
    if link is None:
        reason = "it was closed"
    else:
        reason = link.watchdog.lost_reason or "the connection dropped"
    return ConnectionLostError(
        f"connection lost ({reason}) {doing}",
        host=label,
        hint="check the host and the network; the remote command is stopped when the"
        " host notices the drop",
    )
