"""STAND-IN for the AWS instance metadata service (IMDS), which exists only on an EC2
instance: the test bed runs it on 169.254.169.254:80 inside one test host's own network
namespace, so that host's processes reach it at the real address and no other host does.

It answers as AWS documents IMDSv2 (docs.aws.amazon.com, "Use the Instance Metadata Service
to access instance metadata" and "Spot Instance interruption notices"):
- PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1..21600): a token; a
  PUT without it is 400;
- every GET needs X-aws-ec2-metadata-token (a token it gave): else 401;
- /latest/meta-data/instance-id: the instance's id;
- /latest/meta-data/spot/instance-action: 404 until the test writes an interruption into
  STATE, then `{"action": "terminate", "time": "2026-...Z"}`;
- /latest/meta-data/events/recommendations/rebalance: 404 until STATE has one, then
  `{"noticeTime": "..."}`.

    python3 imds.py ADDRESS PORT STATE LOG

STATE: a JSON object the test rewrites (`instance-action`, `rebalance`), read on every
request; LOG: one line per request (METHOD PATH TOKEN-OK), for asserting the IMDSv2 order.
"""

from __future__ import annotations

import http.server
import json
import secrets
import sys
from pathlib import Path

ADDRESS, PORT, STATE, LOG = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
TOKENS: set[str] = set()
PATHS = {
    "/latest/meta-data/spot/instance-action": "instance-action",
    "/latest/meta-data/events/recommendations/rebalance": "rebalance",
}


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _log(self, ok: bool) -> None:
        with LOG.open("a") as fh:
            fh.write(f"{self.command} {self.path} {'ok' if ok else 'no-token'}\n")

    def do_PUT(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        self._log(ttl.isdigit())
        if self.path != "/latest/api/token" or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            self._answer(400)
            return
        token = secrets.token_urlsafe(24)
        TOKENS.add(token)
        self._answer(200, token)

    def do_GET(self) -> None:
        ok = self.headers.get("X-aws-ec2-metadata-token", "") in TOKENS
        self._log(ok)
        if not ok:
            self._answer(401)
            return
        state = json.loads(STATE.read_text()) if STATE.is_file() else {}
        if self.path == "/latest/meta-data/instance-id":
            self._answer(200, state.get("instance-id", "i-0123456789abcdef0"))
        elif self.path in PATHS and state.get(PATHS[self.path]):
            self._answer(200, json.dumps(state[PATHS[self.path]]))
        else:
            self._answer(404)

    def log_message(self, *args: object) -> None:
        pass


server = http.server.ThreadingHTTPServer((ADDRESS, PORT), Handler)
print("listening", flush=True)
server.serve_forever()
