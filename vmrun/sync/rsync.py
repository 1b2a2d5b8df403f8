"""The rsync sync engine: `rsync -a --files-from=-` over OpenSSH with vmrun's exact
connection settings (`openssh.ssh_options`: strict host keys, the same identities,
ProxyJump...). Its delta transfer sends only the changed blocks of a changed big file.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vmrun.errors import (
    AuthError,
    ChangedHostKeyError,
    ConnectionLostError,
    HostKeyError,
    RemoteError,
    UnreachableError,
    VmrunError,
)
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.ssh.result import Tail
from vmrun.sync.plan import SyncReport, warn
from vmrun.transfer.types import Progress

_OUT_FORMAT = "vmrun:%i:%l:%n"
_PROGRESS2 = re.compile(rb"^\s*([\d,.]+)\s+\d+%")
_OCTAL = re.compile(rb"\\#([0-7]{3})")


@dataclass(frozen=True)
class HostRsync:
    path: str
    version: tuple[int, int, int]


def parse_version(text: str) -> tuple[int, int, int] | None:
    m = re.search(r"version\s+v?(\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


@functools.lru_cache(maxsize=1)
def _local_rsync() -> tuple[str, tuple[int, int, int]] | None:
    path = shutil.which("rsync")
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    version = parse_version(out.splitlines()[0] if out else "")
    return (path, version) if version else None


def rsync_word(word: str) -> str | None:
    """One word for rsync's `-e` string, which rsync splits on spaces itself: quotes group,
    a doubled quote inside quotes is that quote, backslashes are plain characters."""
    if "\0" in word:
        return None
    if word and not any(c in word for c in " '\""):
        return word
    return "'" + word.replace("'", "''") + "'"


@dataclass(frozen=True)
class Rsync:
    argv: list[str]  # everything but the source and destination


def rsync_command(conn: Connection, workdir: str, host: HostRsync | None) -> Rsync | str:
    """The rsync command for this connection, or why rsync cannot be used."""
    from vmrun.ssh.openssh import ssh_binary, ssh_options

    local = _local_rsync()
    if local is None:
        return "no rsync on this machine"
    if host is None:
        return "no rsync on the host"
    ssh = ssh_binary()
    if ssh is None:
        return "no OpenSSH `ssh` client on this machine"
    conn.ensure_lib()  # the host's rsync runs under command_mark.sh
    target = conn.target
    assert target is not None
    try:
        words = [rsync_word(w) for w in (ssh, *ssh_options(target, conn.settings))]
    except ValueError as exc:
        return str(exc)
    if any(w is None for w in words):
        return "an ssh option cannot be written in rsync's -e syntax"
    if target.hostname.startswith("-") or "\0" in workdir:
        return f"host name {target.hostname!r} cannot be given to rsync"
    path, version = local
    both = min(version, host.version)
    # the host's rsync runs under command_mark.sh: the host's autostop counts it as work
    argv = [
        path,
        "-a",
        "--no-owner",
        "--no-group",
        "-8",
        "--from0",
        "--files-from=-",
        f"--out-format={_OUT_FORMAT}",
        f"--rsync-path={quoting.plain_command([host.path])}",
        "-e",
        " ".join(w for w in words if w is not None),
    ]
    if version >= (3, 1, 0):
        argv.append("--info=progress2")
    if both >= (3, 1, 3):
        argv.append("--modify-window=-1")  # compare nanoseconds, as the vmrun engine does
    if both >= (3, 0, 0):
        argv.append("--protect-args")
    elif not re.fullmatch(r"[A-Za-z0-9._/+=@%,-]+", workdir):
        return f"rsync {'.'.join(map(str, both))} cannot protect the path {workdir!r}"
    return Rsync(argv)


def _unescape(name: bytes) -> str:
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m[1], 8)]), name))


class _RsyncOutput:
    """Turns rsync's stdout (--out-format lines, --info=progress2 updates) into Progress
    calls and counts; a file's line comes before its data, so it starts that file."""

    def __init__(self, label: str, progress: Progress):
        self.label = label
        self.progress = progress
        self.current: str | None = None
        self.sent = 0
        self.sent_bytes = 0
        self.moved = 0

    def line(self, raw: bytes) -> None:
        if raw.startswith(b"vmrun:"):
            parts = raw.split(b":", 3)
            if len(parts) != 4:
                return
            items, size, name = parts[1], parts[2], _unescape(parts[3])
            if len(items) < 2 or items[:1] not in (b"<", b">", b"c"):
                return  # "." is attributes only: nothing was written
            if items[1:2] == b"f":
                self.finish()
                nbytes = int(size.replace(b",", b"").replace(b".", b"") or 0)
                self.sent += 1
                self.sent_bytes += nbytes
                self.current = name
                self.progress.file_begin(self.label, name, nbytes, 0)
            elif items[1:2] == b"L":
                self.sent += 1
            return
        m = _PROGRESS2.match(raw)
        if m:
            total = int(m[1].replace(b",", b"").replace(b".", b""))
            if total > self.moved:
                self.progress.advance(self.label, total - self.moved)
                self.moved = total

    def finish(self, ok: bool = True) -> None:
        if self.current is not None:
            self.progress.file_end(self.label, self.current, ok)
            self.current = None


