"""Put local files on a host: one tar stream over one channel, renamed into place at the end.

Used by setup for wheelhouses and installers; files already there with the same size and
modification time are not sent again. Every file lands under a temporary folder first, so
an interrupted upload never leaves a partial file under its final name.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

from vmrun import quoting
from vmrun.connection import Connection
from vmrun.errors import RemoteError

_LIST = 'mkdir -p "$1" && find "$1" -maxdepth 1 -type f -printf "%f\\t%s\\t%T@\\n"'
_RECEIVE = (
    'set -e; mkdir -p "$1"; part=$(mktemp -d "$1/.vmrun-part.XXXXXX");'
    ' trap \'rm -rf "$part"\' EXIT; tar xf - -C "$part";'
    ' for f in "$part"/* "$part"/.[!.]*; do [ -e "$f" ] && mv -f "$f" "$1"/; done; true'
)


class _ChannelWriter:
    def __init__(self, channel: object):
        self.channel = channel

    def write(self, data: bytes) -> int:
        self.channel.sendall(data)  # type: ignore[attr-defined]
        return len(data)


def upload_files(conn: Connection, files: Sequence[Path], remote_dir: str) -> list[Path]:
    """Send the files that differ into remote_dir (relative to home, or absolute)."""
    listing = conn.run(["sh", "-c", _LIST, "list", remote_dir], check=True).stdout_tail
    there: dict[str, tuple[int, int]] = {}
    for line in listing.splitlines():
        name, size, mtime = [*line.split("\t"), "", ""][:3]
        try:
            there[name] = (int(size), int(float(mtime)))
        except ValueError:
            continue
    todo = []
    for path in files:
        st = path.stat()
        if there.get(path.name) != (st.st_size, int(st.st_mtime)):
            todo.append(path)
    if not todo:
        return []
    chan = conn.open_session()
    try:
        chan.exec_command(quoting.plain_command(["sh", "-c", _RECEIVE, "receive", remote_dir]))
        with tarfile.open(
            fileobj=_ChannelWriter(chan),
            mode="w|",  # type: ignore[arg-type]
            format=tarfile.PAX_FORMAT,
        ) as tar:
            for path in todo:
                tar.add(os.fspath(path), arcname=path.name, recursive=False)
        chan.shutdown_write()
        status = chan.recv_exit_status()
        err = b""
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
    finally:
        chan.close()
    if status != 0:
        detail = err.decode("utf-8", "replace").strip().splitlines()
        raise RemoteError(
            f"upload to {remote_dir} failed: {detail[-1] if detail else status}",
            host=conn.label,
            hint="check free space on the host",
        )
    return todo
