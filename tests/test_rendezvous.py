"""The pure part of choosing where nodes meet: candidate order and the pick."""

from __future__ import annotations

import json

from vmrun.backends.hosts.netfacts import NodeFacts, Probe
from vmrun.backends.hosts.rendezvous import candidates, pick


def facts(label: str, *addrs: tuple[str, str, int], reached_at: str = "") -> NodeFacts:
    data = {
        "hostname": label,
        "fqdn": label,
        "addrs": [{"ifname": i, "addr": a, "prefixlen": p, "up": True} for i, a, p in addrs],
    }
    return NodeFacts.parse(label, json.dumps(data), reached_at)


def test_the_subnet_shared_with_most_workers_comes_first() -> None:
    master = facts(
        "m",
        ("lo", "127.0.0.1", 8),
        ("eth0", "203.0.113.7", 24),
        ("docker0", "172.17.0.1", 16),
        ("eth1", "10.0.0.5", 24),
        reached_at="198.51.100.9",
    )
    workers = [
        facts("w1", ("eth1", "10.0.0.6", 24), ("docker0", "172.17.0.1", 16)),
        facts("w2", ("eth0", "10.0.0.7", 24), ("eth1", "203.0.113.8", 24)),
    ]
    # 10.0.0.0/24 holds both workers; 203.0.113.0/24 one; docker0 "shares" 172.17/16 with w1
    # but is a container bridge; the NAT'd address vmrun reached the master at comes last.
    assert candidates(master, workers) == ["10.0.0.5", "203.0.113.7", "172.17.0.1", "198.51.100.9"]
    assert candidates(master, workers, override="192.0.2.1") == ["192.0.2.1"]


def test_loopback_link_local_and_down_interfaces_are_never_candidates() -> None:
    data = {
        "addrs": [
            {"ifname": "lo", "addr": "127.0.0.1", "prefixlen": 8, "up": True},
            {"ifname": "eth0", "addr": "169.254.3.4", "prefixlen": 16, "up": True},
            {"ifname": "eth1", "addr": "10.1.1.1", "prefixlen": 24, "up": False},
            {"ifname": "eth2", "addr": "not-an-ip", "prefixlen": 24},
        ]
    }
    assert NodeFacts.parse("m", json.dumps(data)).ifaces == []


def test_pick_wants_an_address_every_worker_reached() -> None:
    probes = [
        Probe("w1", "10.0.0.5:29400", True, "", "10.0.0.6", "eth1"),
        Probe("w1", "203.0.113.7:29400", True, "", "203.0.113.8", "eth0"),
        Probe("w2", "10.0.0.5:29400", False, "timed out", "", ""),
        Probe("w2", "203.0.113.7:29400", True, "", "203.0.113.9", "eth0"),
    ]
    assert pick(["10.0.0.5", "203.0.113.7"], probes, ["w1", "w2"]) == "203.0.113.7"
    assert pick(["10.0.0.5"], probes, ["w1", "w2"]) is None


def test_a_forwarded_master_address_still_finds_the_masters_interface() -> None:
    from vmrun.backends.hosts.rendezvous import _iface_towards

    master = facts("m", ("eth0", "192.0.2.10", 24), ("eth1", "10.0.0.5", 24))
    probes = [Probe("w1", "198.51.100.1:29400", True, "", "10.0.0.6", "eth1")]
    iface = _iface_towards(master, probes)  # 198.51.100.1 is a NAT'd address, not on m
    assert iface is not None and iface.ifname == "eth1"
