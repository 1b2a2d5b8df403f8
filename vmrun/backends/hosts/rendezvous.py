"""Where the nodes of a multi-node run meet: the master's address as the *other hosts* reach
it, the rendezvous port, and each host's interface for NCCL/gloo.

The address the user SSHes to is often not the one the hosts share (a cloud VM's public IP
is NAT'd; HPC nodes have a management and a fast network). So the master's candidates are
its own IPv4 interface addresses, best first: on a subnet that holds the most workers'
addresses, then not a container bridge (docker0 and friends look shared but are not), then
private; the address vmrun reached it at comes last. `private_addr` in vmrun.toml replaces
them all. Then every worker really connects to every candidate on the rendezvous port (a
listener on the master answers each probe with a nonce), and the first candidate that every
worker reached wins. Nothing is launched before that check passes.

Each host's interface is the one on its route to the chosen address (the master's: the one
holding it); it becomes NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, because gloo otherwise
binds to whatever the hostname resolves to, and Ubuntu's /etc/hosts maps it to 127.0.1.1
("connectFullMesh failed ... remote=[127.0.0.1]"). `ifname` in vmrun.toml overrides it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from vmrun.backends.hosts.netfacts import Iface, Layout, NodeFacts, Pair, Probe, is_ip
from vmrun.backends.hosts.probes import Listener, ports_from, probe
from vmrun.errors import RemoteError, UnreachableError, UsageError
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures


def candidates(master: NodeFacts, workers: Sequence[NodeFacts], override: str = "") -> list[str]:
    """The master's addresses the workers might reach it at, best first (module docstring)."""
    if override:
        return [override]
    worker_addrs = [
        ipaddress.IPv4Address(a)
        for w in workers
        for a in {i.addr for i in w.ifaces} | ({w.reached_at} if is_ip(w.reached_at) else set())
    ]

    def score(item: tuple[int, Iface]) -> tuple[int, bool, bool, int]:
        index, iface = item
        net = iface.network
        shared = len({str(a) for a in worker_addrs if a in net})
        return (-shared, iface.virtual, not ipaddress.IPv4Address(iface.addr).is_private, index)

    ordered = [iface.addr for _, iface in sorted(enumerate(master.ifaces), key=score)]
    if master.reached_at and master.reached_at not in ordered:
        ordered.append(master.reached_at)
    return list(dict.fromkeys(ordered))


def pick(cands: Sequence[str], probes: Sequence[Probe], workers: Sequence[str]) -> str | None:
    """The first candidate every worker reached."""
    for addr in cands:
        reached = {p.worker for p in probes if p.ok and p.target.rpartition(":")[0] == addr}
        if all(w in reached for w in workers):
            return addr
    return None


def decide(
    group: Group,
    pythons: Mapping[str, str],
    facts: Mapping[str, NodeFacts],
    master: str,
    *,
    port: int | None = None,
    override_addr: str = "",
    ifname_overrides: Mapping[str, str] | None = None,
) -> Layout:
    """Choose and check the rendezvous address and port, and each host's interface; raise
    (naming who cannot reach whom) when no address of the master works for every worker."""
    workers = [label for label in facts if label != master]
    cands = candidates(facts[master], [facts[w] for w in workers], override_addr)
    if not cands:
        raise RemoteError(
            "the master has no IPv4 address the other hosts could use",
            host=master,
            hint="set private_addr for it in vmrun.toml",
            code="no-master-address",
        )
    listener = Listener(
        group.connections[master], pythons[master], ports_from(port), timeout=120
    ).start()
    try:
        if listener.busy:
            raise UsageError(
                f"port {ports_from(port)[0]}"
                + ("" if port is not None else f"-{ports_from(port)[-1]}")
                + " is in use on the master",
                host=master,
                hint="pick a free one with --rdzv-port",
                code="port-busy",
            )
        assert listener.port is not None
        targets = [f"{a}:{listener.port}" for a in cands]
        outcomes = group.map(
            lambda entry, conn: probe(conn, pythons[entry.label], listener.nonce, targets),
            only=set(workers),
        )
    finally:
        listener.stop()
    raise_for_failures(outcomes)
    probes = [p for o in outcomes for p in o.value or []]
    chosen = pick(cands, probes, workers)
    if chosen is None:
        raise UnreachableError(
            _unreachable_message(master, cands, listener.port, probes, workers),
            hint="open the port between the hosts, or set private_addr for the master in"
            " vmrun.toml to an address they reach (`vmrun doctor` checks every pair)",
            code="rendezvous-unreachable",
        )
    ifnames = {}
    for label in facts:
        if label == master:
            iface = facts[master].iface_of(chosen) or _iface_towards(facts[master], probes)
            ifnames[label] = iface.ifname if iface else ""
        else:
            ifnames[label] = next(
                (
                    p.ifname
                    for p in probes
                    if p.worker == label and p.target.startswith(f"{chosen}:")
                ),
                "",
            )
        ifnames[label] = (ifname_overrides or {}).get(label) or ifnames[label]
    return Layout(master, chosen, listener.port, ifnames)


