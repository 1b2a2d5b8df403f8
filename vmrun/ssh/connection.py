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
import threading
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
from vmrun.ssh.dial import tcp_connect, transport_factory
from vmrun.ssh.hosts import HostSpec, parse_host
from vmrun.ssh.sshconfig import Target, resolve

if TYPE_CHECKING:
    import paramiko

_MAX_JUMPS = 8
# paramiko's words when it has no key and no agent to try: an auth problem, not a network one
_NO_KEYS = "No authentication methods available"
_AUTH_HINT = (
    "check the user name, add your public key to ~/.ssh/authorized_keys on the host, or set"
    " IdentityFile in ~/.ssh/config (`ssh-keygen` makes a key; `ssh-add` loads one into"
    " ssh-agent)"
)

logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


class _Watchdog(threading.Thread):
    """Declares a connection lost when a keepalive probe goes unanswered too long.

    paramiko's own keepalive never waits for an answer, and TCP notices a silent peer
    only after many minutes; this is OpenSSH's ServerAliveInterval/CountMax. The reason is
    set before the transport is closed, so whoever sees the transport dead sees why.
    """

    def __init__(self, transport: paramiko.Transport, interval: float, count_max: int):
        super().__init__(daemon=True, name="vmrun-watchdog")
        self.transport = transport
        self.interval = interval
        self.dead_after = interval * count_max
        self.stopped = threading.Event()
        self.lost_reason: str | None = None

    def _probe(self, answered: threading.Event) -> None:
        try:
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:
            pass
        finally:
            answered.set()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            if not self.transport.is_active():
                return
            answered = threading.Event()
            threading.Thread(target=self._probe, args=(answered,), daemon=True).start()
            if not answered.wait(self.dead_after) and not self.stopped.is_set():
                self.lost_reason = f"the host stopped answering for {self.dead_after:g} s"
                self.transport.close()
                return


@dataclass(frozen=True)
class _Link:
    """An open connection's parts. Replaced whole, never edited, so a reader that took it
    under the lock holds a transport and the watchdog that speaks for that transport."""

    client: paramiko.SSHClient
    transport: paramiko.Transport
    watchdog: _Watchdog
    jump: Connection | None

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
        self.target: Target | None = None

    def open(self) -> Connection:
        self._current_link()
        return self

    def _current_link(self) -> _Link:
        with self._lock:
            if self._link is None:
                self._link = self._connect()
            return self._link

    @property
    def transport(self) -> paramiko.Transport:
        link = self._current_link()
        if not link.transport.is_active():
            raise _lost(self.label, link, "the connection is closed")
        return link.transport

    def _lost_error(self, doing: str) -> ConnectionLostError:
        with self._lock:
            link = self._link
        return _lost(self.label, link, doing)

    def close(self) -> None:
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()

    def __enter__(self) -> Connection:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening -------------------------------------------------------------------------

    def _connect(self) -> _Link:
        settings = self.settings
        target = self.target = resolve(self.spec, settings.ssh_config)
        sock, jump = self._open_socket(target, settings.connect_timeout)
        try:
            client = self._handshake(target, sock)
        except BaseException:
            with contextlib.suppress(Exception):
                sock.close()
            if jump is not None:
                jump.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        watchdog = _Watchdog(transport, settings.keepalive_interval, settings.keepalive_count_max)
        watchdog.start()
        return _Link(client, transport, watchdog, jump)

    def _new_client(self, target: Target) -> tuple[paramiko.SSHClient, list[Path]]:
        """A client that knows the host keys of every known_hosts file, and is strict about
        the rest unless accept-new is on; also the files it read (for the messages)."""
        import paramiko

        from vmrun.ssh.hostkeys import make_policy

        settings = self.settings
        client = paramiko.SSHClient()
        known_files = [p for p in (*target.known_hosts_files, settings.known_hosts) if p.is_file()]
        for path in known_files:
            try:
                client.load_system_host_keys(str(path))
            except OSError as exc:
                raise HostKeyError(f"cannot read {path}: {exc.strerror}", host=self.label) from None
        client.set_missing_host_key_policy(
            make_policy(
                label=self.label,
                accept_new=settings.accept_new_host_key,
                managed=settings.known_hosts,
            )
        )
        return client, known_files

    def _handshake(self, target: Target, sock: Any) -> paramiko.SSHClient:
        """SSH over the open socket: key exchange, host key check, authentication."""
        client, known_files = self._new_client(target)
        identities = [str(p) for p in target.identity_files if p.is_file()]
        timeout = self.settings.connect_timeout
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
                transport_factory=transport_factory,
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

    def _open_socket(self, target: Target, timeout: float) -> tuple[Any, Connection | None]:
        """A byte stream to the host's sshd, and the jump host's connection if it needs one."""
        jumps = self._via if self._via is not None else target.proxy_jump
        if jumps:
            return self._open_via_jump(jumps, target, timeout)
        if target.proxy_command:
            import paramiko

            try:
                return paramiko.ProxyCommand(target.proxy_command), None
            except Exception as exc:
                raise UnreachableError(
                    f"ProxyCommand failed to start: {exc}", host=self.label
                ) from None
        return tcp_connect(target.hostname, target.port, timeout, self.label), None

    def _open_via_jump(
        self, jumps: tuple[HostSpec, ...], target: Target, timeout: float
    ) -> tuple[Any, Connection]:
        """ProxyJump: a direct-tcpip channel through the last jump host.

        `a,b,c` means: reach c through b through a, so c's own connection gets `via=(a, b)`.
        """
        import paramiko

        if self._depth >= _MAX_JUMPS:
            raise UsageError(
                f"ProxyJump chain longer than {_MAX_JUMPS} hops (a loop?)", host=self.label
            )
        *earlier, last = jumps
        jump = Connection(last, self.settings, via=tuple(earlier) or None, _depth=self._depth + 1)
        try:
            transport = jump.transport
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
        except paramiko.SSHException as exc:
            jump.close()
            raise UnreachableError(f"jump host {last.label}: {exc}", host=self.label) from None


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
