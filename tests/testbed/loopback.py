"""One real sshd on 127.0.0.1, for machines where network namespaces are not available.

Without root, sshd can only authenticate the user it runs as, and that user's
home is the real home: so a LoopbackHost logs in as the *current* user
(``user``, ``home`` = the real home).  Run as root, it logs in as root (home
``/root``, which needs the root account not locked: ``*`` in /etc/shadow, not
``!``).  Everything the sshd needs (host keys, config, authorized keys, log) lives
in a private directory under ``workdir``; nothing in ``~/.ssh`` is touched.
There is no network to cut or filter: those methods raise NotImplementedError.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from .errors import TestbedError
from .files import write_text
from .host import SshdHost
from .keys import ClientKeys
from .procs import descendants, kill_tree
from .sockets import free_port
from .tools import STD_PATH


class LoopbackHost(SshdHost):
    """A TestHost look-alike: sshd on 127.0.0.1:<free port>, as and for the current user."""

    __test__ = False

    name = "loopback"
    netns: str | None = None

    def __init__(
        self,
        workdir: Path,
        client_keys: ClientKeys,
        *,
        authorized: bool = True,
        sshd_extra_config: str = "",
    ) -> None:
        directory = Path(workdir).resolve() / "loopback-sshd"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        super().__init__(directory, key_comment="loopback", sshd_extra_config=sshd_extra_config)
        pw = pwd.getpwuid(os.geteuid())
        self.client_keys = client_keys
        self.user = pw.pw_name
        self.uid = pw.pw_uid
        self.home = Path(pw.pw_dir)
        self.hostname = socket.gethostname()
        self.addrs = ["127.0.0.1"]
        self.port = 0
        self.authorized_keys_file = directory / "authorized_keys"
        self._closing = threading.Event()
        self._threads = []
        self._closed = False
        self._owner_pid = os.getpid()
        write_text(
            self.authorized_keys_file, client_keys.public_line + "\n" if authorized else "", 0o600
        )
        self._make_host_keys()
        atexit.register(self._atexit_close)
        try:
            self.start_sshd()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"LoopbackHost({self.user}@127.0.0.1:{self.port})"

    def __enter__(self) -> LoopbackHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- like TestHost

    def _known_host_names(self) -> list[str]:
        return [f"[{self.addr}]:{self.port}"]

    def _command_argv(self, argv: Sequence[str], *, as_user: bool = False) -> list[str]:
        """Commands run locally; ``as_user`` changes nothing (root and user are the same)."""
        return list(argv)

    def _command_env(self, as_user: bool, env: dict[str, str] | None) -> dict[str, str]:
        base = {
            "PATH": STD_PATH,
            "HOME": str(self.home),
            "USER": self.user,
            "LOGNAME": self.user,
            "LANG": "C.UTF-8",
        }
        return {**base, **(env or {})}

    def _default_cwd(self, as_user: bool) -> Path | str:
        return self.home

    def pids(self) -> list[int]:
        """sshd and its descendants (the host's processes, as far as we can tell)."""
        pid = self.sshd_pid()
        return sorted(descendants(pid)) if pid else []

    user_pids = pids  # the user is the test process's own user: only the sshd tree counts

    def add_authorized_key(self, pubkey_line: str) -> None:
        with open(self.authorized_keys_file, "a") as f:
            f.write(pubkey_line.strip() + "\n")

    # ---------------------------------------------------------------- not possible here

    def cut_link(self, network: str | None = None) -> None:
        raise NotImplementedError("LoopbackHost has no link to cut; use NetnsBed (root)")

    heal_link = cut_link

    def block_port(self, port: int) -> None:
        raise NotImplementedError("LoopbackHost cannot filter ports; use NetnsBed (root)")

    unblock_port = block_port

    # ---------------------------------------------------------------- sshd

    def _start_sshd_locked(self, timeout: float) -> None:
        """The port is kept across restarts; only the very first start may retry with
        another free port if someone else grabbed it in between."""
        first = self.port == 0
        for attempt in range(5 if first else 1):
            if first:
                self.port = free_port()
            settings = [f"AuthorizedKeysFile {self.authorized_keys_file}", "StrictModes no"]
            if self.uid == 0:
                settings.append("PermitRootLogin prohibit-password")
            self._write_sshd_config([f"127.0.0.1:{self.port}"], settings)
            try:
                self._launch_sshd(timeout, f"loopback sshd on port {self.port}")
                return
            except BaseException as exc:
                self.stop_sshd()
                if not isinstance(exc, TestbedError) or attempt == (4 if first else 0):
                    raise

    def stop_sshd(self) -> None:
        """SIGKILL sshd and all its descendants (sessions drop, like a reboot)."""
        with self._lock:
            proc = self._sshd
            if proc is None:
                return
            if proc.poll() is None:
                kill_tree(proc.pid, reap=proc.poll)
            proc.wait()
            self._sshd = None

    def close(self) -> None:
        """Idempotent: kill the sshd tree by pid.  The workdir files stay (they are logs)."""
        if self._closed:
            return
        self._closing.set()
        for thread in self._threads:
            thread.join(timeout=15)
        self.stop_sshd()
        self._closed = True
        atexit.unregister(self._atexit_close)

    def _atexit_close(self) -> None:
        if os.getpid() != self._owner_pid:
            return  # a forked child exiting must not kill its parent's sshd
        with contextlib.suppress(Exception):
            self.close()
