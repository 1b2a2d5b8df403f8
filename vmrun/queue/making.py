"""Making and removing a Slurm cluster of SSH hosts: every host's facts in one round trip,
the plan (vmrun.queue.conf), the files and the munge key sent over stdin (never on a command
line), the controller first and then the nodes in parallel, and a wait until every node is
idle in sinfo. What changed is the hosts' own answer (slurm_node.sh writes a file only when
its text differs), so a second run changes nothing and says so.

A node added to the list gets the cluster's key (read back from the controller: vmrun keeps
no copy) and the new slurm.conf goes to every host; slurmctld and the slurmds restart to
read it, and running jobs go on (Slurm keeps them in its state folder and slurmstepd
outlives slurmd). A node left out of the list is taken out the same way.
"""

from __future__ import annotations

import base64
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from vmrun import hostside
from vmrun.config import Settings
from vmrun.errors import RemoteError, UsageError
from vmrun.queue.conf import (
    NodeFacts,
    Plan,
    cgroup_conf,
    gres_conf,
    hosts_lines,
    parse_facts,
    slurm_conf,
    slurmdbd_conf,
)
from vmrun.queue.conf import plan as make_plan
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry

IDLE_TIMEOUT_S = 60.0  # slurmds register within seconds; a minute is a node that will not
READY = ("idle", "mixed", "allocated", "completing")  # sinfo %T of a node in service
SCRIPT = "slurm_node.sh"


@dataclass(frozen=True)
class NodeDone:
    """What one host's apply did: files it changed, each service's state, packages added."""

    host: str
    hostname: str
    changed: tuple[str, ...] = ()
    services: dict[str, str] = field(default_factory=dict)  # unit -> started|restarted|running
    installed: tuple[str, ...] = ()

    @property
    def touched(self) -> bool:
        return bool(self.changed or self.installed) or any(
            s != "running" for s in self.services.values()
        )


@dataclass(frozen=True)
class Made:
    """A cluster made (or found as it should be): its nodes and what each did."""

    name: str
    controller: str  # the controller's host label
    nodes: tuple[NodeDone, ...]
    states: dict[str, str]  # Slurm node name -> sinfo's state
    versions: dict[str, str]  # package -> version, on the controller
    partitions: dict[str, tuple[str, ...]]
    shared: str | None
    accounting: bool = False
    taken_out: tuple[str, ...] = ()  # hosts that were nodes and are no more
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.taken_out) or any(n.touched for n in self.nodes)


@dataclass(frozen=True)
class Removed:
    """A cluster taken down: per host, what was stopped and removed; the packages kept."""

    name: str
    hosts: dict[str, tuple[str, ...]]  # host -> its lines (STOPPED unit, REMOVED path, GONE)
    kept: dict[str, str]  # host -> the packages left installed


def _run(
    conn: Connection,
    args: Sequence[str],
    env: dict[str, str] | None = None,
    what: str = "the Slurm node script",
) -> list[str]:
    """slurm_node.sh's lines; its `FAIL why` (or a failure) raised as the host's error."""
    result = conn.run(hostside.command(SCRIPT, *args), env=env, what=what)
    lines = result.stdout_tail.splitlines()
    for line in lines:
        if line.startswith("FAIL "):
            raise RemoteError(line[5:], host=conn.label, code="slurm-host-unfit")
    if not result.ok:
        raise RemoteError(
            f"{what} failed: {result.output_tail(3)}", host=conn.label, code="slurm-host-unfit"
        )
    return lines


def read_facts(conn: Connection, name: str, entry: HostEntry | None = None) -> NodeFacts:
    """The host's facts; its address for the other nodes is the private one vmrun.toml
    records (`up`'s VMs), else the one the SSH session arrived at."""
    private = str(entry.vars.get("private_addr") or "") if entry else ""
    return parse_facts(
        "\n".join(_run(conn, ["facts", name, *([private] if private else [])])), conn.label
    )


