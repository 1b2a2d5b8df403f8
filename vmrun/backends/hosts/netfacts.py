"""What vmrun knows of a node's network, as values: its interfaces and names (from the host
probe, vmrun/hostside/netprobe.py), a probe's answer, the rendezvous layout decided, and a
pair of hosts' reachability (doctor's mesh)."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

from vmrun.errors import RemoteError

_VIRTUAL = ("docker", "br-", "virbr", "veth", "cni", "flannel", "cali", "vxlan", "podman", "lxc")


@dataclass(frozen=True)
class Iface:
    ifname: str
    addr: str
    prefixlen: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.addr}/{self.prefixlen}", strict=False)

    @property
    def virtual(self) -> bool:
        return self.ifname.startswith(_VIRTUAL)


@dataclass
class NodeFacts:
    """What `netprobe facts` said about one host (plus the address vmrun reached it at)."""

    label: str
    hostname: str = ""
    fqdn: str = ""
    ifaces: list[Iface] = field(default_factory=list)
    reached_at: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, label: str, text: str, reached_at: str = "") -> NodeFacts:
        try:
            data = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(
                f"the host's network probe gave no answer ({text.strip()[-200:]!r})", host=label
            ) from None
        ifaces = []
        for item in data.get("addrs", []):
            try:
                iface = Iface(str(item["ifname"]), str(item["addr"]), int(item["prefixlen"]))
                ip = ipaddress.IPv4Address(iface.addr)
            except (KeyError, ValueError, TypeError):
                continue
            if item.get("up", True) and not (ip.is_loopback or ip.is_link_local):
                ifaces.append(iface)
        return cls(label, data.get("hostname", ""), data.get("fqdn", ""), ifaces, reached_at, data)

    def iface_of(self, addr: str) -> Iface | None:
        return next((i for i in self.ifaces if i.addr == addr), None)


def is_ip(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Probe:
    """One worker's attempt to reach one master address."""

    worker: str
    target: str
    ok: bool
    error: str
    src: str
    ifname: str


@dataclass(frozen=True)
class Layout:
    """Where the nodes meet, decided before anything starts."""

    master: str  # the master host's label
    addr: str  # the master's address as the workers reach it
    port: int
    ifnames: dict[str, str]  # host label -> interface towards the master ("" unknown)

    @property
    def endpoint(self) -> str:
        return f"{self.addr}:{self.port}"


@dataclass(frozen=True)
class Pair:
    """Whether `src` reached `dst` on one of dst's addresses (doctor's mesh check)."""

    src: str
    dst: str
    ok: bool
    via: str  # the target that answered, or every target tried with its error
