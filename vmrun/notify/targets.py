"""Where notifications go: Apprise URLs, checked before anything starts, and what the host's
own sender can post of them (webhooks over HTTP; mail and the rest only from this machine).

A URL holds a secret (a topic, a token): it is shown only redacted, travels to a host over
stdin into a 0600 file, and is never on a command line, in a log or in run.json."""

from __future__ import annotations

import base64
import urllib.parse
from dataclasses import dataclass

from vmrun.errors import UsageError

# the services a host's stdlib sender can post to, and the body each takes
HOST_KINDS = {
    "json": "json",
    "jsons": "json",
    "ntfy": "ntfy",
    "ntfys": "ntfy",
    "slack": "slack",
    "discord": "discord",
}
# services that only Apprise on this machine speaks (no plain webhook to post to)
LOCAL_ONLY = frozenset(
    {
        "mailto",
        "mailtos",
        "tgram",
        "pover",
        "msteams",
        "matrix",
        "matrixs",
        "gotify",
        "gotifys",
        "signal",
        "signals",
        "pbul",
        "rocket",
        "rockets",
        "mmost",
        "mmosts",
        "form",
        "forms",
        "xml",
        "xmls",
        "apprise",
        "apprises",
        "ntfys",
    }
    - set(HOST_KINDS)
)
NTFY_CLOUD = "https://ntfy.sh"


@dataclass(frozen=True)
class Webhook:
    """One POST the host's sender makes: to `url`, its body built as `kind` says."""

    url: str
    kind: str  # json | ntfy | slack | discord
    auth: str = ""  # an Authorization header's value, from the URL's user:password

    def as_dict(self) -> dict[str, str]:
        return {"url": self.url, "kind": self.kind, "auth": self.auth}


@dataclass(frozen=True)
class Target:
    url: str  # as the user wrote it (a secret)
    webhook: Webhook | None  # what a host can post; None: this machine only

    @property
    def shown(self) -> str:
        return redact(self.url)


def redact(url: str) -> str:
    """A URL as it may be shown: its scheme and host, nothing of its path or credentials."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme in ("ntfy", "ntfys") and not parts.path.strip("/"):
        host = ""  # ntfy://TOPIC: the host part is the topic
    return f"{parts.scheme}://{host}/..." if host else f"{parts.scheme}://..."


def parse(url: str) -> Target:
    """An Apprise URL, checked: a known scheme and the parts it needs. One line for a bad one."""
    text = url.strip()
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if not scheme or "://" not in text:
        raise _bad(text, "not a URL (SCHEME://...)")
    if scheme not in HOST_KINDS and scheme not in LOCAL_ONLY:
        raise _bad(text, f"{scheme}:// is not a service vmrun knows")
    if scheme in LOCAL_ONLY:
        if not parts.netloc and not parts.path.strip("/"):
            raise _bad(text, "names no address or account")
        return Target(text, None)
    return Target(text, _webhook(text, scheme, parts))


def _webhook(text: str, scheme: str, parts: urllib.parse.SplitResult) -> Webhook:
    host = _host(parts)
    path = [p for p in parts.path.split("/") if p]
    auth = ""
    if parts.username:
        pair = (
            f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        )
        auth = "Basic " + base64.b64encode(pair.encode()).decode()
    netloc = host + (f":{parts.port}" if parts.port else "")
    if scheme in ("json", "jsons"):
        if not host:
            raise _bad(text, "names no host (json://HOST[:PORT]/PATH)")
        http = "https" if scheme == "jsons" else "http"
        return Webhook(f"{http}://{netloc}{parts.path or '/'}", "json", auth)
    if scheme in ("ntfy", "ntfys"):
        if not path:  # ntfy://TOPIC: ntfy.sh's cloud
            if not host:
                raise _bad(text, "names no topic (ntfy://TOPIC or ntfy://HOST/TOPIC)")
            return Webhook(f"{NTFY_CLOUD}/{host}", "ntfy", auth)
        http = "https" if scheme == "ntfys" else "http"
        return Webhook(f"{http}://{netloc}/{path[0]}", "ntfy", auth)
    if scheme == "slack":
        tokens = [host, *path]
        if len(tokens) < 3 or not all(tokens[:3]):
            raise _bad(text, "needs its three tokens (slack://TOKEN_A/TOKEN_B/TOKEN_C)")
        return Webhook("https://hooks.slack.com/services/" + "/".join(tokens[:3]), "slack")
    tokens = [host, *path]  # discord://WEBHOOK_ID/WEBHOOK_TOKEN
    if len(tokens) < 2 or not all(tokens[:2]):
        raise _bad(text, "needs its id and token (discord://WEBHOOK_ID/WEBHOOK_TOKEN)")
    return Webhook(f"https://discord.com/api/webhooks/{tokens[0]}/{tokens[1]}", "discord")


def _host(parts: urllib.parse.SplitResult) -> str:
    """The host part as written: tokens and topics there keep their case (`hostname` is
    lower-cased)."""
    host = parts.netloc.rpartition("@")[2]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


def _bad(url: str, why: str) -> UsageError:
    return UsageError(
        f"notify URL {redact(url) if '://' in url else '(not a URL)'}: {why}",
        hint="use an Apprise URL: ntfy://TOPIC, slack://A/B/C, json://HOST/PATH, mailto://...",
        code="notify-url-bad",
    )


def parse_all(urls: list[str]) -> list[Target]:
    return [parse(u) for u in dict.fromkeys(urls) if u.strip()]
