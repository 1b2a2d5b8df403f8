"""The sshd every test host runs: its config file, and starting it until it listens.

sshd runs in the foreground (``sshd -D -e``, never daemonised) with its output
appended to a log file.  Readiness is sshd logging "Server listening on" for
every listen address: that is logged after listen(), so the port accepts TCP
from then on.  No probe connection is made, so the log holds only the tests'
own connections.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .errors import TestbedError
from .files import write_text
from .procs import wait_until
from .tools import SFTP_SERVER, SSHD, STD_PATH

# Settings every test sshd shares; each host adds its own (listen addresses, keys, ...).
COMMON_SETTINGS = (
    "PubkeyAuthentication yes",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "UsePAM no",
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
)

# While set, start() refuses with this message (tests/conftest.py sets it for quick-tier tests).
_forbidden: str | None = None


@contextmanager
def guard(message: str) -> Iterator[None]:
    """Within the block, starting an sshd raises TestbedError(message)."""
    global _forbidden
    previous, _forbidden = _forbidden, message
    try:
        yield
    finally:
        _forbidden = previous


def write_config(
    path: Path,
    *,
    listen: Sequence[str],
    host_keys: Sequence[Path],
    settings: Sequence[str],
    extra: str = "",
) -> None:
    """Write an sshd_config (mode 0600): ``extra`` lines first, so they win.

    sshd keeps the first value it reads for most keywords, so ``extra`` overrides both
    the host's ``settings`` and COMMON_SETTINGS; a few (MaxStartups) keep the last, so a
    keyword ``extra`` sets is also left out of the rest.
    """
    given = {ln.split()[0].lower() for ln in extra.splitlines() if ln.strip()}
    lines = [
        *(f"ListenAddress {a}" for a in listen),
        *(f"HostKey {k}" for k in host_keys),
        *(ln for ln in [*settings, *COMMON_SETTINGS] if ln.split()[0].lower() not in given),
    ]
    text = "\n".join(lines) + "\n"
    if extra:
        text = extra.rstrip("\n") + "\n" + text
    write_text(path, text, 0o600)


def read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def start(
    config: Path,
    log: Path,
    *,
    listeners: int,
    what: str,
    timeout: float,
    started: Callable[[subprocess.Popen[bytes]], object],
    wrap: Callable[[list[str]], list[str]] = list,
) -> subprocess.Popen[bytes]:
    """Start ``sshd -D -e -f config`` and return once it logged ``listeners`` times
    "Server listening on".

    ``wrap`` turns the sshd argv into the one to execute (e.g. inside a namespace;
    it must exec, so the Popen pid is sshd).  ``started`` gets the process as soon
    as it exists, before the wait, so the caller can stop it if the wait fails.
    Raises TestbedError, naming ``what``, if sshd exits or does not listen in time.
    """
    if _forbidden is not None:
        raise TestbedError(_forbidden)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    offset = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            wrap([SSHD, "-D", "-e", "-f", str(config)]),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={"PATH": STD_PATH, "LANG": "C.UTF-8"},
            cwd="/",
            start_new_session=True,
        )
    started(proc)

    def listening() -> bool:
        if proc.poll() is not None:
            tail = read_log(log)[offset:][-2000:]
            raise TestbedError(f"{what} exited rc={proc.returncode}:\n{tail}")
        with open(log, "rb") as f:
            f.seek(offset)
            return f.read().count(b"Server listening on") >= listeners

    wait_until(listening, timeout, f"{what} to listen", interval=0.005)
    return proc
