"""Stopping a run where it runs: on SSH hosts every process of it, SIGKILL after the grace
period, then proof that none is left; on a cluster, scancel and a wait until Slurm shows no
step of the job."""

from __future__ import annotations

from dataclasses import dataclass, field

from vmrun.backends.api import RunRef
from vmrun.backends.hosts.records import StopResult
from vmrun.config import Settings
from vmrun.errors import exit_code_for
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.group import Outcome, worst_exit_code


@dataclass(frozen=True)
class Stopped:
    """What `stop` did. On hosts, each node's outcome (its StopResult, or its error); the
    run's nodes that did not answer are in `ref.unreached` (not stopped there). On a
    cluster, its job and whether it was still there to cancel."""

    ref: RunRef
    outcomes: list[Outcome[StopResult]] = field(default_factory=list)
    cluster: str | None = None
    job: str | None = None
    signalled: bool = False  # on a cluster: the job was cancelled (False: it had ended)

    @property
    def run_id(self) -> str:
        return self.ref.run_id

    @property
    def exit_code(self) -> int:
        """0 when every node of the run was stopped; else the worst failure's code."""
        unreached = [exit_code_for(e) for e in self.ref.unreached.values()]
        return max([worst_exit_code(self.outcomes), *unreached])


def stop(
    settings: Settings,
    run: str | None = None,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    grace: float = 10.0,
    out: Reporter = QUIET,
) -> Stopped:
    """Stop `run` (None: the newest running one) on -H's hosts (None: the project's) or on
    `cluster`. A node's failure is in the value, not raised; a run not found raises."""
    if cluster:
        return _stop_job(settings, cluster, run, grace)
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(hosts, settings)
    with Group(entries, settings) as group:
        backend = HostsBackend(group)
        ref = backend.find(run, running_only=run is None)
        outcomes = backend.stop_outcomes(ref, grace=grace)
    return Stopped(ref, outcomes)


def _stop_job(settings: Settings, cluster: str, run: str | None, grace: float) -> Stopped:
    """scancel the run's job, then wait until Slurm shows neither it nor any step of it."""
    from vmrun.backends.slurm.session import cluster_backend

    with cluster_backend(settings, cluster) as slurm:
        ref = slurm.find(run, running_only=run is None)
        (report,) = slurm.stop(ref, grace=grace)
    job = ref.meta.get("job_id")
    return Stopped(
        ref,
        cluster=cluster,
        job=None if job is None else str(job),
        signalled=bool(report.signalled),
    )
