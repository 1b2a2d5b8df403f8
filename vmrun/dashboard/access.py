"""Who may use the page: the holder of the token printed with its address (as Jupyter's),
by that token in the URL once and a cookie after; an action (POST) also only from the
page's own origin, so another site open in the same browser can neither read nor act."""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

COOKIE = "vmrun_dashboard"
HEADER = "X-Vmrun-Token"


@dataclass(frozen=True)
class Access:
    """The server's one token (random per start); the checks compare in constant time."""

    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def holds(self, *offered: str | None) -> bool:
        """Any of the offered values (query, cookie, header) is the token."""
        return any(o and hmac.compare_digest(o.encode(), self.token.encode()) for o in offered)

    def cookie_value(self) -> str:
        return self.token


def same_origin(origin: str | None, referer: str | None, host: str | None) -> bool:
    """The request came from a page served by this server: its Origin (or, where a browser
    sent none, its Referer) names this host and port. Neither: refused (a browser always
    sends Origin on a cross-site POST; curl with the token may send the header instead)."""
    if not host:
        return False
    for value in (origin, referer):
        if value:
            parts = urlsplit(value)
            return parts.scheme in ("http", "https") and parts.netloc == host
    return False
