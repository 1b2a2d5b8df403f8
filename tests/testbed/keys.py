"""SSH keys made with ssh-keygen: the test process's client key and the hosts' host keys."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import TestbedError
from .tools import SSH_KEYGEN

HOST_KEY_TYPES = ("ed25519", "ecdsa")


def _keygen_popen(path: Path, key_type: str, comment: str) -> subprocess.Popen[bytes]:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    argv = [SSH_KEYGEN, "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)]
    if key_type == "ecdsa":
        argv[4:4] = ["-b", "256"]
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def keygen_wait(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """Wait for ssh-keygen processes; raise TestbedError if one failed."""
    for proc in procs:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise TestbedError(f"ssh-keygen failed: {proc.args}: {out.decode(errors='replace')}")


def _pub_line(pub_path: Path) -> str:
    """'TYPE BASE64' of a .pub file, comment dropped (known_hosts lines add their own name)."""
    key_type, b64 = pub_path.read_text().split()[:2]
    return f"{key_type} {b64}"


# --------------------------------------------------------------------------- host keys


def host_key_files(directory: Path) -> list[Path]:
    """Private host key paths in ``directory``: one per type in HOST_KEY_TYPES."""
    return [directory / f"ssh_host_{t}_key" for t in HOST_KEY_TYPES]


def start_host_keygen(files: list[Path], comment: str) -> list[subprocess.Popen[bytes]]:
    """Start ssh-keygen for every host key (in parallel); finish with :func:`keygen_wait`."""
    return [_keygen_popen(f, t, comment) for f, t in zip(files, HOST_KEY_TYPES, strict=True)]


def host_key_lines(files: list[Path]) -> list[str]:
    """'TYPE BASE64' of every host key, for known_hosts lines."""
    return [_pub_line(k.with_name(k.name + ".pub")) for k in files]


# --------------------------------------------------------------------------- client key


@dataclass(frozen=True)
class ClientKeys:
    """An ed25519 client key pair for the test process (made with ssh-keygen, no passphrase)."""

    private: Path
    public: Path

    @classmethod
    def generate(cls, directory: Path, name: str = "id_ed25519") -> ClientKeys:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        private = directory / name
        keygen_wait([_keygen_popen(private, "ed25519", "vmrun-testbed-client")])
        private.chmod(0o600)
        return cls(private=private, public=private.with_name(name + ".pub"))

    @property
    def public_line(self) -> str:
        """The authorized_keys line for this key."""
        return self.public.read_text().strip()
