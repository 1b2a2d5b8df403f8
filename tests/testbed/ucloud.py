"""STAND-IN for UCloud's API (cloud.sdu.dk): UCloud cannot be reached from here and has no
official fake, so this serves the calls vmrun makes, in the shapes of UCloud's own source
(SDU-eScience/UCloud: shared/pkg/orchestrators/jobs.go and ssh.go, shared/pkg/accounting/
products.go, core2/pkg/foundation/auth_tokens.go, shared/pkg/util/http.go).

- tokens: refresh tokens exchanged at POST /auth/refresh (the refresh token as the bearer)
  for access tokens that expire after `access_ttl` seconds; an expired or unknown bearer
  is a guest, answered 403 `{"statusCode": 403, "why": "Forbidden"}` as UCloud does;
  personal API tokens (`uc...`) are bearers themselves;
- jobs: created IN_QUEUE, RUNNING after `queue_polls` reads, then (unless `announce_ssh`
  is off) an update `SSH: Connected! Available at: ssh USER@HOST -p PORT`, from `boot(job)`
  (the e2e tests boot a test host there, with the account's SSH keys; its user is the
  bed's, not `ucloud`); suspend, unsuspend,
  terminate (SUCCESS); browse with labels; retrieveProducts with VM support and prices;
- SSH keys: /api/ssh (the e2e tests' `boot` installs them in the test host), deleted;
- private networks (shared/pkg/orchestrators/private_network.go, im2/pkg/integrations/k8s/
  shared/private_network.go): retrieveProducts (none where `network_products` lacks the
  provider), create with UCloud's refusals (a subdomain taken, case-insensitive, 409; a
  reserved one, `j`, `ucloud`, `vm`, `im`, `policy` alone or before `-`, or one with a dot,
  400), browse with each network's members (its jobs not ended), delete (refused while a
  job is a member); a job's `hostname` and `private_network` resource join it, and `boot`
  is told (`VmHosts` below wires the test hosts' isolation from it).
- a refusal queued with `refuse(path, status, why)`: UCloud's error body.

`FakeUCloud` is a transport (vmrun.providers.ucloud.session.Transport) for quick tests, and
`serve()` puts it on a loopback port (a real HTTP server) for the CLI.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REFRESH = "refresh.token.of-the-test-user"
API_TOKEN = "uc7-testsecret"
PRODUCTS = [  # (provider, category, name, gpus, price in millionths of DKK a minute)
    ("ucloud", "u1-standard", "u1-standard-2", 0, 35_000),
    ("ucloud", "u1-standard", "u1-standard-8", 0, 140_000),
    ("aau", "uc-t4", "uc-t4-1", 1, 250_000),
]


class FakeUCloud:
    def __init__(
        self,
        *,
        access_ttl: float = 600.0,
        queue_polls: int = 1,
        announce_ssh: bool = True,
        boot: Callable[[dict[str, Any]], tuple[str, str, int]] | None = None,
        network_products: tuple[str, ...] = ("ucloud",),
    ) -> None:
        self.network_products = network_products
        self.networks: dict[str, dict[str, Any]] = {}
        self.access_ttl = access_ttl
        self.queue_polls = queue_polls
        self.announce_ssh = announce_ssh
        self.boot = boot or (lambda job: ("ucloud", f"10.99.0.{int(job['id']) % 250}", 22))
        self.jobs: dict[str, dict[str, Any]] = {}
        self.keys: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str]] = []  # (method, path)
        self.projects: list[str] = []  # the Project header of each authenticated call
        self.refreshed = 0
        self._access: dict[str, float] = {}
        self._refusals: dict[str, list[tuple[int, str]]] = {}
        self._ids = itertools.count(48920)
        self._lock = threading.RLock()

    # -- test controls --------------------------------------------------------------------

    def refuse(self, path: str, status: int, why: str) -> None:
        """The next call to `path` is refused with UCloud's error body."""
        self._refusals.setdefault(path, []).append((status, why))

    def terminate_all(self) -> None:
        with self._lock:
            for job in self.jobs.values():
                if job["status"]["state"] not in ("SUCCESS", "FAILURE", "EXPIRED"):
                    self._set(job, "SUCCESS", "Your job has been cancelled")

    def live(self) -> list[str]:
        return [
            j
            for j, job in self.jobs.items()
            if job["status"]["state"] not in ("SUCCESS", "FAILURE", "EXPIRED")
        ]

    # -- the transport --------------------------------------------------------------------

    def __call__(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        parts = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parts.query))
        data = json.loads(body) if body else None
        status, answer = self.handle(method, parts.path, query, headers, data)
        return status, json.dumps(answer).encode()

    def handle(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: Any,
    ) -> tuple[int, Any]:
        with self._lock:
            self.calls.append((method, path))
            bearer = headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if path == "/auth/refresh" and method == "POST":
                if bearer != REFRESH:
                    return _error(401, "Unauthorized")
                token = f"access-{next(self._ids)}"
                self._access[token] = time.monotonic() + self.access_ttl
                self.refreshed += 1
                return 200, {"accessToken": token, "csrfToken": "csrf"}
            if not (bearer == API_TOKEN or self._access.get(bearer, 0) > time.monotonic()):
                return _error(403, "Forbidden")
            self.projects.append(headers.get("Project", ""))
            if self._refusals.get(path):
                return _error(*self._refusals[path].pop(0))
            route = _ROUTES.get((method, path))
            if route is None:
                return 404, "404 page not found"
            return route(self, query, body)

    # -- the API --------------------------------------------------------------------------

    def _products(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        by: dict[str, list[Any]] = {}
        for provider, category, name, gpus, price in PRODUCTS:
            product = {
                "type": "compute",
                "name": name,
                "productType": "COMPUTE",
                "price": price,
                "cpu": 2,
                "memoryInGigs": 8,
                "gpu": gpus,
                "category": {
                    "name": category,
                    "provider": provider,
                    "productType": "COMPUTE",
                    "accountingUnit": {"name": "DKK", "floatingPoint": True},
                    "accountingFrequency": "PERIODIC_MINUTE",
                    "freeToUse": False,
                },
            }
            support = {
                "product": {"id": name, "category": category, "provider": provider},
                "virtualMachine": {"enabled": True},
            }
            by.setdefault(provider, []).append({"product": product, "support": support})
        return 200, {"productsByProvider": by}

    def _create(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        responses = []
        for spec in body.get("items", []):
            known = {(p[0], p[2]) for p in PRODUCTS}
            product = spec.get("product") or {}
            if (product.get("provider"), product.get("id")) not in known:
                return _error(400, "invalid product requested")
            if (spec.get("application") or {}).get("name") != "vm-ubuntu":
                return _error(400, "unknown application requested")
            for res in spec.get("resources") or []:
                if res.get("type") == "private_network" and str(res.get("id")) not in self.networks:
                    return _error(400, "unknown private network requested")
            job_id = str(next(self._ids))
            now = int(time.time() * 1000)
            self.jobs[job_id] = {
                "id": job_id,
                "createdAt": now,
                "owner": {"createdBy": "user", "project": None},
                "specification": spec,
                "reads": 0,
                "status": {"state": "IN_QUEUE", "startedAt": None},
                "updates": [
                    {
                        "state": "IN_QUEUE",
                        "status": "Your job is now in the queue",
                        "timestamp": now,
                    }
                ],
            }
            responses.append({"id": job_id})
        return 200, {"responses": responses}

    def _advance(self, job: dict[str, Any]) -> None:
        """A read moves a queued job on: RUNNING after `queue_polls` reads, then its SSH line."""
        job["reads"] += 1
        if job["status"]["state"] == "IN_QUEUE" and job["reads"] > self.queue_polls:
            self._run(job)

    def _run(self, job: dict[str, Any]) -> None:
        now = int(time.time() * 1000)
        job["status"]["state"] = "RUNNING"
        job["updates"].append(
            {"state": "RUNNING", "status": "Your job is now running!", "timestamp": now}
        )
        if self.announce_ssh:
            user, host, port = self.boot(job)
            job["updates"].append(
                {
                    "status": f"SSH: Connected! Available at: ssh {user}@{host} -p {port}",
                    "timestamp": now,
                }
            )

    def _view(self, job: dict[str, Any], query: Mapping[str, str]) -> dict[str, Any]:
        shown = {k: v for k, v in job.items() if k != "reads"}
        if query.get("includeUpdates") != "true":
            shown["updates"] = []
        return shown

    def _retrieve(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        job = self.jobs.get(query.get("id", ""))
        if job is None:
            return _error(404, "not found")
        self._advance(job)
        return 200, self._view(job, query)

    def _browse(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        for job in self.jobs.values():
            self._advance(job)
        items = [self._view(j, query) for j in self.jobs.values()]
        return 200, {"items": items, "next": None, "itemsPerPage": 250}

    def _each(self, body: Any, change: Callable[[dict[str, Any]], None]) -> tuple[int, Any]:
        for item in body.get("items", []):
            job = self.jobs.get(str(item.get("id")))
            if job is None:
                return _error(404, "not found")
            change(job)
        return 200, {"responses": [{} for _ in body.get("items", [])]}

    def _set(self, job: dict[str, Any], state: str, text: str) -> None:
        job["status"]["state"] = state
        job["updates"].append(
            {"state": state, "status": text, "timestamp": int(time.time() * 1000)}
        )

    def _terminate(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        return self._each(body, lambda j: self._set(j, "SUCCESS", "Your job has been cancelled"))

    def _suspend(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        return self._each(body, lambda j: self._set(j, "SUSPENDED", "Your job was suspended"))

    def _unsuspend(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        return self._each(body, self._run)

    def _network_products(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        by = {
            provider: [
                {
                    "product": {
                        "type": "private_network",
                        "name": "private-network",
                        "productType": "PRIVATE_NETWORK",
                        "price": 0,
                        "category": {
                            "name": "private-network",
                            "provider": provider,
                            "productType": "PRIVATE_NETWORK",
                            "freeToUse": True,
                        },
                    },
                    "support": {
                        "product": {
                            "id": "private-network",
                            "category": "private-network",
                            "provider": provider,
                        }
                    },
                }
            ]
            for provider in self.network_products
        }
        return 200, {"productsByProvider": by}

    def _network_create(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        responses = []
        for spec in body.get("items", []):
            sub = str(spec.get("subdomain") or "")
            product = spec.get("product") or {}
            if product.get("provider") not in self.network_products:
                return _error(400, "invalid product requested")
            if not sub or "." in sub or not str(spec.get("name") or "").strip():
                return _error(400, "invalid name or subdomain")
            if any(sub == r or sub.startswith(r + "-") for r in RESERVED):
                return _error(400, "Reserved domain name, try a different one")
            if any(
                n["specification"]["subdomain"].lower() == sub.lower()
                for n in self.networks.values()
            ):
                return _error(
                    409, "a network with this subdomain already exists, try a different one"
                )
            net_id = str(next(self._ids))
            self.networks[net_id] = {"id": net_id, "specification": dict(spec)}
            responses.append({"id": net_id})
        return 200, {"responses": responses}

    def members(self, net_id: str) -> list[str]:
        """The jobs in the network: those not ended (PrivateNetworkStatus.Members)."""
        return [
            j
            for j in self.live()
            if any(
                r.get("type") == "private_network" and str(r.get("id")) == net_id
                for r in self.jobs[j]["specification"].get("resources") or []
            )
        ]

    def _network_browse(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        items = [{**n, "status": {"members": self.members(i)}} for i, n in self.networks.items()]
        return 200, {"items": items, "next": None, "itemsPerPage": 250}

    def _network_delete(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        for item in body.get("items", []):
            net_id = str(item.get("id"))
            if net_id not in self.networks:
                return _error(404, "not found")
            if self.members(net_id):
                return _error(400, "the private network is in use by a job")
        for item in body.get("items", []):
            del self.networks[str(item.get("id"))]
        return 200, {}

    def _ssh_delete(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        gone = {str(item.get("id")) for item in body.get("items", [])}
        self.keys = [k for k in self.keys if k["id"] not in gone]
        return 200, {}

    def _ssh_browse(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        return 200, {"items": list(self.keys), "next": None, "itemsPerPage": 250}

    def _ssh_create(self, query: Mapping[str, str], body: Any) -> tuple[int, Any]:
        ids = []
        for item in body.get("items", []):
            key_id = str(next(self._ids))
            self.keys.append({"id": key_id, "specification": dict(item)})
            ids.append({"id": key_id})
        return 200, {"responses": ids}

    # -- over HTTP ------------------------------------------------------------------------

    def serve(self, host: str = "127.0.0.1") -> Served:
        return Served(self, host)


_ROUTES: dict[tuple[str, str], Callable[[FakeUCloud, Mapping[str, str], Any], tuple[int, Any]]] = {
    ("GET", "/api/jobs/retrieveProducts"): FakeUCloud._products,
    ("POST", "/api/jobs"): FakeUCloud._create,
    ("GET", "/api/jobs/retrieve"): FakeUCloud._retrieve,
    ("GET", "/api/jobs/browse"): FakeUCloud._browse,
    ("POST", "/api/jobs/terminate"): FakeUCloud._terminate,
    ("POST", "/api/jobs/suspend"): FakeUCloud._suspend,
    ("POST", "/api/jobs/unsuspend"): FakeUCloud._unsuspend,
    ("GET", "/api/ssh/browse"): FakeUCloud._ssh_browse,
    ("POST", "/api/ssh"): FakeUCloud._ssh_create,
    ("DELETE", "/api/ssh"): FakeUCloud._ssh_delete,
    ("GET", "/api/private-networks/retrieveProducts"): FakeUCloud._network_products,
    ("POST", "/api/private-networks"): FakeUCloud._network_create,
    ("GET", "/api/private-networks/browse"): FakeUCloud._network_browse,
    ("DELETE", "/api/private-networks"): FakeUCloud._network_delete,
}
RESERVED = ("j", "ucloud", "vm", "im", "policy")  # k8s/shared/private_network.go


class VmHosts:
    """STAND-IN for how UCloud's provider isolates VM jobs (im2/pkg/integrations/k8s/kubevirt
    /00_module.go: a NetworkPolicy per VM that admits only itself; shared/private_network.go:
    every port open between a private network's members, each reached by its hostname).

    The test hosts given are on "main", where only the SSH gateway may reach their sshd,
    and on `wire`, the private networks' one wire. `boot(job)` (the fake's, in the laptop's
    namespace) takes the next free host for a job, puts the account's SSH keys in it, opens
    the job's port on the gateway (`Gateway`: the laptop's address on "main", a port per
    job, as UCloud's `ssh ucloud@HOST -p PORT`) and rewires every booted host: its firewall
    (nftables, policy drop) admits the gateway's SSH and, on the wire, only the members of
    its own networks; its /etc/hosts names every member by the job's hostname (the
    network's DNS). A job without a network reaches nobody, as on UCloud."""

    def __init__(self, fake: FakeUCloud, hosts: list[Any], laptop: Any, wire: str = "ucpn") -> None:
        self.fake = fake
        self.free = list(hosts)
        self.laptop = laptop
        self.wire = wire
        self.gateway = Gateway(laptop.addr_on("main"))
        self.booted: dict[str, Any] = {}  # job id -> test host
        self.ports: dict[str, int] = {}  # job id -> its port on the gateway
        self._hosts_files = {h.netns: _read(h) for h in hosts}

    def boot(self, job: dict[str, Any]) -> tuple[str, str, int]:
        job_id = str(job["id"])
        if job_id not in self.booted:  # a job run again (unsuspended) keeps its VM
            host = self.free.pop(0)
            for item in self.fake.keys:  # UCloud's provider puts the account's keys in it
                host.add_authorized_key(item["specification"]["key"])
            self.booted[job_id] = host
            self.ports[job_id] = self.gateway.open(host.addr_on("main"), host.port)
        self.rewire()
        return self.booted[job_id].user, self.gateway.addr, self.ports[job_id]

    def close(self) -> None:
        self.gateway.close()

    def rewire(self) -> None:
        from .cloud import _apply_nft
        from .files import write_text
        from .layout import ETC_NETNS

        live = set(self.fake.live())
        nets = {
            job_id: {
                str(r.get("id"))
                for r in self.fake.jobs[job_id]["specification"].get("resources") or []
                if r.get("type") == "private_network"
            }
            for job_id in self.booted
        }
        for job_id, host in self.booted.items():
            peers = [
                (other, self.booted[other])
                for other in self.booted
                if other in live and nets[job_id] & nets[other]
            ]
            rules = [f"ip saddr {self.gateway.addr} tcp dport {host.port} accept"]
            rules += [f"ip saddr {p.addr_on(self.wire)} accept" for o, p in peers if p is not host]
            _apply_nft(host, rules)
            names = "".join(
                f"{p.addr_on(self.wire)}\t{self.fake.jobs[o]['specification']['hostname']}\n"
                for o, p in peers
                if self.fake.jobs[o]["specification"].get("hostname")
            )
            write_text(ETC_NETNS / host.netns / "hosts", self._hosts_files[host.netns] + names)


class Gateway:
    """STAND-IN for UCloud's SSH gateway (im2/pkg/integrations/k8s/shared/ssh.go): one
    address, a port per VM job, each forwarded to that VM's sshd. Open its ports from the
    laptop's namespace (the fake's `boot` runs there); what it forwards comes from its own
    address, the only one the VMs' firewalls let reach their sshd."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self, host: str, port: int) -> int:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((self.addr, 0))
        server.listen(16)
        self._keep(server)
        threading.Thread(target=self._accept, args=(server, (host, port)), daemon=True).start()
        return int(server.getsockname()[1])

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self, server: socket.socket, target: tuple[str, int]) -> None:
        while True:
            try:
                near, _ = server.accept()
            except OSError:  # closed
                return
            try:
                far = socket.create_connection(target, timeout=10)
            except OSError:
                near.close()
                continue
            far.settimeout(None)
            self._keep(near)
            self._keep(far)
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """One direction of a forwarded connection, until its end; then the other side hears it."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _read(host: Any) -> str:
    from .layout import ETC_NETNS

    return (ETC_NETNS / host.netns / "hosts").read_text()


def _error(status: int, why: str) -> tuple[int, Any]:
    return status, {"statusCode": status, "why": why, "errorCode": "", "detailedCode": 0}


class Served:
    """The fake on a loopback port (plain HTTP), until closed: `url` for VMRUN_UCLOUD_URL."""

    def __init__(self, fake: FakeUCloud, host: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _do(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else None
                status, answer = fake(self.command, self.path, dict(self.headers), raw)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_DELETE = _do

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
