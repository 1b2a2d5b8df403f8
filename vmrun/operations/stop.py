"""Stopping a run where it runs: on SSH hosts every process of it, SIGKILL after the grace
period, then proof that none is left; on a cluster, scancel and a wait until Slurm shows no
step of the job."""

from __future__ import annotations

from dataclasses import dataclass, field

from vmrun.backends.api import RunRef, StopReport
from vmrun.config import Settings
from vmrun.errors import exit_code_for
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.group import Outcome, worst_exit_code


@dataclass(frozen=True)
class Stopped:
    """What `stop` did: each node's outcome (its StopReport, or its error; a cluster's job
    is one node, the cluster); the run's nodes that did not answer are in `ref.unreached`
    (not stopped there)."""

    ref: RunRef
    outcomes: list[Outcome[StopReport]] = field(default_factory=list)
    cluster: str | None = None

    @property
    def run_id(self) -> str:
        return self.ref.run_id

    @property
    def job(self) -> str | None:
        """A cluster's job id."""
        job = self.ref.record.job
        return job.job_id or None if job is not None else None

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
    `cluster`: on hosts every process, SIGKILL after `grace`, then proof none is left; on a
    cluster scancel, then a wait until Slurm shows no step of the job. A node's failure is
    in the value, not raised; a run not found raises."""
    from vmrun.backends.select import open_backend

    with open_backend(settings, hosts=hosts, cluster=cluster) as backend:
        ref = backend.find(run, running_only=run is None)
        outcomes = backend.stop(ref, grace=grace)
    return Stopped(ref, outcomes, cluster=cluster)
