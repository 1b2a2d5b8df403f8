"""Resolve a host spec through ~/.ssh/config into the concrete place to connect to.

The user's spec wins over the config file for user and port, as with OpenSSH's command
line; everything else (HostName, IdentityFile, ProxyJump, ProxyCommand, IdentitiesOnly,
UserKnownHostsFile, HostKeyAlias) comes from the first matching config entries.
"""

from __future__ import annotations

import getpass
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.errors import ConfigError
from vmrun.ssh.hosts import HostSpec, parse_host

if TYPE_CHECKING:
    import paramiko

GLOBAL_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")


def _defer_invoke() -> None:
    """paramiko.config imports invoke only to run `Match exec` lines, and invoke costs about
    half of paramiko's import (yaml, asyncio, unittest.mock: ~80 ms of every connecting
    command's start). Put a stand-in module under its name that imports the real one on the
    first attribute paramiko asks for. (importlib's LazyLoader does not help: `import`
    itself reads the module's attributes, which loads it.)"""
    import importlib
    import importlib.util
    import sys
    import types

    if "invoke" in sys.modules or "paramiko" in sys.modules:
        return
    spec = importlib.util.find_spec("invoke")
    if spec is None:
        return
    stub = types.ModuleType("invoke", "invoke, imported on first use (vmrun.ssh.sshconfig)")
    stub.__spec__ = spec

    def load(name: str) -> object:
        if sys.modules.get("invoke") is stub:
            del sys.modules["invoke"]
        return getattr(importlib.import_module("invoke"), name)

    setattr(stub, "__getattr__", load)  # noqa: B010 - a module-level __getattr__
    sys.modules["invoke"] = stub


_defer_invoke()


@dataclass(frozen=True)
class Target:
    label: str  # what the user wrote, for messages
    hostname: str  # where the TCP connection goes
    port: int
    user: str
    identity_files: tuple[Path, ...]
    identities_only: bool
    proxy_jump: tuple[HostSpec, ...]
    proxy_command: str | None
    known_hosts_files: tuple[Path, ...]  # OpenSSH's files, read only
    key_host: str  # HostKeyAlias or HostName: the name its key is filed under
    key_port: int  # 22 when an alias is used, as OpenSSH does

    @property
    def host_key_name(self) -> str:
        """The known_hosts name: `host`, or `[host]:port` off port 22."""
        if self.key_port == 22:
            return self.key_host
        return f"[{self.key_host}]:{self.key_port}"


_cache: dict[tuple[str, float], paramiko.SSHConfig] = {}
_cache_lock = threading.Lock()


def _ssh_config(path: Path) -> paramiko.SSHConfig | None:
    from paramiko import SSHConfig

    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read ssh config {path}: {exc.strerror}") from None
    key = (str(path), mtime)
    with _cache_lock:
        if key not in _cache:
            try:
                _cache[key] = SSHConfig.from_path(str(path))
            except Exception as exc:  # paramiko raises several types for bad files
                raise ConfigError(f"cannot parse ssh config {path}: {exc}") from None
        return _cache[key]


def _lookup(config: paramiko.SSHConfig, host: str) -> Any:
    """config.lookup(host) over only the blocks that can apply to `host` (its Host patterns
    match it, or a Match block): paramiko asks the password database for the user once per
    block, 75% of a lookup in a 256-host config (7 ms, a second of CPU for 256 hosts). The
    whole config where that cannot be told (CanonicalizeHostname: a second pass under
    another name) or paramiko keeps its blocks otherwise."""
    from paramiko import SSHConfig

    blocks = getattr(config, "_config", None)
    applies = getattr(config, "_pattern_matches", None)
    if (
        not isinstance(blocks, list)
        or applies is None
        or any("canonicalizehostname" in b.get("config", {}) for b in blocks)
    ):
        return config.lookup(host)
    narrow = SSHConfig()
    narrow._config = [b for b in blocks if b.get("matches") or applies(b.get("host", []), host)]  # type: ignore[attr-defined]
    return narrow.lookup(host)


def _yes(value: str | None) -> bool:
    return (value or "").strip().lower() in ("yes", "true", "on")


def resolve(spec: HostSpec, ssh_config_path: Path) -> Target:
    # OpenSSH's default known_hosts sit beside the ssh config that is honoured.
    """Fill in a spec from the ssh config: the answer `ssh -G` would give for our fields."""
    config = _ssh_config(ssh_config_path)
    data = _lookup(config, spec.host) if config is not None else {"hostname": spec.host}
    hostname = data.get("hostname", spec.host)
    try:
        port = spec.port or int(data.get("port", 22))
    except ValueError:
        raise ConfigError(f"bad Port for {spec.host} in {ssh_config_path}") from None
    user = spec.user or data.get("user") or getpass.getuser()
    identities = tuple(Path(os.path.expanduser(p)) for p in data.get("identityfile", []))
    jump_text = (data.get("proxyjump") or "").strip()
    jumps: tuple[HostSpec, ...] = ()
    if jump_text and jump_text.lower() != "none":
        try:
            jumps = tuple(parse_host(part) for part in jump_text.split(","))
        except Exception as exc:
            raise ConfigError(f"bad ProxyJump {jump_text!r} for {spec.host}: {exc}") from None
    proxy_command = data.get("proxycommand")
    if proxy_command and proxy_command.strip().lower() == "none":
        proxy_command = None
    known = data.get("userknownhostsfile")
    known_files = (
        tuple(Path(os.path.expanduser(p)) for p in known.split())
        if known
        else (ssh_config_path.parent / "known_hosts", ssh_config_path.parent / "known_hosts2")
    )
    global_known = data.get("globalknownhostsfile")
    known_files += (
        tuple(Path(p) for p in global_known.split()) if global_known else (GLOBAL_KNOWN_HOSTS,)
    )
    alias = data.get("hostkeyalias")
    return Target(
        label=spec.label,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identities,
        identities_only=_yes(data.get("identitiesonly")),
        proxy_jump=jumps,
        proxy_command=proxy_command,
        known_hosts_files=known_files,
        key_host=alias or hostname,
        key_port=22 if alias else port,
    )
