"""Where a bed puts things and what it calls them: names, paths and the address plan.

Everything a bed creates is named ``<prefix>-...`` (prefix like ``vmt1a2b``), so
leftovers can be recognised by name alone.  Every network is a /24 out of
``10.231.0.0/16``; the root namespace gets an ``unreachable 10.231.0.0/16``
guard route per bed, told apart by its metric (derived from the prefix).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from .tools import IP, run_cmd

NETNS_RUN_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
DEFAULT_HOME_ROOT = Path("/home/vmt-testbed")
SUPERNET = "10.231"  # every bed network is a /24 out of 10.231.0.0/16
DEFAULT_PREFIX_PATTERN = r"vmt[0-9a-f]{4}"
NFT_TABLE = "vmt_testbed"
ROUTE_PROTO = 231  # marks the bed's root-namespace "unreachable 10.231.0.0/16" routes
FIRST_HOST_OCTET = 11
SWITCH_SUFFIX = "sw"

HOST_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,22}$")  # user name <prefix>-<name> stays <= 32
NET_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{2,9}$")  # no '-': "<prefix>-" must be unambiguous


@dataclass
class Network:
    """One bed network: a bridge in the switch namespace and a /24."""

    name: str
    index: int  # 0 = main
    octet: int  # third octet: 10.231.<octet>.0/24
    bridge: str

    def addr(self, host_octet: int) -> str:
        return f"{SUPERNET}.{self.octet}.{host_octet}"


def mac(prefix: str, net_index: int, host_octet: int) -> str:
    """Fixed MAC of a bed interface: ``02:<prefix hash>:<net>:00:<octet>``."""
    seed = zlib.crc32(prefix.encode())
    return f"02:{seed >> 8 & 0xFF:02x}:{seed & 0xFF:02x}:{net_index:02x}:00:{host_octet:02x}"


def root_ns_subnets() -> set[int]:
    """Third octets of 10.231.x.y addresses already used in the root namespace."""
    out = run_cmd([IP, "-4", "-o", "addr", "show"], check=False).stdout
    used = set()
    for m in re.finditer(r"inet 10\.231\.(\d+)\.\d+/", out):
        used.add(int(m.group(1)))
    return used


def route_metric(prefix: str) -> int:
    """Per-bed metric of its ``unreachable 10.231.0.0/16`` route, derived from the prefix
    so that cleanup needs no memory (unique for the default ``vmt<4 hex>`` prefixes)."""
    m = re.fullmatch(r"vmt([0-9a-f]{4})", prefix)
    if m:
        return 231_000_000 + int(m.group(1), 16)
    return 231_065_536 + zlib.crc32(prefix.encode()) % 900_000


def guard_routes() -> dict[int, str]:
    """metric -> route line of every guard route in the root namespace."""
    out = run_cmd([IP, "-4", "-o", "route", "show", "type", "unreachable"], check=False).stdout
    found = {}
    for line in out.splitlines():
        m = re.search(rf"{SUPERNET}\.0\.0/16 .*proto {ROUTE_PROTO} .*metric (\d+)", line)
        if m:
            found[int(m.group(1))] = line.strip()
    return found


def guard_route_del(metric: int) -> str:
    """The ``ip -batch`` line that deletes the guard route with ``metric``."""
    return f"route del unreachable {SUPERNET}.0.0/16 metric {metric}"
