"""A Slurm cluster made of SSH hosts, as text: each host's facts (`NodeFacts`, read by
hostside/slurm_node.sh) and the files every host gets from them (`slurm.conf`, `gres.conf`,
`cgroup.conf`, the /etc/hosts lines). Pure functions: the same facts give the same bytes, so
a second `setup --slurm` finds nothing to change.

Choices, and why (docs/queue.md):
* every host runs slurmd, the controller slurmctld too: on a few machines none is spared;
* nodes are named by their hostnames (slurmd finds itself so) and reached at the address the
  SSH session arrived at (the private one, through a jump host too); /etc/hosts gets the
  names, because a job's MASTER_ADDR is the first node's name;
* CPUs and memory as `slurmd -C` reads them (memory a little under), GPUs as GRES
  (`gres.conf` names each device file); one partition of every node (default), and one
  per GPU type where types differ;
* cgroups confine jobs where the hosts have them (v2 or v1); a host without a cgroup
  filesystem makes the cluster track processes without (Slurm 22.05 loads a cgroup plugin
  anyway: cgroup/v1 loads where none is mounted);
* no accounting daemon (slurmdbd): `squeue`/`sacct` of the running queue are what vmrun reads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from vmrun.errors import RemoteError, UsageError

STATE_ROOT = "/var/lib/slurm"  # <root>/vmrun-NAME: state, spool, logs (slurm_node.sh's $state)
DEFAULT_PARTITION = "main"
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
_TOPOLOGY = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def check_name(name: str) -> str:
    """A cluster name Slurm takes as ClusterName and a partition: lower case, a letter first."""
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"--slurm {name}: a cluster name is lower-case letters, digits, - and _, a letter"
            " first (at most 40)",
            code="bad-cluster-name",
        )
    return name


@dataclass(frozen=True)
class NodeFacts:
    """What slurm_node.sh's `facts` says of one host."""

    host: str  # the host as given (label)
    hostname: str
    addr: str
    systemd: bool
    tools: frozenset[str]  # munged, slurmd, slurmctld, sinfo: those present
    apt: bool
    versions: dict[str, str]  # package -> version (dpkg)
    topology: dict[str, int]  # slurmd -C's CPUs ... RealMemory (else nproc and MemTotal)
    gpu_names: tuple[str, ...]
    cgroup: str  # v2 | v1 | none
    slurm_user: bool
    conf: str  # ours | other NAME | other | none
    root: str  # root | sudo | none
    conf_dir: str = "/etc/slurm"  # where this distribution's Slurm reads slurm.conf

    @property
    def gpus(self) -> int:
        return len(self.gpu_names)

    @property
    def gpu_type(self) -> str | None:
        """The GRES type of this node's GPUs ("a100", "t4"), None without GPUs or when they
        differ."""
        kinds = {gpu_type(n) for n in self.gpu_names}
        return kinds.pop() if len(kinds) == 1 else None

    def needs(self, *, controller: bool, accounting: bool) -> list[str]:
        """Packages this host still needs as a node, the controller, and its accounting."""
        need = {"munged": "munge", "slurmd": "slurmd", "sinfo": "slurm-client"}
        if controller:
            need["slurmctld"] = "slurmctld"
            if accounting:
                need.update(slurmdbd="slurmdbd", mariadbd="mariadb-server")
        return [pkg for tool, pkg in need.items() if tool not in self.tools]


def parse_facts(text: str, host: str) -> NodeFacts:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z_]+", key):
            values[key] = value.strip()
    if "hostname" not in values:
        raise UsageError(f"{host}: could not read the host's facts for Slurm", host=host)
    topology = {
        key: int(value)
        for key, value in re.findall(r"(\w+)=(\d+)", values.get("slurmd_c", ""))
        if key in _TOPOLOGY
    }
    if "CPUs" not in topology:  # no slurmd yet: what nproc and /proc/meminfo say
        topology = {"CPUs": _int(values.get("cpus"), 1)}
        if mem := _int(values.get("mem_mb"), 0):
            topology["RealMemory"] = mem
    versions = {}
    for item in values.get("versions", "").split(","):
        package, _, version = item.strip().partition(" ")
        if package and version:
            versions[package] = version
    return NodeFacts(
        host=host,
        hostname=values["hostname"],
        addr=values.get("addr", ""),
        systemd=values.get("systemd") == "1",
        tools=frozenset(k[4:] for k, v in values.items() if k.startswith("has_") and v == "1"),
        apt=values.get("apt") == "1",
        versions=versions,
        topology=topology,
        gpu_names=tuple(n.strip() for n in values.get("gpu_names", "").split(",") if n.strip()),
        cgroup=values.get("cgroup", "none"),
        slurm_user=values.get("slurm_user") == "1",
        conf=values.get("conf", "none"),
        root=values.get("root", "none"),
        conf_dir=values.get("conf_dir", "/etc/slurm"),
    )


