"""UCloud's HTTP API as vmrun calls it: JSON over HTTPS, one token, the project chosen by a
header, and UCloud's errors (`{"statusCode", "why"}`) as one line.

Tokens (core2/pkg/foundation): a refresh token, from a web login, is exchanged at
`POST /auth/refresh` (the refresh token as the bearer) for an access token that lasts ten
minutes; an expired access token makes UCloud answer 403 "Forbidden" (a guest), so vmrun
refreshes once and asks again. A personal API token (`uc<id>-<secret>`, made at
/api/tokens) is the bearer itself and needs no refresh; its project is its own.

Where the token comes from: VMRUN_UCLOUD_TOKEN, else a file only its user may read
(~/.config/vmrun/ucloud-token, 0600). It is never printed, logged or put on a command line.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmrun.errors import CloudError

DEFAULT_URL = "https://cloud.sdu.dk"
TOKEN_ENV = "VMRUN_UCLOUD_TOKEN"
URL_ENV = "VMRUN_UCLOUD_URL"
PROJECT_ENV = "VMRUN_UCLOUD_PROJECT"
TIMEOUT_S = 30.0


def token_file(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "vmrun" / "ucloud-token"


def find_token(environ: Mapping[str, str] | None = None) -> str:
    """The token from the environment, else from its file (refused unless only its user
    may read it); "" when there is none."""
    environ = os.environ if environ is None else environ
    if token := environ.get(TOKEN_ENV, "").strip():
        return token
    path = token_file(environ)
    try:
        mode = path.stat().st_mode
    except OSError:
        return ""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CloudError(
            f"{path} may be read by others (mode {stat.S_IMODE(mode):o}): vmrun will not use it",
            hint=f"chmod 600 {path}",
            code="cloud-credentials",
        )
    return path.read_text(encoding="utf-8").strip()


@dataclass
class Reply:
    status: int
    body: Any


# one HTTP exchange: (method, url, headers, body bytes) -> (status, body bytes)
Transport = Callable[[str, str, Mapping[str, str], bytes | None], tuple[int, bytes]]


def urllib_transport(
    method: str, url: str, headers: Mapping[str, str], body: bytes | None
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise CloudError(
            f"UCloud at {url.split('/api')[0]} cannot be reached: {reason}", code="cloud-failed"
        ) from None


class Session:
    """Calls to one UCloud: `call("GET", "/api/jobs/retrieve", query={...})`."""

    def __init__(
        self,
        token: str,
        *,
        url: str = DEFAULT_URL,
        project: str = "",
        transport: Transport = urllib_transport,
    ) -> None:
        if not token:
            raise CloudError(
                "no UCloud token: vmrun needs one to make VMs there",
                hint=f"put a refresh token or an API token in {TOKEN_ENV}, or in"
                " ~/.config/vmrun/ucloud-token (chmod 600)",
                code="cloud-credentials",
            )
        self.url = url.rstrip("/")
        self.project = project
        self._token = token
        self._access = token if self.personal else ""
        self._transport = transport
        self._lock = threading.Lock()
        self.refreshes = 0  # how many access tokens were fetched (for tests and messages)

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, transport: Transport = urllib_transport
    ) -> Session:
        environ = os.environ if environ is None else environ
        return cls(
            find_token(environ),
            url=environ.get(URL_ENV) or DEFAULT_URL,
            project=environ.get(PROJECT_ENV, ""),
            transport=transport,
        )

    @property
    def personal(self) -> bool:
        """A personal API token (`uc<id>-<secret>`): the bearer itself, never refreshed."""
        return self._token.startswith("uc") and "-" in self._token and "." not in self._token

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        what: str = "",
    ) -> Any:
        """One call's JSON answer; a refused call raises CloudError with UCloud's `why`.
        An access token that expired (403) is refreshed once and the call made again."""
        for attempt in (1, 2):
            access = self._access_token()
            reply = self._send(method, path, body, query, access)
            if reply.status == 403 and not self.personal and attempt == 1:
                with self._lock:
                    if self._access == access:  # no other thread refreshed it meanwhile
                        self._access = ""
                continue
            return self._answer(reply, what or f"{method} {path}")
        raise AssertionError("unreachable")

    def _access_token(self) -> str:
        with self._lock:
            if not self._access:
                reply = self._send("POST", "/auth/refresh", None, None, self._token)
                if (
                    reply.status != 200
                    or not isinstance(reply.body, dict)
                    or not reply.body.get("accessToken")
                ):
                    raise CloudError(
                        f"UCloud refused the refresh token ({_why(reply)})",
                        hint="log in at cloud.sdu.dk again for a new one, or make an API token",
                        code="cloud-credentials",
                    )
                self._access = str(reply.body["accessToken"])
                self.refreshes += 1
            return self._access

    def _send(
        self, method: str, path: str, body: Any, query: Mapping[str, Any] | None, bearer: str
    ) -> Reply:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(
                {k: _word(v) for k, v in query.items() if v is not None}
            )
        headers = {"Authorization": f"Bearer {bearer}", "Accept": "application/json"}
        if self.project and not self.personal:
            headers["Project"] = self.project
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        status, raw = self._transport(method, url, headers, data)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Reply(status, parsed)

    def _answer(self, reply: Reply, what: str) -> Any:
        if 200 <= reply.status < 300:
            return reply.body
        code = "cloud-credentials" if reply.status in (401, 403) else "cloud-failed"
        hint = (
            (f"the token may lack this project, or have expired: see {TOKEN_ENV} / {PROJECT_ENV}")
            if code == "cloud-credentials"
            else ""
        )
        raise CloudError(f"UCloud refused {what}: {_why(reply)}", hint=hint, code=code)


def _why(reply: Reply) -> str:
    """UCloud's own words for a refusal: `{statusCode, why, errorCode}`, else the text."""
    body = reply.body
    if isinstance(body, dict) and body.get("why"):
        extra = f" [{body['errorCode']}]" if body.get("errorCode") else ""
        return f"{reply.status} {body['why']}{extra}"
    text = str(body or "").strip().splitlines()
    return f"{reply.status} {text[0][:200]}" if text else str(reply.status)


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
