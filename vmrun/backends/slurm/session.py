"""A command's way onto a cluster: `-C NAME` found in vmrun.toml, its login node opened
once (one connection for every verb the command uses); and `train -C` through the same
verbs as on any target (`SlurmTraining`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from vmrun.backends.api import Prepared, RunRef, StartOptions
from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster, find_cluster
from vmrun.backends.slurm.job import JobSpec
from vmrun.config import Settings
from vmrun.ssh.group import Group

if TYPE_CHECKING:
    from vmrun.notify.send import Notify
    from vmrun.reporting import Reporter
    from vmrun.runs.plan import Plan
    from vmrun.transfer.types import Progress


@contextmanager
def cluster_backend(
    settings: Settings, name: str, spec: JobSpec | None = None
) -> Iterator[SlurmBackend]:
    cluster = find_cluster(settings, name)
    with Group(cluster.entries, settings) as group:
        yield backend_in(group, cluster, spec)


def backend_in(group: Group, cluster: Cluster, spec: JobSpec | None = None) -> SlurmBackend:
    """The cluster's backend over the group's connections (its `entries`): the login node,
    and every node by label where the cluster has no shared folder."""
    return SlurmBackend(group.connections[cluster.entry.label], cluster, spec, group=group)


class SlurmTraining:
    """`train -C NAME` through the verbs every target has: `prepare` is the batch script and
    the commands `--dry-run` prints, `start` submits, `follow_and_tell` follows the job."""

    def __init__(self, backend: SlurmBackend):
        self.backend = backend
        self.capabilities = backend.capabilities

    def prepare(self, plan: Plan, how: StartOptions | None = None) -> Prepared:
        from vmrun.ssh.quoting import join
        from vmrun.transfer.manifest import normalize_remote

        backend = self.backend
        sub = backend.prepare(plan, how)
        record = sub.paths.record
        job_file = f"{record}/job.sh"
        lines = [f"# the batch script vmrun would write to {job_file}:", sub.script]
        lines.append(f"# and the commands, on the login node ({backend.cluster.login}):")
        if not sub.trainer:
            lines.append(f"# sync {plan.project} -> {sub.paths.code}")
        for path, where in plan.data:
            dest = sub.paths.code
            if where:
                dest = normalize_remote(where, base=dest, where="the project's work directory")
            lines.append(f"# push {path} -> {dest}/{path.name}")
        lines.append(join(["sbatch", "--parsable", job_file]))
        env_names = sorted({*backend.cluster.env, *plan.env})
        if env_names:
            lines.append(
                f"# with {', '.join(env_names)} from {record}/env (0600), not in the script"
            )
        return Prepared(tuple(lines))

    def start(
        self, plan: Plan, how: StartOptions, out: Reporter, progress: Progress | None = None
    ) -> RunRef:
        return self.backend.start(plan, how, out, progress)

    def detached(self, ref: RunRef) -> str:
        rid, name = ref.run_id, self.backend.cluster.name
        return (
            f"follow it with `vmrun logs -f {rid} -C {name}`; stop it with"
            f" `vmrun stop {rid} -C {name}`"
        )

    def follow_and_tell(
        self, ref: RunRef, notify: Notify | None, out: Reporter, *, verbose: bool = False
    ) -> int:
        return self.backend.follow_and_tell(ref, notify, out, verbose=verbose)