def _int(text: str | None, default: int) -> int:
    return int(text) if text and text.isdigit() else default


def gpu_type(name: str) -> str:
    """A GPU's model as a GRES type: "NVIDIA A100-SXM4-80GB" -> "a100", "Tesla T4" -> "t4",
    "NVIDIA GeForce RTX 3090" -> "rtx3090", "NVIDIA RTX A6000" -> "rtxa6000"."""
    words = [w for w in re.split(r"\s+", name.strip()) if w.lower() not in _VENDOR_WORDS]
    if not words:
        return "gpu"
    first = words[0].split("-")[0].lower()
    if first == "rtx" and len(words) > 1:
        first += words[1].split("-")[0].lower()
    return re.sub(r"[^a-z0-9]", "", first) or "gpu"


@dataclass(frozen=True)
class Plan:
    """The cluster to make: its name, its controller (one of `nodes`), every node's facts."""

    name: str
    controller: NodeFacts
    nodes: tuple[NodeFacts, ...]
    partitions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    accounting: bool = False  # slurmdbd (and its MariaDB) on the controller: sacct

    @property
    def state(self) -> str:
        return f"{STATE_ROOT}/vmrun-{self.name}"

    @property
    def cgroups(self) -> bool:
        """Confine jobs with cgroups: only where every host has them (one rule for all)."""
        return all(n.cgroup in ("v1", "v2") for n in self.nodes)


def plan(
    name: str, controller: NodeFacts, nodes: list[NodeFacts], accounting: bool = False
) -> Plan:
    """The cluster, checked: unique hostnames and addresses; partitions by GPU type."""
    check_name(name)
    for attr, what in (("hostname", "hostname"), ("addr", "address")):
        seen: dict[str, str] = {}
        for node in nodes:
            value = getattr(node, attr)
            if not value:
                raise RemoteError(
                    f"its {what} could not be read", host=node.host, code="slurm-host-unfit"
                )
            if value in seen:
                raise RemoteError(
                    f"{seen[value]} and {node.host} have the same {what} {value}: Slurm names"
                    " and reaches nodes by it (give each machine its own)",
                    code="slurm-host-unfit",
                )
            seen[value] = node.host
    every = tuple(n.hostname for n in nodes)
    partitions = {DEFAULT_PARTITION: every}
    types = Counter(n.gpu_type for n in nodes if n.gpu_type)
    if len(types) > 1:
        for kind in sorted(types):
            partitions[kind] = tuple(n.hostname for n in nodes if n.gpu_type == kind)
    return Plan(name, controller, tuple(nodes), partitions, accounting)


