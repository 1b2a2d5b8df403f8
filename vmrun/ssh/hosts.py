"""Host specs: `user@host[:port]`, `user@[v6addr]:port`, or an alias from ~/.ssh/config."""

from __future__ import annotations

import re
from dataclasses import dataclass

from vmrun.errors import HostSpecError

EXPECTED = "expected user@host[:port], user@[ipv6]:port or an alias from ~/.ssh/config"

_USER = r"(?P<user>[A-Za-z0-9_][A-Za-z0-9_.\-]*\$?)"
_NAME = r"(?P<host>[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?)"
_V6 = r"\[(?P<v6>[0-9A-Fa-f:.%A-Za-z0-9]+)\]"
_SPEC = re.compile(rf"(?:{_USER}@)?(?:{_V6}|{_NAME})(?::(?P<port>[0-9]{{1,5}}))?")


@dataclass(frozen=True)
class HostSpec:
    """What the user wrote, parsed; unset parts are filled from ~/.ssh/config later."""

    host: str
    user: str | None = None
    port: int | None = None

    @property
    def label(self) -> str:
        """The name shown in output: the spec as the user would write it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{self.user}@{host}" if self.user else host
        return f"{text}:{self.port}" if self.port else text

    def __str__(self) -> str:
        return self.label


def parse_host(text: str) -> HostSpec:
    """Parse one host spec or raise HostSpecError naming the expected form."""
    raw = text
    text = text.strip()
    if not text:
        raise HostSpecError(f"empty host spec: {EXPECTED}")
    m = _SPEC.fullmatch(text)
    if not m:
        raise HostSpecError(f"bad host {raw!r}: {EXPECTED}")
    host = m.group("v6") or m.group("host")
    if m.group("v6") and ":" not in host:
        raise HostSpecError(f"bad host {raw!r}: brackets are only for IPv6 addresses; {EXPECTED}")
    port = None
    if m.group("port"):
        port = int(m.group("port"))
        if not 1 <= port <= 65535:
            raise HostSpecError(f"bad port {port} in host {raw!r}: ports are 1-65535")
    return HostSpec(host=host, user=m.group("user"), port=port)
