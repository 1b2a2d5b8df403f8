"""What a host is, learned in one read-only round trip: OS, GPUs, driver, sudo, setup state.

GPU detection needs no extra package: PCI display controllers with NVIDIA's vendor id
0x10de under /sys/bus/pci/devices, or `lspci -d 10de:` where sysfs shows none. Setup reads the
facts again after a step that may reboot (the driver), so the torch wheel follows the new driver.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from vmrun import hostside, remote_paths
from vmrun.errors import RemoteError
from vmrun.ssh.connection import Connection


@dataclass
class Facts:
    home: str
    user: str
    uid: int
    os_id: str
    os_release: str
    os_name: str
    arch: str
    boot_id: str
    gpus: int
    smi_rc: int
    smi_first: str
    cuda_driver: str
    driver: str
    sudo: str  # root | nopasswd | password | none
    tools: dict[str, bool]
    state: dict[str, Any] = field(default_factory=dict)
    compute_cap: str = ""  # the lowest among the GPUs, e.g. "7.5"; empty when unknown
    sudo_says: str = ""  # what `sudo -n true` printed when it failed

    @property
    def sudo_problem(self) -> str:
        """Why this host cannot run root steps, in words; empty when it can."""
        if self.can_sudo:
            return ""
        if self.sudo == "none":
            return "there is no sudo"
        said = f" ({self.sudo_says})" if self.sudo_says else ""
        return f"sudo needs a password{said}"

    @property
    def has_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def sudo_prefix(self) -> str:
        return "" if self.sudo == "root" else "sudo -n"

    @property
    def can_sudo(self) -> bool:
        return self.sudo in ("root", "nopasswd")

    def absolute(self, path: str) -> str:
        """A path as the host sees it: relative paths are relative to the home directory."""
        if path.startswith("~/"):
            path = path[2:]
        return path if path.startswith("/") else f"{self.home.rstrip('/')}/{path}"


def parse(text: str, host: str) -> Facts:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z_0-9]+", key):
            values[key] = value
    if "home" not in values:
        raise RemoteError("could not read the host's facts (is the login shell POSIX?)", host=host)
    state: dict[str, Any] = {}
    if values.get("state"):
        try:
            state = json.loads(base64.b64decode(values["state"]))
        except ValueError:
            state = {}  # a damaged state file only costs re-running checks

    def number(key: str, default: int = 0) -> int:
        try:
            return int(values.get(key, default))
        except ValueError:
            return default

    return Facts(
        home=values["home"],
        user=values.get("user", ""),
        uid=number("uid", -1),
        os_id=values.get("os_id", ""),
        os_release=values.get("os_release", ""),
        os_name=values.get("os_name", ""),
        arch=values.get("arch", ""),
        boot_id=values.get("boot_id", ""),
        gpus=number("gpus"),
        smi_rc=number("smi_rc", 127),
        smi_first=values.get("smi_first", ""),
        cuda_driver=values.get("cuda_driver", ""),
        driver=values.get("driver", ""),
        sudo=values.get("sudo", "none"),
        tools={k[4:]: v == "1" for k, v in values.items() if k.startswith("has_")},
        state=state if isinstance(state, dict) else {},
        compute_cap=_version_text(values.get("compute_cap", "")),
        sudo_says=values.get("sudo_says", "").strip()[:200],
    )


def _version_text(text: str) -> str:
    """A "major.minor" version, or "" for anything else (a stand-in or an old nvidia-smi)."""
    text = text.strip()
    return text if re.fullmatch(r"\d+\.\d+", text) else ""


def gather(conn: Connection, state: str = remote_paths.SETUP_STATE) -> Facts:
    """The host's facts, with setup's state read from `state` (relative to the home, or
    absolute: a cluster's workdir). Only looks: no autostop activity (a dry run writes
    nothing there)."""
    result = conn.run([*hostside.command("facts.sh"), state], activity=False)
    if not result.ok:
        raise RemoteError(f"reading host facts failed: {result.output_tail(3)}", host=conn.label)
    return parse(result.stdout_tail, conn.label)
