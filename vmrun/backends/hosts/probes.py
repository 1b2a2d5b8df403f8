"""The host probe (vmrun/hostside/netprobe.py, run by the host's own Python): a node's facts
in one round trip, a listener that answers probes with a nonce, and connection probes from
one host to others' addresses. The rendezvous decision is vmrun.backends.hosts.rendezvous'."""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Sequence
from typing import Any

from vmrun import hostside
from vmrun.backends.hosts.netfacts import NodeFacts, Probe, is_ip
from vmrun.errors import RemoteError, UsageError
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection

DEFAULT_PORT = 29400  # torchrun's own default for a c10d endpoint
PORT_TRIES = 20  # the next ports are tried when the default one is taken on the master
PROBE_TIMEOUT = 3.0


def gather_facts(conn: Connection, python: str, *, versions: bool, disk: str = "") -> NodeFacts:
    """One round trip: the host's names, interfaces, clock (and torch versions, disk)."""
    from vmrun.transfer.streams import capture

    args = ["facts"] + (["--versions"] if versions else []) + (["--disk", disk] if disk else [])
    command = quoting.plain_command(hostside.command("netprobe.py", *args, python=python))
    status, out, err = capture(conn, command, what="the host probe")
    if status != 0:
        raise RemoteError(
            f"{python} could not run vmrun's host probe: {err.strip()[-300:] or status}",
            host=conn.label,
        )
    reached = ""
    try:
        reached = str(conn.transport.getpeername()[0])
    except Exception:  # a ProxyJump channel has no peer address of its own
        reached = conn.target.hostname if conn.target and is_ip(conn.target.hostname) else ""
    return NodeFacts.parse(conn.label, out.decode("utf-8", "replace"), reached)


class Listener:
    """The probe listener on one host: an exec channel that stays open until `stop()`
    (closing it makes the host's run wrapper kill the listener, freeing the port)."""

    def __init__(self, conn: Connection, python: str, ports: Sequence[int], timeout: float):
        self.conn = conn
        self.nonce = secrets.token_hex(8)
        self.port: int | None = None
        self.busy = False
        self.peers: list[tuple[str, str]] = []
        self._ready = threading.Event()
        self._argv = [
            *hostside.command("netprobe.py", python=python),
            "listen",
            ",".join(map(str, ports)),
            "1000000",
            str(timeout),
            self.nonce,
        ]
        self._chan: Any = None
        self._thread = threading.Thread(target=self._pump, daemon=True)

    def _deliver(self, stream: str, data: bytes) -> None:
        if stream != "out":
            return
        for line in data.decode("utf-8", "replace").splitlines():
            word, _, rest = line.partition(" ")
            if word == "LISTEN":
                self.port = int(rest)
                self._ready.set()
            elif word == "BUSY":
                self.busy = True
                self._ready.set()
            elif word == "PEER":
                label, _, addr = rest.partition(" ")
                self.peers.append((label, addr))

    def _pump(self) -> None:
        with contextlib.suppress(Exception):  # closed by stop(), or the host went away
            self.conn.drain(self._chan, self._deliver, "while listening for probes")
        self._ready.set()

    def start(self) -> Listener:
        self.conn.ensure_lib()
        self._chan = self.conn.open_session()
        self._chan.exec_command(quoting.remote_command(self._argv))
        self._chan.sendall(quoting.env_header(None))
        self._thread.start()
        self._ready.wait(30)
        if self.port is None and not self.busy:
            self.stop()
            raise RemoteError(
                "the reachability probe's listener did not start", host=self.conn.label
            )
        return self

    def stop(self) -> None:
        if self._chan is not None:
            self._chan.close()
        self._thread.join(5)


def probe(
    conn: Connection,
    python: str,
    nonce: str,
    targets: Sequence[str],
    timeout: float = PROBE_TIMEOUT,
) -> list[Probe]:
    """From this host, connect to every target at once; one Probe each."""
    result = conn.run(
        [
            *hostside.command("netprobe.py", python=python),
            "connect",
            nonce,
            conn.label,
            str(timeout),
            *targets,
        ],
        timeout=timeout + 30,
    )
    try:
        items = json.loads(result.stdout_tail.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(
            f"the reachability probe failed: {result.output_tail(3)}", host=conn.label
        ) from None
    return [
        Probe(
            conn.label,
            i["target"],
            bool(i["ok"]),
            i.get("error", ""),
            i.get("src", ""),
            i.get("ifname", ""),
        )
        for i in items
    ]


def ports_from(port: int | None) -> list[int]:
    """The port asked for, or the default and the next ones to try when it is taken."""
    if port is not None:
        if not 1 <= port <= 65535:
            raise UsageError(f"--rdzv-port {port}: ports are 1-65535")
        return [port]
    return list(range(DEFAULT_PORT, DEFAULT_PORT + PORT_TRIES))
