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
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .netns import (
    SFTP_SERVER,
    SSHD,
    STD_PATH,
    ClientKeys,
    TestbedError,
    _keygen_popen,
    _keygen_wait,
    _kill_until_gone,
    _pub_line,
    _run_process,
    _write_text,
    pid_alive,
    wait_until,
)

__all__ = ["LoopbackHost"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def _descendants(*roots: int) -> set[int]:
    """``roots`` and all their live descendants (sessions of an sshd are its descendants)."""
    children = _children_map()
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        if pid_alive(pid):
            found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _kill_tree(root: int, reap: Callable[[], object]) -> None:
    """SIGSTOP the whole tree first (stopped processes cannot fork or get reparented
    away from us), then SIGKILL every pid seen; killing the root first would orphan
    its children to init, out of reach of a descendants walk."""
    seen: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = _descendants(root, *seen) - seen
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        seen |= new
    _kill_until_gone(lambda: sorted(p for p in seen if pid_alive(p)), reap=reap)


class LoopbackHost:
    """A TestHost look-alike: sshd on 127.0.0.1:<free port>, as and for the current user."""

    __test__ = False

    name = "loopback"
    addr = "127.0.0.1"
    netns: str | None = None

    def __init__(
        self,
        workdir: Path,
        client_keys: ClientKeys,
        *,
        authorized: bool = True,
        sshd_extra_config: str = "",
    ) -> None:
        pw = pwd.getpwuid(os.geteuid())
        self.client_keys = client_keys
        self.user = pw.pw_name
        self.uid = pw.pw_uid
        self.home = Path(pw.pw_dir)
        self.hostname = socket.gethostname()
        self.addrs = [self.addr]
        self.port = 0
        self.dir = Path(workdir).resolve() / "loopback-sshd"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        self.host_key_files = [self.dir / "ssh_host_ed25519_key", self.dir / "ssh_host_ecdsa_key"]
        self.host_key_pub_lines: list[str] = []
        self.authorized_keys_file = self.dir / "authorized_keys"
        self.sshd_config_path = self.dir / "sshd_config"
        self.sshd_log_path = self.dir / "sshd.log"
        self._sshd_extra = sshd_extra_config
        self._sshd: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._owner_pid = os.getpid()
        _write_text(
            self.authorized_keys_file, client_keys.public_line + "\n" if authorized else "", 0o600
        )
        self._generate_host_keys()
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

    def known_hosts_lines(self, extra_names: Sequence[str] = ()) -> list[str]:
        names = [f"[{self.addr}]:{self.port}", *extra_names]
        return [f"{n} {key}" for n in names for key in self.host_key_pub_lines]

    def ssh_config_block(
        self,
        alias: str | None = None,
        identity: Path | None = None,
        *,
        extra: Sequence[str] = (),
    ) -> str:
        lines = [
            f"Host {alias or self.name}",
            f"    HostName {self.addr}",
            f"    User {self.user}",
            f"    Port {self.port}",
            f"    IdentityFile {identity or self.client_keys.private}",
            "    IdentitiesOnly yes",
            *(f"    {x}" for x in extra),
        ]
        return "\n".join(lines) + "\n"

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
        """Run locally; ``as_user`` changes nothing (root and user are the same here)."""
        del as_user
        base = {
            "PATH": STD_PATH,
            "HOME": str(self.home),
            "USER": self.user,
            "LOGNAME": self.user,
            "LANG": "C.UTF-8",
        }
        return _run_process(
            list(argv),
            env={**base, **(env or {})},
            cwd=str(cwd or self.home),
            input=input,
            timeout=timeout,
            check=check,
            text=text,
        )

    def pids(self) -> list[int]:
        """sshd and its descendants (the host's processes, as far as we can tell)."""
        pid = self.sshd_pid()
        return sorted(_descendants(pid)) if pid else []

    user_pids = pids  # the user is the test process's own user: only the sshd tree counts

    def sshd_pid(self) -> int | None:
        proc = self._sshd
        return proc.pid if proc is not None and proc.poll() is None else None

    def sshd_log(self) -> str:
        try:
            return self.sshd_log_path.read_text(errors="replace")
        except OSError:
            return ""

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

    def _generate_host_keys(self) -> None:
        _keygen_wait(
            [
                _keygen_popen(self.host_key_files[0], "ed25519", "loopback"),
                _keygen_popen(self.host_key_files[1], "ecdsa", "loopback"),
            ]
        )
        self.host_key_pub_lines = [
            _pub_line(k.with_name(k.name + ".pub")) for k in self.host_key_files
        ]

    def _write_config(self) -> None:
        lines = [
            f"ListenAddress 127.0.0.1:{self.port}",
            *(f"HostKey {k}" for k in self.host_key_files),
            f"AuthorizedKeysFile {self.authorized_keys_file}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PidFile none",
            "UseDNS no",
            f"Subsystem sftp {SFTP_SERVER}",
            "PermitUserEnvironment no",
            "MaxStartups 100",
            "MaxSessions 64",
            "LogLevel VERBOSE",
            "ClientAliveInterval 0",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
        ]
        if self.uid == 0:
            lines.append("PermitRootLogin prohibit-password")
        text = "\n".join(lines) + "\n"
        if self._sshd_extra:
            text = self._sshd_extra.rstrip("\n") + "\n" + text
        _write_text(self.sshd_config_path, text, 0o600)

    def start_sshd(self, timeout: float = 10.0) -> None:
        """Start sshd in the foreground and wait until it accepts TCP.

        The port is kept across restarts; only the very first start may retry with
        another free port if someone else grabbed it in between.
        """
        with self._lock:
            if self.sshd_pid() is not None:
                return
            if self.uid == 0:
                Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
            first = self.port == 0
            for attempt in range(5 if first else 1):
                if first:
                    self.port = _free_port()
                self._write_config()
                try:
                    self._start_once(timeout)
                    return
                except TestbedError:
                    if attempt == (4 if first else 0):
                        raise

    def _start_once(self, timeout: float) -> None:
        offset = self.sshd_log_path.stat().st_size if self.sshd_log_path.exists() else 0
        with open(self.sshd_log_path, "ab") as log:
            self._sshd = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.sshd_config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={"PATH": STD_PATH, "LANG": "C.UTF-8"},
                cwd="/",
                start_new_session=True,
            )
        proc = self._sshd

        def ready() -> bool:
            if proc.poll() is not None:
                tail = self.sshd_log()[offset:][-2000:]
                raise TestbedError(f"loopback sshd exited rc={proc.returncode}:\n{tail}")
            with open(self.sshd_log_path, "rb") as f:
                f.seek(offset)
                # logged after listen(): the port accepts TCP from then on (no probe
                # connection, so sshd.log holds only the tests' connections)
                return b"Server listening on" in f.read()

        try:
            wait_until(ready, timeout, f"loopback sshd on port {self.port}", interval=0.005)
        except BaseException:
            self.stop_sshd()
            raise

    def stop_sshd(self) -> None:
        """SIGKILL sshd and all its descendants (sessions drop, like a reboot)."""
        with self._lock:
            proc = self._sshd
            if proc is None:
                return
            if proc.poll() is None:
                _kill_tree(proc.pid, reap=proc.poll)
            proc.wait()
            self._sshd = None

    def restart_sshd(self) -> None:
        self.stop_sshd()
        self.start_sshd()

    def reboot_later(self, down_seconds: float) -> threading.Thread:
        self.stop_sshd()

        def later() -> None:
            if not self._closing.wait(down_seconds):
                with self._lock:
                    if not self._closing.is_set():
                        self.start_sshd()

        thread = threading.Thread(target=later, name="reboot-loopback", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def replace_host_keys(self) -> None:
        with self._lock:
            self.stop_sshd()
            self._generate_host_keys()
            self.start_sshd()

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