def fitness(facts: NodeFacts, name: str, controller: bool, accounting: bool = False) -> str:
    """Why this host cannot be a node of cluster `name` (empty when it can)."""
    if facts.root == "none":
        return "needs root: log in as root or allow the user passwordless sudo"
    if not facts.systemd:
        return "systemd does not run its services (a container or WSL?): use a VM"
    if facts.conf_dir != "/etc/slurm":
        return f"its Slurm reads {facts.conf_dir} (an older distribution): use Slurm 21.08 or later"
    if facts.conf.startswith("other"):
        other = facts.conf[6:].strip()
        what = f"vmrun's cluster {other}" if other else "a Slurm vmrun did not write"
        return f"/etc/slurm/slurm.conf is {what}: remove it first or leave this host out"
    missing = facts.needs(controller=controller, accounting=accounting)
    if missing and not facts.apt:
        return f"packages {' '.join(missing)} are missing and there is no apt-get: install them"
    return ""


def check(
    settings: Settings,
    name: str,
    entries: Sequence[HostEntry],
    controller: HostEntry,
    shared: str | None = None,
    accounting: bool = False,
) -> dict[str, NodeFacts]:
    """Every host's facts, once each can be a node (the controller: the controller); else
    one error naming each host that cannot and why. With `shared`: that folder must be one
    on every host (a token file is all it leaves there)."""
    if controller.label not in [e.label for e in entries]:
        raise UsageError(
            f"--controller {controller.label} is not one of the hosts", code="flags-conflict"
        )
    with Group(entries, settings) as group:
        outcomes = group.map(lambda entry, conn: read_facts(conn, name, entry))
        raise_for_failures(outcomes)
        if shared:
            check_shared(group, name, shared, controller.label, [e.label for e in entries])
    facts = {o.host: o.value for o in outcomes if o.value is not None}
    problems = [
        f"{h}: {why}"
        for h, f in facts.items()
        if (why := fitness(f, name, h == controller.label, accounting))
    ]
    problems += skew(facts, controller.label)
    if problems:
        raise RemoteError("; ".join(problems) + " (nothing was changed)", code="slurm-host-unfit")
    return facts


def _release(version: str) -> tuple[int, ...]:
    """A Slurm package version's release: "22.05.8-4+deb12u3" -> (22, 5)."""
    parts = version.split(".")[:2]
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()


def skew(facts: dict[str, NodeFacts], controller: str) -> list[str]:
    """Slurm's daemons talk to older releases, never newer ones: a slurmd newer than the
    controller's slurmctld is refused (hosts of different distribution releases)."""
    ctld = _release(facts[controller].versions.get("slurmctld", ""))
    if not ctld:
        return []
    return [
        f"{h}: slurmd {f.versions['slurmd']} is newer than the controller's slurmctld"
        f" {facts[controller].versions['slurmctld']}: give every host one release"
        for h, f in facts.items()
        if _release(f.versions.get("slurmd", "")) > ctld
    ]


def make(
    settings: Settings,
    name: str,
    entries: Sequence[HostEntry],
    controller: HostEntry,
    *,
    shared: str | None = None,  # recorded in the result; operations checks it first
    dropped: Sequence[HostEntry] = (),
    facts: dict[str, NodeFacts] | None = None,  # check()'s, when the caller has them
    accounting: bool = False,  # slurmdbd and MariaDB on the controller
    out: Reporter = QUIET,
    idle_timeout: float = IDLE_TIMEOUT_S,
) -> Made:
    """Make `entries` (the controller among them) the Slurm cluster `name`; `dropped`: hosts
    that were its nodes and are left out now (taken out once the others have the new
    configuration). Raises before anything changes when a host cannot be a node."""
    started = time.monotonic()
    labels = [e.label for e in entries]
    if facts is None:
        facts = check(settings, name, entries, controller, accounting=accounting)
    facts = dict(facts)
    with Group([*entries, *dropped], settings) as group:
        installed = _install(group, facts, name, controller.label, accounting)
        ctl = facts[controller.label]
        the_plan = make_plan(name, ctl, [facts[label] for label in labels], accounting)
        conns = group.connections
        key = _key(conns[controller.label], ctl, name)
        out.info(f"slurm: {name}: controller {ctl.hostname}, {len(labels)} node(s)")
        done = {controller.label: _apply(conns[controller.label], the_plan, ctl, key, True)}
        rest = [label for label in labels if label != controller.label]
        if rest:
            applied = group.map(
                lambda _e, conn: _apply(conn, the_plan, facts[conn.label], key, False), only=rest
            )
            raise_for_failures(applied)
            done.update({o.host: o.value for o in applied if o.value is not None})
        taken_out = []
        if dropped:  # often a host that is gone: what cannot be reached is said, not fatal
            removed = group.map(
                lambda _e, conn: _run(conn, ["remove", name]), only=[e.label for e in dropped]
            )
            for o in removed:
                if o.error is not None:
                    out.warn(
                        f"{o.host}: left out of cluster {name}, but not taken down there"
                        f" ({o.error}); its slurmd may still run"
                    )
            taken_out = [e.label for e in dropped]
        states = wait_ready(conns[controller.label], the_plan, idle_timeout)
    return Made(
        name=name,
        controller=controller.label,
        nodes=tuple(replace(done[label], installed=installed.get(label, ())) for label in labels),
        states=states,
        versions=ctl.versions,
        partitions=the_plan.partitions,
        shared=shared,
        accounting=accounting,
        taken_out=tuple(taken_out),
        seconds=time.monotonic() - started,
    )


