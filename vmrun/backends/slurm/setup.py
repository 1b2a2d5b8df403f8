"""`vmrun setup -C NAME`: the setup playbook on a cluster's login node, then a check on a
compute node.

The playbook runs as it does on a host, with `SetupOptions.cluster` set: steps that need root
(the driver, apt packages, reboots) do not apply (the compute nodes' drivers are the admins'),
and setup's state, its record and the venv/uv env live under the cluster's workdir on the
shared filesystem (`<workdir>/.vmrun/envs/<name>`), so every compute node sees the env.

A login node often has no GPU, so what torch says there proves little: one short
`srun -N1 -n1` runs the env's python on a compute node and reports torch's version, whether
CUDA is available and how many GPUs it sees.

Where `vmrun train -C` finds the env: in the record setup leaves on the cluster,
`<workdir>/.vmrun/host.json` (read by SlurmBackend's probe, at no extra round trip), not in
vmrun.toml: the env lives on the cluster, so its record does too (every checkout and every
machine that submits there sees it), and a `python` the user wrote in vmrun.toml stays theirs
and wins.

`modules` of the cluster are loaded around the compute-node check (as in every job); the build
on the login node runs the playbook's scripts without them (a login shell's `module` function
is not defined in `bash --norc`): give `--python` an interpreter from a module, or load it in
the login's PATH, when the build needs one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.job import gpu_option
from vmrun.config import Settings
from vmrun.errors import RemoteError
from vmrun.reporting import HostSteps
from vmrun.setup.report import HostReport, SetupOptions
from vmrun.ssh.quoting import quote

CHECK_TIMEOUT_S = 300.0  # the srun check: a short job, but it may wait for a free node
_PROBE = (
    "import socket, torch; c = torch.cuda.is_available();"
    " print('node=' + socket.gethostname()); print('torch=' + torch.__version__);"
    " print('cuda_available=' + str(c)); print('gpus=' + str(torch.cuda.device_count() if c"
    " else 0))"
)


@dataclass(frozen=True)
class NodeCheck:
    """What the env's python said on a compute node."""

    node: str
    torch: str
    cuda_available: str
    gpus: str

    def line(self) -> str:
        return (
            f"on compute node {self.node}: torch={self.torch}"
            f" cuda_available={self.cuda_available} gpus={self.gpus}"
        )


@dataclass
class ClusterSetup:
    report: HostReport
    workdir: str
    check: NodeCheck | None  # None for --dry-run


def setup_cluster(
    settings: Settings,
    name: str,
    options: SetupOptions,
    *,
    gpus_per_node: int = 0,
    steps: HostSteps | None = None,
) -> ClusterSetup:
    """Set up the env on cluster `name` (one connection to its login node), then check it on
    a compute node; a failing step or check raises a VmrunError."""
    from vmrun.backends.slurm.session import cluster_backend
    from vmrun.setup.host_setup import HostSetup

    with cluster_backend(settings, name) as backend:
        workdir = backend.facts().workdir
        opts = replace(options, cluster=True, root=workdir)
        steps = steps or HostSteps()
        report = HostSetup(backend.conn, opts, steps).run()
        report.host = name
        if options.dry_run:
            return ClusterSetup(report, workdir, None)
        steps.event(name, "checking the env on a compute node (srun)")
        check = check_on_compute_node(backend, report.python, gpus_per_node)
        return ClusterSetup(report, workdir, check)


def srun_argv(cluster: Cluster, python: str, gpus_per_node: int, version: str) -> list[str]:
    """One task on one compute node with the cluster's partition, account and qos; GPUs only
    when asked (a CPU partition refuses a GPU request)."""
    argv = ["srun", "-N1", "-n1", "--job-name=vmrun-setup-check", "--time=5"]
    for option, value in (
        ("--partition", cluster.partition),
        ("--account", cluster.account),
        ("--qos", cluster.qos),
    ):
        if value:
            argv.append(f"{option}={value}")
    if gpus_per_node:
        argv.append(gpu_option(gpus_per_node, version))
    command = [python, "-c", _PROBE]
    if cluster.modules:
        loads = " ".join(quote(m) for m in cluster.modules)
        command = ["bash", "-lc", f'module load {loads} && exec "$@"', "vmrun-check", *command]
    return [*argv, *command]


def check_on_compute_node(backend: SlurmBackend, python: str, gpus_per_node: int) -> NodeCheck:
    cluster = backend.cluster
    argv = srun_argv(cluster, python, gpus_per_node, backend.facts().version)
    result = backend.conn.run(argv, timeout=CHECK_TIMEOUT_S)
    values = dict(line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line)
    if not result.ok or "torch" not in values:
        said = [line for line in result.output_tail(4).splitlines() if line.strip()]
        raise RemoteError(
            f"the check on a compute node failed (srun exited {result.exit_status}):"
            f" {said[-1] if said else 'no output'}",
            host=cluster.name,
            hint="check the cluster's partition/account/qos in vmrun.toml (sinfo lists the"
            " partitions)",
        )
    return NodeCheck(
        values.get("node", "?"),
        values["torch"],
        values.get("cuda_available", "?"),
        values.get("gpus", "?"),
    )