_SSH_UNREACHABLE = (
    "could not resolve hostname",
    "connection refused",
    "connection timed out",
    "no route to host",
    "network is unreachable",
    "kex_exchange_identification",
    "banner exchange",
    "connection closed by",
)
_SSH_LOST = ("timeout, server", "not responding", "broken pipe", "connection reset")


def _rsync_error(status: int, err: str, label: str) -> VmrunError:
    """rsync's exit status and stderr as the vmrun error a user can act on."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    low = err.lower()
    detail = next((ln for ln in lines if not ln.startswith("rsync error:")), "") or (
        lines[-1] if lines else f"exit status {status}"
    )
    if "remote host identification has changed" in low:
        return ChangedHostKeyError(
            "rsync's ssh refused the host: its HOST KEY CHANGED",
            host=label,
            hint="this can mean an attack; see `vmrun exec -H HOST -- true` for the fingerprints",
        )
    if "host key verification failed" in low:
        return HostKeyError(
            "rsync's ssh refused the host key (not in known_hosts)",
            host=label,
            hint="connect once with --accept-new-host-key, or add the key to ~/.ssh/known_hosts",
        )
    if "permission denied (" in low:
        return AuthError(f"rsync's ssh could not log in: {detail}", host=label)
    if status == 127 or "rsync: command not found" in low or "rsync: not found" in low:
        return RemoteError(
            "rsync is missing on the host", host=label, hint="VMRUN_SYNC_ENGINE=vmrun"
        )
    if any(s in low for s in _SSH_UNREACHABLE):
        return UnreachableError(f"rsync cannot reach the host: {detail}", host=label)
    if any(s in low for s in _SSH_LOST):
        return ConnectionLostError(f"the sync's connection dropped: {detail}", host=label)
    if "0 bytes received so far" in low:  # ssh (or a ProxyCommand) died before rsync spoke
        return UnreachableError(f"rsync cannot reach the host: {detail}", host=label)
    if status in (12, 255) and "connection unexpectedly closed" in low:
        return ConnectionLostError(f"the sync's connection dropped: {detail}", host=label)
    return RemoteError(f"rsync failed (exit {status}): {detail}", host=label)


def rsync_send(
    conn: Connection,
    project: Path,
    workdir: str,
    command: Rsync,
    entries: Sequence[str],
    progress: Progress,
    report: SyncReport,
) -> None:
    """Run rsync for `entries` (files and symlinks); count what it wrote."""
    target = conn.target
    assert target is not None
    host = f"[{target.hostname}]" if ":" in target.hostname else target.hostname
    argv = [*command.argv, "--", str(project) + "/", f"{host}:{workdir.rstrip('/')}/"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSYNC_")}
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its ssh child is in its group: both stop together
    )
    output = _RsyncOutput(conn.label, progress)
    err = Tail(16 * 1024)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

    def feed() -> None:
        with contextlib.suppress(OSError):
            stdin.write(b"".join(os.fsencode(e) + b"\0" for e in entries))
        with contextlib.suppress(OSError):
            stdin.close()

    def drain() -> None:
        while data := stderr.read1(65536):  # type: ignore[attr-defined]  # a BufferedReader
            err.feed(data)

    helpers = [threading.Thread(target=f, daemon=True) for f in (feed, drain)]
    for t in helpers:
        t.start()
    try:
        buf = b""
        while chunk := stdout.read1(65536):  # type: ignore[attr-defined]  # a BufferedReader
            *lines, buf = re.split(rb"[\r\n]", buf + chunk)
            for line in lines:
                output.line(line)
        output.line(buf)
        status = proc.wait()
    finally:
        if proc.poll() is None:
            _stop(proc)
        for t in helpers:
            t.join(timeout=5)
        stdout.close()
        stderr.close()
    output.finish(ok=status in (0, 24))
    if status not in (0, 24):  # 24: a file vanished before it could be sent
        raise _rsync_error(status, err.text(), conn.label)
    if status == 24:
        vanished = [ln for ln in err.text().splitlines() if "vanished" in ln]
        warn(report, progress, vanished or ["some files vanished before they could be sent"])
    report.sent += output.sent
    report.sent_bytes += output.sent_bytes
    report.unchanged += len(entries) - output.sent


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop rsync and its ssh child (their own process group, led by rsync's pid)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
