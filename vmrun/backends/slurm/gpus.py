"""`vmrun watch-gpus -C`: the GPUs of the nodes the user's running jobs hold, read from the
login node. Each node is one exec channel on the ONE connection to the login node, running
the watch script as an extra step of the job (`srun --overlap`): it works where compute nodes
take no SSH, and it shares the job's resources (its GPUs included: a step with
`--gres=none` would not see them under ConstrainDevices) rather than taking any. Closing
the channel stops srun (the command wrapper signals its process group), which ends the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from vmrun import hostside
from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.errors import RemoteError, UsageError
from vmrun.gpus.nvidia_smi import watch_argv
from vmrun.gpus.targets import Target
from vmrun.ssh.quoting import plain_command


@dataclass(frozen=True)
class JobNode:
    job: str
    node: str
    run: str = ""  # the vmrun run the job is, if any

    @property
    def label(self) -> str:
        return f"{self.node} (job {self.job}" + (f" / {self.run})" if self.run else ")")


def running_nodes(slurm: SlurmBackend, run: str | None, job: str | None) -> list[JobNode]:
    """Every node of the user's running jobs (or of the one `--run`/`--job` names)."""
    argv = hostside.command("slurm_nodes.sh")
    status, out, err = slurm.conn.capture(plain_command(argv), what="squeue")
    if status != 0:
        raise RemoteError(f"listing running jobs failed: {err.strip()}", host=slurm.cluster.name)
    pairs = [line.split() for line in out.decode(errors="replace").splitlines()]
    runs, _ = slurm.runs()
    run_of = {r.job_id: r.id for r in runs if r.job_id}
    if run is not None:
        if run not in {r.id for r in runs}:
            raise UsageError(
                f"no run {run} on cluster {slurm.cluster.name}",
                hint="see `vmrun status -C`",
                code="run-not-found",
            )
        job = next(r.job_id for r in runs if r.id == run)
    return [
        JobNode(j, n, run_of.get(j, ""))
        for j, n in (p for p in pairs if len(p) == 2)
        if job is None or j == job
    ]


def srun_argv(node: JobNode, interval: float | None) -> list[str]:
    """The watch script as an overlapping step of the job on one node: its text, since a
    compute node need not share the login node's home (where vmrun's scripts lie)."""
    step = ["srun", "--overlap", f"--jobid={node.job}", f"--nodelist={node.node}", "-N1", "-n1"]
    return [*step, "--quiet", *watch_argv("nvidia-smi", interval, inline=True)]


def node_targets(slurm: SlurmBackend, nodes: list[JobNode]) -> list[Target]:
    return [Target(n.label, slurm.conn, partial(srun_argv, n), shared=True) for n in nodes]