def _install(
    group: Group, facts: dict[str, NodeFacts], name: str, controller: str, accounting: bool
) -> dict[str, tuple[str, ...]]:
    """The distribution's packages where a host lacks them, before the files are made from
    its facts (read again then: `slurmd -C`'s topology, the slurm user), so that the files
    of a first run are those of every later one. Host -> what it installed."""
    lacking = [
        h for h, f in facts.items() if f.needs(controller=h == controller, accounting=accounting)
    ]
    if not lacking:
        return {}

    def install(entry: HostEntry, conn: Connection) -> tuple[str, ...]:
        ctld = conn.label == controller
        env = {
            "VMRUN_SLURM_CTLD": "1" if ctld else "0",
            "VMRUN_SLURM_DBD": "1" if ctld and accounting else "0",
        }
        lines = _run(conn, ["install", name], env, what="installing Slurm's packages")
        facts[conn.label] = read_facts(conn, name, entry)
        said = next((ln for ln in lines if ln.startswith("INSTALLED ")), "")
        return tuple(said.split()[1:])

    outcomes = group.map(install, only=lacking)
    raise_for_failures(outcomes)
    return {o.host: o.value or () for o in outcomes}


def _key(conn: Connection, ctl: NodeFacts, name: str) -> bytes:
    """The cluster's munge key: the controller's when it is this cluster's already (a node
    added, a second run), else a new one (1024 random bytes, as `mungekey` makes)."""
    if ctl.conf == "ours":
        lines = _run(conn, ["key", name], what="reading the cluster's munge key")
        try:
            key = base64.b64decode(lines[-1].strip(), validate=True)
        except (ValueError, IndexError):
            key = b""
        if len(key) >= 32:
            return key
    return secrets.token_bytes(1024)


def _apply(conn: Connection, p: Plan, node: NodeFacts, key: bytes, ctld: bool) -> NodeDone:
    env = {
        "VMRUN_SLURM_CTLD": "1" if ctld else "0",
        "VMRUN_SLURM_CONF": slurm_conf(p),
        "VMRUN_SLURM_GRES": gres_conf(p),
        "VMRUN_SLURM_CGROUP": cgroup_conf(p, node),
        "VMRUN_SLURM_HOSTS": hosts_lines(p),
        "VMRUN_MUNGE_KEY": base64.b64encode(key).decode("ascii"),
        "VMRUN_SLURM_DBD": "1" if ctld and p.accounting else "0",
        **({"VMRUN_SLURMDBD_CONF": slurmdbd_conf(p)} if ctld and p.accounting else {}),
    }
    lines = _run(conn, ["apply", p.name], env, what="making the host a Slurm node")
    changed = tuple(line[8:] for line in lines if line.startswith("CHANGED "))
    services = {}
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "SERVICE":
            unit, _, how = rest.partition(" ")
            services[unit] = how
    return NodeDone(conn.label, node.hostname, changed, services)


