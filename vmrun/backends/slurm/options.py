"""The Slurm option group: what a run asks the scheduler for, as `train -C` and `sweep -C`
take it, and the `JobSpec` it makes over the cluster's `[[clusters]]` defaults (a flag wins
over the config; --sbatch-arg adds to the cluster's). Declared here once: the CLI builds its
flags from these fields, and the refusal rules name them by `FLAGS`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.job import DEFAULT_MAX_REQUEUES, JobSpec
from vmrun.errors import UsageError


@dataclass(frozen=True)
class SlurmOptions:
    """The flags as given (None: not given, the cluster's or sbatch's default applies)."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    constraint: str | None = None
    qos: str | None = None
    partition: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()
    max_requeues: int | None = None

    def given(self) -> dict[str, Any]:
        """The options given, by field name (what a sweep records to ask the same again)."""
        return {k: v for k, v in asdict(self).items() if v not in (None, ())}

    def flags(self) -> dict[str, Any]:
        """The options by the flag that gives each (for the refusal rules' messages)."""
        return {FLAGS[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SlurmOptions:
        """Options a sweep recorded (older records: `sbatch_arg`, a list)."""
        values = dict(record)
        values["sbatch_args"] = tuple(
            values.pop("sbatch_arg", None) or values.get("sbatch_args") or ()
        )
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def job_spec(self, cluster: Cluster, nproc_per_node: str | None = None) -> JobSpec:
        """The JobSpec these ask for on `cluster`, its defaults under them."""
        nproc = None
        if nproc_per_node is not None:
            if not nproc_per_node.isdigit():
                raise UsageError(
                    f"--nproc-per-node {nproc_per_node}: on a cluster give a number (per node);"
                    " --gpus-per-node sets one process per GPU"
                )
            nproc = int(nproc_per_node)
        return JobSpec(
            nodes=1 if self.nodes is None else self.nodes,
            gpus_per_node=self.gpus_per_node or 0,
            nproc_per_node=nproc,
            time=self.time,
            cpus_per_task=self.cpus_per_task,
            mem=self.mem,
            constraint=self.constraint,
            partition=self.partition or cluster.partition,
            account=self.account or cluster.account,
            qos=self.qos or cluster.qos,
            sbatch_args=(*cluster.sbatch_args, *self.sbatch_args),
            max_requeues=DEFAULT_MAX_REQUEUES if self.max_requeues is None else self.max_requeues,
        )


# Each field's flag: `--` and its name, but --sbatch-arg is repeated, one option each.
FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in fields(SlurmOptions)}
FLAGS["sbatch_args"] = "--sbatch-arg"
