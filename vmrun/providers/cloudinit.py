"""What a new VM gets at its first boot: the user's public key, and a host key vmrun made, so
the VM's identity is pinned before the first connection (no trust on first use).

The cost, said in the docs: the private host key travels in the instance's user data, which
anyone allowed `ec2:DescribeInstanceAttribute` on the account can read, and which stays
readable from inside the VM (the metadata service). It proves to this machine that it talks to
the VM it launched; it is not a secret from the account's other users.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vmrun.errors import UsageError

# The keys vmrun offers when logging in, in paramiko's order (its look_for_keys).
_DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


@dataclass(frozen=True)
class HostKey:
    private_openssh: str  # "-----BEGIN OPENSSH PRIVATE KEY-----..."
    public_line: str  # "ssh-ed25519 AAAA... comment"

    @property
    def key_type(self) -> str:
        return self.public_line.split()[0]

    @property
    def base64(self) -> str:
        return self.public_line.split()[1]


def new_host_key(comment: str) -> HostKey:
    from vmrun.ssh.hostkeys import new_ed25519

    private, public = new_ed25519()
    return HostKey(private, f"{public} {comment}")


def user_public_key(path: Path | None, home: Path) -> str:
    """The public key line to install: `path` (a .pub, or a private key with its .pub beside
    it), else the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub, else ssh-agent's
    first key."""
    if path is not None:
        pub = path if path.suffix == ".pub" else path.with_name(path.name + ".pub")
        return _read_pub(pub)
    for name in _DEFAULT_KEYS:
        pub = home / ".ssh" / f"{name}.pub"
        if pub.is_file():
            return _read_pub(pub)
    agent = _agent_key()
    if agent:
        return agent
    raise UsageError(
        "no SSH public key to put on the new VMs (no ~/.ssh/id_ed25519.pub, id_ecdsa.pub,"
        " id_rsa.pub, and ssh-agent holds none)",
        hint="make one with `ssh-keygen -t ed25519`, or pass --ssh-key FILE",
    )


def _read_pub(pub: Path) -> str:
    try:
        text = pub.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(
            f"cannot read the public key {pub}: {exc.strerror}",
            hint="pass --ssh-key with a key that has its .pub beside it",
        ) from None
    parts = text.split()
    if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise UsageError(f"{pub} is not an OpenSSH public key", hint="pass --ssh-key FILE.pub")
    return " ".join(parts[:3])


def _agent_key() -> str:
    if not os.environ.get("SSH_AUTH_SOCK"):
        return ""
    try:
        import paramiko

        keys = paramiko.Agent().get_keys()
    except Exception:  # no agent answering: as if there were none
        return ""
    return f"{keys[0].get_name()} {keys[0].get_base64()}" if keys else ""


def user_data(host_key: HostKey, authorized: str) -> str:
    """The cloud-config document: the host key (the only one: ssh_genkeytypes is empty, so
    cloud-init makes no other) and the login user's authorized key."""
    private = "\n".join("    " + line for line in host_key.private_openssh.strip().splitlines())
    return (
        "#cloud-config\n"
        "ssh_deletekeys: true\n"
        "ssh_genkeytypes: []\n"
        "ssh_keys:\n"
        "  ed25519_private: |\n"
        f"{private}\n"
        f"  ed25519_public: {host_key.public_line}\n"
        "ssh_authorized_keys:\n"
        f"  - {authorized}\n"
    )
