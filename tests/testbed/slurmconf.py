"""What a SlurmCluster is made of: its paths, its config files and the capability probe.

The text of ``slurm.conf``, ``gres.conf`` and ``cgroup.conf``, the ``/etc/hosts``
every host of the cluster gets, the munge key, the stand-in GPU device files, and
:func:`skip_reason_no_slurm`.  Why each setting is what it is: README.md ("A Slurm
cluster").
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from .netns import skip_reason_no_netns
from .tools import STD_PATH

MUNGED = shutil.which("munged", path=STD_PATH) or "/usr/sbin/munged"
MUNGE = shutil.which("munge", path=STD_PATH) or "/usr/bin/munge"
SLURMCTLD = shutil.which("slurmctld", path=STD_PATH) or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd", path=STD_PATH) or "/usr/sbin/slurmd"
SLURMSTEPD = shutil.which("slurmstepd", path=STD_PATH) or "/usr/sbin/slurmstepd"
CLIENT_TOOLS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "srun")
ETC_SLURM = Path("/etc/slurm")  # the mount point that the per-namespace override covers
# The executables (as /proc/PID/exe names them: Debian links slurm's through alternatives)
# that close() looks for in the cluster's namespaces.
DAEMON_EXES = frozenset(os.path.realpath(p) for p in (MUNGED, SLURMCTLD, SLURMD, SLURMSTEPD))
CLUSTER_NAME = "vmtbed"
PARTITIONS = ("debug", "one")  # debug: every compute node (default); one: the first only


def skip_reason_no_slurm() -> str | None:
    """Why a SlurmCluster cannot run here (a pytest skip reason), or None if it can."""
    reason = skip_reason_no_netns()
    if reason:
        return reason
    for tool in (MUNGED, MUNGE, SLURMCTLD, SLURMD, SLURMSTEPD):
        if not os.access(tool, os.X_OK):
            return f"a Slurm test cluster needs {tool} (apt-get install slurm-wlm munge)"
    for name in CLIENT_TOOLS:
        if not shutil.which(name, path=STD_PATH):
            return f"a Slurm test cluster needs {name} (apt-get install slurm-wlm)"
    if not ETC_SLURM.is_dir():
        # `ip netns exec` can only bind-mount the cluster's config dir over an existing one
        return f"{ETC_SLURM} is missing (it comes with slurm-wlm)"
    return None


@dataclass(frozen=True)
class ClusterPaths:
    """Where a cluster keeps its files: all under ``root``, which is inside the bed's
    home root (0755 up to /, so every test user reaches the munge socket)."""

    root: Path

    @property
    def munge_dir(self) -> Path:  # 0755: the socket (0777) must be reachable by every user
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_private(self) -> Path:  # 0700: the key, the PRNG seed, the pid file
        return self.root / "munge-private"

    @property
    def munge_key(self) -> Path:
        return self.munge_private / "munge.key"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def munged_log(self) -> Path:  # `munged -F` logs to stderr only: its captured output
        return self.log_dir / "munged.out"

    @property
    def slurmctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd-{node}.log"

    @property
    def ctld_dir(self) -> Path:  # StateSaveLocation (state/) and the pid file
        return self.root / "slurmctld"

    def node_dir(self, node: str) -> Path:  # SlurmdSpoolDir (spool/) and the pid file
        return self.root / "slurmd" / node

    @property
    def job_tmp(self) -> Path:  # 1777: each job's $SLURM_TMPDIR, made by the task prolog
        return self.root / "jobtmp"

    @property
    def task_prolog(self) -> Path:
        return self.root / "task_prolog.sh"

    @property
    def epilog(self) -> Path:
        return self.root / "epilog.sh"

    def gpu_devices(self, count: int) -> list[Path]:
        return [self.root / "dev" / f"nvidia{i}" for i in range(count)]


@dataclass(frozen=True)
class Node:
    name: str  # the host's hostname, vmt-<host name>
    addr: str


def task_prolog(paths: ClusterPaths) -> str:
    """The per-job scratch folder that clusters such as the Alliance's give every job as
    $SLURM_TMPDIR (their prolog makes it on local disk): made here as the job's user, before
    each task (a TaskProlog's `export` lines reach the task)."""
    return (
        "#!/bin/sh\n"
        f'd={paths.job_tmp}/"$SLURM_JOB_ID"\n'
        'mkdir -p "$d" && echo "export SLURM_TMPDIR=$d"\n'
    )


def epilog(paths: ClusterPaths) -> str:
    """Removes the job's $SLURM_TMPDIR on each node at its end (as root)."""
    return f'#!/bin/sh\nrm -rf "{paths.job_tmp}/$SLURM_JOB_ID"\n'


def slurm_conf(
    paths: ClusterPaths,
    login: Node,
    nodes: list[Node],
    *,
    min_job_age: int,
    enforce_part_limits: str,
    gpus_per_node: int,
    cpus_per_node: int,
) -> str:
    """slurm.conf of a fast, cgroup-free cluster (see README.md for each setting)."""
    node_dir = paths.root / "slurmd" / "%n"  # slurmd expands %n to its node name
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={login.name}({login.addr})",
        "SlurmctldPort=6817",
        "SlurmdPort=6818",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire also delays a requeued job (by cred_expire + 1 s); 5 is its minimum
        f"AuthInfo=socket={paths.munge_socket},cred_expire=5",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={paths.ctld_dir / 'state'}",
        f"SlurmctldPidFile={paths.ctld_dir / 'slurmctld.pid'}",
        f"SlurmctldLogFile={paths.slurmctld_log}",
        f"SlurmdSpoolDir={node_dir / 'spool'}",
        f"SlurmdPidFile={node_dir / 'slurmd.pid'}",
        f"SlurmdLogFile={paths.log_dir / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        # a submitted job starts on the next 1 s tick, an eligible one (requeued) too
        "SchedulerParameters=batch_sched_delay=0,sched_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        "ReturnToService=2",
        "InactiveLimit=0",
        "KillWait=5",
        f"MinJobAge={min_job_age}",
        f"TaskProlog={paths.task_prolog}",
        f"Epilog={paths.epilog}",
        "JobRequeue=1",
        f"EnforcePartLimits={enforce_part_limits}",
        "MpiDefault=none",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for n in nodes:
        lines.append(
            f"NodeName={n.name} NodeAddr={n.addr} CPUs={cpus_per_node} "
            f"Gres=gpu:{gpus_per_node} State=UNKNOWN"
        )
    every = ",".join(n.name for n in nodes)
    lines += [
        f"PartitionName=debug Nodes={every} Default=YES MaxTime=INFINITE State=UP",
        f"PartitionName=one Nodes={nodes[0].name} MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(paths: ClusterPaths, gpus_per_node: int) -> str:
    """GPUs with stand-in device files: 22.05 drops a gpu GRES without File= ("Removing
    file-less GPU"), and the node then registers with fewer GPUs than configured."""
    files = ",".join(str(p) for p in paths.gpu_devices(gpus_per_node))
    return f"AutoDetect=off\nName=gpu File={files}\n"


def cgroup_conf() -> str:
    """slurmd 22.05 always loads a cgroup plugin.  The default (autodetect) fails inside
    `ip netns exec` (its /sys has no cgroup fs); v1 only loads, and is never used, because
    nothing here asks for cgroups (proctrack/linuxproc, task/none)."""
    return "CgroupPlugin=cgroup/v1\n"


def make_gpu_devices(paths: ClusterPaths, gpus_per_node: int) -> None:
    """STAND-INS for /dev/nvidia*: character devices 1:3 (what /dev/null is), because slurmd
    wants File= to be a character or block device; nothing opens them."""
    paths.gpu_devices(1)[0].parent.mkdir(mode=0o755, exist_ok=True)
    for path in paths.gpu_devices(gpus_per_node):
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        path.chmod(0o666)


def hosts_file(login: Node, nodes: list[Node]) -> str:
    """/etc/hosts of every host: every node name and the login host's name resolve."""
    entries = "".join(f"{n.addr}\t{n.name}\n" for n in [login, *nodes])
    return "127.0.0.1\tlocalhost\n" + entries + "::1\tlocalhost ip6-localhost ip6-loopback\n"


def write_munge_key(path: Path) -> None:
    """A fresh 1024-byte key, 0400 (munged refuses a key that others can read)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