def node_states(conn: Connection) -> dict[str, str]:
    """Slurm node name -> sinfo's long state ("idle", "down*", "mixed"...); {"": why} when
    sinfo itself failed."""
    result = conn.run(["sinfo", "-h", "-N", "-o", "%N %T"], what="sinfo", activity=False)
    if not result.ok:
        return {"": result.output_tail(1)}
    pairs = (line.split(maxsplit=1) for line in result.stdout_tail.splitlines())
    return {p[0]: p[1].strip() for p in pairs if len(p) == 2}


def wait_ready(conn: Connection, p: Plan, timeout: float) -> dict[str, str]:
    """Until every node is in service (idle, or running jobs); a node that is not within
    `timeout` raises with Slurm's reason and where the daemons' logs are."""
    names = [n.hostname for n in p.nodes]
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while True:
        states = node_states(conn)
        if all(states.get(n, "") in READY for n in names):  # "idle*": not responding
            return {n: states[n] for n in names}
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    result = conn.run(["sinfo", "-h", "-R", "-o", "%N: %E"], what="sinfo -R", activity=False)
    reasons = "; ".join(result.stdout_tail.split("\n")).strip("; ") if result.ok else ""
    late = [f"{n} {states.get(n, 'unknown')}" for n in names if states.get(n, "") not in READY]
    if "" in states:
        reasons = f"sinfo: {states['']}"
    raise RemoteError(
        f"Slurm nodes not in service after {timeout:.0f}s: {', '.join(late)}"
        + (f" ({reasons})" if reasons else ""),
        host=conn.label,
        code="slurm-nodes-down",
        hint=f"the daemons' logs are in {p.state}/log on each host",
    )


def check_shared(
    group: Group, name: str, shared: str, controller: str, labels: Sequence[str]
) -> None:
    """`shared` must be one folder on every host: a token left there by the controller,
    read back on each node."""
    token = f"{os.getpid()}-{secrets.token_hex(8)}"
    conns = group.connections
    _run(conns[controller], ["shared", name, shared, token], what="writing in the shared folder")
    others = [label for label in labels if label != controller]
    seen = group.map(lambda _e, conn: _run(conn, ["shared", name, shared]), only=others)
    raise_for_failures(seen)
    apart = [o.host for o in seen if o.value is None or o.value[-1:] != [token]]
    if apart:
        raise RemoteError(
            f"--shared {shared} is not shared with {controller}: {', '.join(apart)} see"
            " another folder there",
            code="slurm-not-shared",
            hint="mount one folder on every host (NFS...) and give its path",
        )


def queued_jobs(conn: Connection) -> list[str]:
    result = conn.run(["squeue", "-h", "-o", "%i"], what="squeue", activity=False)
    return result.stdout_tail.split() if result.ok else []


def remove(
    settings: Settings, name: str, entries: Sequence[HostEntry], controller: HostEntry
) -> Removed:
    """Take cluster `name` down on `entries`: refused while its queue holds jobs."""
    with Group(entries, settings) as group:
        conns = group.connections
        if jobs := queued_jobs(conns[controller.label]):
            raise RemoteError(
                f"cluster {name} has {len(jobs)} job(s) in its queue ({', '.join(jobs[:5])}):"
                " nothing was removed",
                host=controller.label,
                code="slurm-busy",
                hint=f"wait for them, or cancel them (ssh {controller.label} scancel -u $USER)",
            )
        # the nodes first, the controller last (its slurmctld would mark them down)
        others = [e.label for e in entries if e.label != controller.label]
        outcomes = group.map(lambda _e, conn: _run(conn, ["remove", name]), only=others)
        outcomes += group.map(
            lambda _e, conn: _run(conn, ["remove", name]), only=[controller.label]
        )
        raise_for_failures(outcomes)
    lines = {o.host: tuple(o.value or ()) for o in outcomes}
    kept = {
        h: next((ln[5:] for ln in ls if ln.startswith("KEPT ")), "").strip()
        for h, ls in lines.items()
    }
    return Removed(
        name,
        {h: tuple(ln for ln in ls if not ln.startswith("KEPT")) for h, ls in lines.items()},
        kept,
    )
