"""OpenSSH's own `ssh` client for bulk bytes, held to exactly the host-key policy of vmrun's.

The transfer engine moves file data through `ssh host tar|cat`, which is 1.5x faster than
any paramiko stream on these machines (see docs: transfer notes). The `ssh` process gets
everything from the resolved Target that paramiko's connection used, and nothing from
elsewhere: `-F /dev/null` (no second reading of ~/.ssh/config, so no RemoteCommand,
forwardings or ControlMaster sneak in), the same user, port, identities and ProxyJump/
ProxyCommand, StrictHostKeyChecking=yes against the Target's known_hosts files plus vmrun's
managed file, the same host-key name, BatchMode (never a prompt), and the same liveness
settings. No secret ever goes on its command line.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from vmrun.config import Settings
from vmrun.ssh import quoting
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.sshconfig import Target, resolve

# Prefer AES-GCM like paramiko's transport (AES-NI: 1.4-1.6x chacha20); "^" puts these
# first and keeps OpenSSH's own list after them.
CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
_MAX_JUMPS = 8


def ssh_binary() -> str | None:
    return shutil.which("ssh")


def _pct(text: str) -> str:
    """Escape OpenSSH's %-tokens in a literal value (paths, ProxyCommand words)."""
    return text.replace("%", "%%")


def _option_path(path: Path) -> str:
    text = _pct(str(path))
    if any(c in text for c in ' "\\'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def ssh_options(target: Target, settings: Settings, *, depth: int = 0) -> list[str]:
    """`-o` options (and -p/-l) that reach `target` the way vmrun's Connection does."""
    if depth > _MAX_JUMPS:
        raise ValueError(f"ProxyJump chain longer than {_MAX_JUMPS} hops (a loop?)")
    known = [*target.known_hosts_files, settings.known_hosts]
    opts = [
        "-F",
        "/dev/null",
        "-p",
        str(target.port),
        "-l",
        target.user,
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UserKnownHostsFile=" + " ".join(_option_path(p) for p in known),
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "CheckHostIP=no",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        f"ConnectTimeout={max(1, round(settings.connect_timeout))}",
        "-o",
        f"ServerAliveInterval={max(1, round(settings.keepalive_interval))}",
        "-o",
        f"ServerAliveCountMax={settings.keepalive_count_max}",
        "-o",
        f"Ciphers={CIPHERS}",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "-o",
        "ClearAllForwardings=yes",
        "-o",
        "ForwardAgent=no",
        "-o",
        "ForwardX11=no",
        "-o",
        "PermitLocalCommand=no",
        "-o",
        "RequestTTY=no",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        "KbdInteractiveAuthentication=no",
        "-o",
        "IdentitiesOnly=" + ("yes" if target.identities_only else "no"),
    ]
    if target.key_host != target.hostname or target.key_port != target.port:
        opts += ["-o", "HostKeyAlias=" + _pct(target.key_host)]
    # Without IdentityFile, paramiko tries $HOME/.ssh/id_*; OpenSSH would look in the passwd
    # entry's home instead, so name the same files explicitly.
    identities = target.identity_files or tuple(
        Path.home() / ".ssh" / f"id_{kind}" for kind in ("ed25519", "ecdsa", "rsa")
    )
    for identity in identities:
        if identity.is_file():
            opts += ["-o", "IdentityFile=" + _option_path(identity)]
    proxy = _proxy_command(target, settings, depth)
    if proxy:
        opts += ["-o", "ProxyCommand=" + proxy]
    return opts


def _proxy_command(target: Target, settings: Settings, depth: int) -> str | None:
    """ProxyJump as an explicit ProxyCommand, so every hop gets the same strict policy.

    (`ssh -J` would start the jump's ssh with the config file's defaults instead.) The
    chain `a,b` means: reach the target through b, and b through a, as Connection does.
    """
    if target.proxy_jump:
        return _jump_command(target.proxy_jump, target, settings, depth)
    return target.proxy_command


def _jump_command(
    jumps: tuple[HostSpec, ...], target: Target, settings: Settings, depth: int
) -> str:
    *earlier, last = jumps
    jump = resolve(last, settings.ssh_config)
    if earlier:
        jump = dataclasses.replace(jump, proxy_jump=tuple(earlier), proxy_command=None)
    host = f"[{target.hostname}]" if ":" in target.hostname else target.hostname
    argv = [
        ssh_binary() or "ssh",
        *ssh_options(jump, settings, depth=depth + 1),
        "-W",
        f"{host}:{target.port}",
        "--",
        jump.hostname,
    ]
    return _pct(quoting.join(argv))


def ssh_argv(target: Target, settings: Settings, remote_command: str) -> list[str]:
    """The full argv of `ssh ... host REMOTE_COMMAND` (the command is one shell string)."""
    binary = ssh_binary()
    if binary is None:
        raise FileNotFoundError("ssh")
    return [binary, *ssh_options(target, settings), "-T", "--", target.hostname, remote_command]
