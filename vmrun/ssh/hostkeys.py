"""Strict host-key checking, with trust-on-first-use only when the user asks for it.

Keys are read from OpenSSH's known_hosts files and from vmrun's own file; a key first
accepted with --accept-new-host-key is written to vmrun's file, never to ~/.ssh. A changed
key is refused always, as OpenSSH's StrictHostKeyChecking=accept-new does.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.errors import ChangedHostKeyError, UnknownHostKeyError

if TYPE_CHECKING:
    import paramiko


_parsed: dict[Path, tuple[tuple[int, int, int], paramiko.HostKeys]] = {}
_parsed_lock = threading.Lock()
_parsing: dict[Path, threading.Lock] = {}


def known_keys(path: Path, name: str) -> dict[str, paramiko.PKey]:
    """The keys `path` (a known_hosts file) holds for `name`, by key type; the first line
    of a type wins, as when paramiko reads the file itself. The file is parsed once per
    process while it stays unchanged: parsing builds every line's key (40 ms for 512
    lines), and doing it per connection was quadratic, 10 s of CPU for 256 hosts."""
    import paramiko

    info = path.stat()
    stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
    with _parsed_lock:
        lock = _parsing.setdefault(path, threading.Lock())
    with lock:  # 64 hosts dialing at once parse the file once, not 64 times
        cached = _parsed.get(path)
        if cached is None or cached[0] != stamp:
            keys = paramiko.HostKeys()
            keys.load(str(path))
            cached = _parsed[path] = (stamp, keys)
    found = cached[1].lookup(name)
    return {keytype: found[keytype] for keytype in found} if found else {}


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def append_known_host(path: Path, name: str, key: paramiko.PKey) -> None:
    """Add one `name keytype base64` line; the file and its folder stay private."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(line)


def make_policy(*, label: str, accept_new: bool, managed: Path) -> Any:
    """A paramiko MissingHostKeyPolicy: refuse unknown keys, or record them when asked."""
    import paramiko

    class Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(
            self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
        ) -> None:
            if not accept_new:
                raise UnknownHostKeyError(
                    f"unknown host key {key.get_name()} {fingerprint(key)} for {hostname}",
                    host=label,
                    hint=(
                        "if that fingerprint is the host's, re-run with --accept-new-host-key"
                        " (or add the key to ~/.ssh/known_hosts)"
                    ),
                )
            append_known_host(managed, hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return Policy()


def changed_key_error(
    label: str, name: str, offered: paramiko.PKey, expected: paramiko.PKey, files: list[Path]
) -> ChangedHostKeyError:
    where = " or ".join(str(f) for f in files) or "known_hosts"
    return ChangedHostKeyError(
        f"HOST KEY CHANGED for {name}: it offers {offered.get_name()} {fingerprint(offered)},"
        f" known_hosts has {fingerprint(expected)}; refusing to connect",
        host=label,
        hint=(
            "this can mean an attack; if the host was really rebuilt, remove the old key with"
            f" `ssh-keygen -R '{name}' -f FILE` (FILE: {where}) and connect again"
        ),
    )


def new_ed25519() -> tuple[str, str]:
    """A fresh ed25519 pair made here (cryptography, which paramiko already needs): the
    private half in OpenSSH's format and the public "ssh-ed25519 base64" (a cloud VM's host
    key, a one-transfer key between hosts)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode("ascii")
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode("ascii")
    )
    return private, public