def slurm_conf(p: Plan) -> str:
    """The one slurm.conf every host gets (Slurm wants it the same everywhere)."""
    ctl = p.controller
    user = "slurm" if ctl.slurm_user else "root"
    cgroups = p.cgroups
    lines = [
        f"# vmrun-cluster: {p.name}",
        f"# Written by `vmrun setup --slurm {p.name}`, which rewrites it: change the hosts there.",
        f"ClusterName={p.name}",
        f"SlurmctldHost={ctl.hostname}({ctl.addr})",
        f"SlurmUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={p.state}/ctld",
        f"SlurmdSpoolDir={p.state}/spool",
        "SlurmctldPidFile=/run/slurmctld.pid",  # as the units' PIDFile=
        "SlurmdPidFile=/run/slurmd.pid",
        f"SlurmctldLogFile={p.state}/log/slurmctld.log",
        f"SlurmdLogFile={p.state}/log/slurmd.log",
        f"ProctrackType=proctrack/{'cgroup' if cgroups else 'linuxproc'}",
        f"TaskPlugin={'task/cgroup,task/affinity' if cgroups else 'task/none'}",
        *_accounting_lines(p),
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0",  # a few machines: start what fits at once
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",  # a node back from a reboot takes jobs again
        "InactiveLimit=0",
        "KillWait=30",
        "MinJobAge=300",
        "JobRequeue=1",
        "MpiDefault=none",
    ]
    for node in p.nodes:
        words = [f"NodeName={node.hostname}", f"NodeAddr={node.addr}"]
        words += [f"{k}={_value(k, node.topology[k])}" for k in _TOPOLOGY if k in node.topology]
        if node.gpus:
            kind = node.gpu_type
            words.append(f"Gres=gpu:{kind}:{node.gpus}" if kind else f"Gres=gpu:{node.gpus}")
        lines.append(" ".join([*words, "State=UNKNOWN"]))
    for index, (part, names) in enumerate(p.partitions.items()):
        default = "YES" if index == 0 else "NO"
        lines.append(
            f"PartitionName={part} Nodes={','.join(names)} Default={default}"
            " MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def _accounting_lines(p: Plan) -> list[str]:
    if not p.accounting:
        return [
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
        ]
    return [
        "JobAcctGatherType=jobacct_gather/linux",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={p.controller.hostname}",
    ]


def slurmdbd_conf(p: Plan) -> str:
    """slurmdbd.conf on the controller, less its StoragePass: the password of its database
    user is made on the controller and never leaves it (the host script adds the line)."""
    user = "slurm" if p.controller.slurm_user else "root"
    return (
        "\n".join(
            [
                f"# vmrun-cluster: {p.name}",
                f"# Written by `vmrun setup --slurm {p.name} --slurmdbd`, which rewrites it.",
                "AuthType=auth/munge",
                f"DbdHost={p.controller.hostname}",
                f"SlurmUser={user}",
                f"LogFile={p.state}/log/slurmdbd.log",
                "PidFile=/run/slurmdbd.pid",  # as the unit's PIDFile=
                "StorageType=accounting_storage/mysql",
                "StorageHost=localhost",
                f"StorageUser={db_names(p.name)[1]}",
                f"StorageLoc={db_names(p.name)[0]}",
            ]
        )
        + "\n"
    )


def db_names(name: str) -> tuple[str, str]:
    """The cluster's accounting database and its MariaDB user (`check_name`'s words)."""
    word = name.replace("-", "_")  # an SQL word without quoting
    return f"slurm_acct_{word}", f"slurm_{word}"[:32]


def _value(key: str, value: int) -> int:
    """RealMemory a little under what the node has now: MemTotal drops a few MB after a
    kernel update, and a node with less than its RealMemory is drained. 98%, to 256 MB, so
    that such a drop changes nothing here either."""
    return (value * 98 // 100) // 256 * 256 if key == "RealMemory" else value


def gres_conf(p: Plan) -> str:
    """Each GPU node's device files (/dev/nvidia0...): Slurm hands out GPUs by them."""
    lines = [f"# vmrun-cluster: {p.name}", "AutoDetect=off"]
    for node in p.nodes:
        if node.gpus:
            kind = f" Type={node.gpu_type}" if node.gpu_type else ""
            files = f"/dev/nvidia[0-{node.gpus - 1}]" if node.gpus > 1 else "/dev/nvidia0"
            lines.append(f"NodeName={node.hostname} Name=gpu{kind} File={files}")
    return "\n".join(lines) + "\n"


def cgroup_conf(p: Plan, node: NodeFacts) -> str:
    """Per host: its own cgroup version; confinement only where the cluster uses cgroups."""
    head = f"# vmrun-cluster: {p.name}\n"
    if not p.cgroups:
        # Slurm 22.05's slurmd loads a cgroup plugin whatever the tracking; v1 loads where no
        # cgroup filesystem is mounted, and nothing uses it
        return head + "CgroupPlugin=cgroup/v1\n"
    version = "v2" if node.cgroup == "v2" else "v1"
    return head + (
        f"CgroupPlugin=cgroup/{version}\nConstrainCores=yes\nConstrainDevices=yes\n"
        "ConstrainRAMSpace=yes\n"
    )


def hosts_lines(p: Plan) -> str:
    """Every node's name at its address, for each host's /etc/hosts."""
    return "\n".join(f"{n.addr}\t{n.hostname}" for n in p.nodes)