def _iface_towards(master: NodeFacts, probes: Sequence[Probe]) -> Iface | None:
    """The master's interface on the workers' subnet, when the address they reach it at is
    not on any of its interfaces (a NAT'd or forwarded `private_addr`)."""
    for p in probes:
        if p.ok and p.src:
            for iface in master.ifaces:
                if ipaddress.IPv4Address(p.src) in iface.network:
                    return iface
    return None


def _unreachable_message(
    master: str, cands: Sequence[str], port: int, probes: Sequence[Probe], workers: Sequence[str]
) -> str:
    parts = []
    for w in workers:
        failed = [p for p in probes if p.worker == w and not p.ok]
        if len(failed) == len(cands):
            why = ", ".join(f"{p.target} ({p.error})" for p in failed)
            parts.append(f"{w} cannot reach {master} at {why}")
    return "; ".join(parts) or (
        f"no single address of {master} on port {port} is reachable from every other host"
    )


def mesh(
    group: Group,
    pythons: Mapping[str, str],
    facts: Mapping[str, NodeFacts],
    *,
    port: int | None = None,
    override_addrs: Mapping[str, str] | None = None,
) -> list[Pair]:
    """Every host listens; every host probes every other host's candidate addresses."""
    labels = list(facts)
    cands = {
        label: candidates(
            facts[label],
            [facts[o] for o in labels if o != label],
            (override_addrs or {}).get(label, ""),
        )
        for label in labels
    }
    listeners: dict[str, Listener] = {}
    try:
        for label in labels:
            listeners[label] = Listener(
                group.connections[label], pythons[label], ports_from(port), timeout=120
            ).start()
        busy = [label for label, li in listeners.items() if li.busy]
        if busy:
            raise UsageError(
                f"no free port to probe with on {', '.join(busy)}",
                hint="pick --rdzv-port",
                code="port-busy",
            )
        targets = {
            label: [f"{a}:{li.port}" for a in cands[label]] for label, li in listeners.items()
        }

        def work(entry: Any, conn: Connection) -> list[Probe]:
            found: list[Probe] = []
            for other in labels:
                if other != entry.label and targets[other]:
                    found += probe(
                        conn, pythons[entry.label], listeners[other].nonce, targets[other]
                    )
            return found

        outcomes = group.map(work)
    finally:
        for li in listeners.values():
            li.stop()
    raise_for_failures(outcomes)
    pairs = []
    for outcome, src in zip(outcomes, labels, strict=True):
        probes = outcome.value or []
        for dst in labels:
            if dst == src:
                continue
            mine = [p for p in probes if p.target in targets[dst]]
            good = next((p for p in mine if p.ok), None)
            via = (
                good.target
                if good
                else (", ".join(f"{p.target} ({p.error})" for p in mine) or "no address to try")
            )
            pairs.append(Pair(src, dst, good is not None, via))
    return pairs
