"""What every test host has, whichever kind: one sshd and the client's view of it.

:class:`SshdHost` is the base of :class:`~testbed.testhost.TestHost` (a network
namespace, root only) and :class:`~testbed.loopback.LoopbackHost` (127.0.0.1).
It holds the sshd's files (host keys, ``sshd_config``, ``sshd.log`` in ``dir``)
and its process, and writes the client side: ssh_config blocks and known_hosts
lines.  Subclasses say where commands run and how sshd starts and stops.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import sshd
from .keys import ClientKeys, host_key_files, host_key_lines, keygen_wait, start_host_keygen
from .procs import run_process


class SshdHost:
    """Base of the test hosts: sshd lifecycle, host keys, commands, client config."""

    __test__ = False  # not a pytest test class

    name: str
    user: str
    home: Path
    port: int
    addrs: list[str]
    client_keys: ClientKeys
    _closing: threading.Event  # set when the owner closes: pending reboots give up
    _threads: list[threading.Thread]  # reboot threads the owner joins on close

    def __init__(self, directory: Path, *, key_comment: str, sshd_extra_config: str) -> None:
        self.dir = directory
        self.host_key_files = host_key_files(directory)
        self.host_key_pub_lines: list[str] = []
        self.sshd_config_path = directory / "sshd_config"
        self.sshd_log_path = directory / "sshd.log"
        self._key_comment = key_comment
        self._sshd_extra = sshd_extra_config
        self._sshd: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- subclass hooks

    def _command_argv(self, argv: Sequence[str], *, as_user: bool = False) -> list[str]:
        """argv that runs ``argv`` on the host; it must exec, so the pid is the command."""
        raise NotImplementedError

    def _command_env(self, as_user: bool, env: dict[str, str] | None) -> dict[str, str]:
        """The clean, login-like environment commands on the host get."""
        raise NotImplementedError

    def _default_cwd(self, as_user: bool) -> Path | str:
        raise NotImplementedError

    def _known_host_names(self) -> list[str]:
        """How ssh names this host in known_hosts."""
        raise NotImplementedError

    def _start_sshd_locked(self, timeout: float) -> None:
        """Start sshd (the lock is held and sshd is not running)."""
        raise NotImplementedError

    def stop_sshd(self) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- client's view

    @property
    def addr(self) -> str:
        """Primary address: on the first network given to add_host (normally 'main')."""
        return self.addrs[0]

    def known_hosts_lines(self, extra_names: Sequence[str] = ()) -> list[str]:
        """known_hosts lines for every name of the host (plus ``extra_names``)."""
        names = [*self._known_host_names(), *extra_names]
        return [f"{n} {key}" for n in names for key in self.host_key_pub_lines]

    def ssh_config_block(
        self,
        alias: str | None = None,
        identity: Path | None = None,
        *,
        proxy_jump: str | None = None,
        extra: Sequence[str] = (),
    ) -> str:
        """A ``Host`` block (alias defaults to ``name``, identity to the client key)."""
        lines = [
            f"Host {alias or self.name}",
            f"    HostName {self.addr}",
            f"    User {self.user}",
            f"    Port {self.port}",
            f"    IdentityFile {identity or self.client_keys.private}",
            "    IdentitiesOnly yes",
        ]
        if proxy_jump:
            lines.append(f"    ProxyJump {proxy_jump}")
        lines += [f"    {x}" for x in extra]
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------- commands

    def run(
        self,
        argv: Sequence[str],
        *,
        as_user: bool = False,
        check: bool = True,
        timeout: float = 30,
        input: bytes | str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        text: bool = False,
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` on the host, as root or (``as_user``) as the host's user.

        The environment is a clean login-like one (PATH, HOME, USER, LOGNAME, LANG),
        not the test process's.  On timeout the whole process group is SIGKILLed and
        TimeoutExpired raised.
        """
        if cwd is None:
            cwd = self._default_cwd(as_user)
        return run_process(
            self._command_argv(argv, as_user=as_user),
            env=self._command_env(as_user, env),
            cwd=str(cwd),
            input=input,
            timeout=timeout,
            check=check,
            text=text,
        )

    # ---------------------------------------------------------------- sshd

    def sshd_pid(self) -> int | None:
        proc = self._sshd
        return proc.pid if proc is not None and proc.poll() is None else None

    def sshd_log(self) -> str:
        return sshd.read_log(self.sshd_log_path)

    def _reap_sshd(self) -> None:
        if self._sshd is not None:
            self._sshd.poll()

    def _write_sshd_config(self, listen: Sequence[str], settings: Sequence[str]) -> None:
        sshd.write_config(
            self.sshd_config_path,
            listen=listen,
            host_keys=self.host_key_files,
            settings=settings,
            extra=self._sshd_extra,
        )

    def _launch_sshd(self, timeout: float, what: str) -> None:
        """Start sshd from its config; return once it listens on every address."""

        def started(proc: subprocess.Popen[bytes]) -> None:
            self._sshd = proc

        sshd.start(
            self.sshd_config_path,
            self.sshd_log_path,
            listeners=len(self.addrs),
            what=what,
            timeout=timeout,
            started=started,
            wrap=self._command_argv,
        )

    def start_sshd(self, timeout: float = 10.0) -> None:
        """Start sshd (foreground, never daemonised) and wait until it accepts TCP."""
        with self._lock:
            if self.sshd_pid() is None:
                self._start_sshd_locked(timeout)

    def restart_sshd(self) -> None:
        self.stop_sshd()
        self.start_sshd()

    def reboot_later(self, down_seconds: float) -> threading.Thread:
        """stop_sshd() now, start_sshd() after ``down_seconds`` in a background thread."""
        self.stop_sshd()
        closing = self._closing

        def later() -> None:
            if not closing.wait(down_seconds):
                with self._lock:
                    if not closing.is_set():
                        self.start_sshd()

        thread = threading.Thread(target=later, name=f"reboot-{self.name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    # ---------------------------------------------------------------- host keys

    def _start_host_keygen(self) -> list[subprocess.Popen[bytes]]:
        return start_host_keygen(self.host_key_files, self._key_comment)

    def _load_host_keys(self) -> None:
        self.host_key_pub_lines = host_key_lines(self.host_key_files)

    def _make_host_keys(self) -> None:
        keygen_wait(self._start_host_keygen())
        self._load_host_keys()

    def replace_host_keys(self) -> None:
        """New host keys + sshd restart (sessions drop): for "host key changed" tests."""
        with self._lock:
            self.stop_sshd()
            self._make_host_keys()
            self.start_sshd()
