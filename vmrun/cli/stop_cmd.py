"""`vmrun stop [RUN]`: end every process of a run on every host, and prove none is left."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.options import (
    AcceptNewHostKey,
    ClusterName,
    ConnectTimeout,
    Hosts,
    refuse_with_cluster,
    settings_from,
)
from vmrun.config import Settings


def register(app: typer.Typer) -> None:
    @app.command(
        "stop",
        help="Stop a run (default: the newest running one) on every host:"
        " SIGTERM to all its processes, SIGKILL after the grace period,"
        " then check that none is left.",
    )
    def stop_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        grace: Annotated[
            float, typer.Option("--grace", metavar="SECONDS", help="Wait this long before SIGKILL.")
        ] = 10.0,
        host: Hosts = None,
        cluster: ClusterName = None,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.backends.hosts.backend import HostsBackend
        from vmrun.cli.output import report, unreached
        from vmrun.ssh.group import Group, worst_exit_code
        from vmrun.ssh.inventory import select_hosts

        refuse_with_cluster(cluster, host)
        settings = settings_from(connect_timeout, accept_new_host_key)
        if cluster:
            return _stop_job(settings, cluster, run, grace)
        entries = select_hosts(host, settings)
        with Group(entries, settings) as group:
            backend = HostsBackend(group)
            ref = backend.find(run, running_only=run is None)
            outcomes = backend.stop_outcomes(ref, grace=grace)
        run_id = ref.run_id
        for outcome in outcomes:
            if outcome.error is not None:
                report(outcome.error)
                continue
            res = outcome.value
            assert res is not None
            if not res.signalled:
                typer.echo(f"{res.host}: run {run_id} had already ended")
                continue
            killed = f", {len(res.killed)} needed SIGKILL" if res.killed else ""
            typer.echo(
                f"{res.host}: stopped run {run_id}: {len(res.signalled)} process(es)"
                f"{killed}; none left"
            )
        left = unreached(ref, "was not stopped there; its processes may still hold its GPUs")
        return max(worst_exit_code(outcomes), left)


def _stop_job(settings: Settings, cluster: str, run: str | None, grace: float) -> int:
    """scancel the run's job, then wait until Slurm shows neither it nor any step of it."""
    from vmrun.backends.slurm.session import cluster_backend

    with cluster_backend(settings, cluster) as slurm:
        ref = slurm.find(run, running_only=run is None)
        (report,) = slurm.stop(ref, grace=grace)
    job = ref.meta.get("job_id")
    if not report.signalled:
        typer.echo(f"{cluster}: run {ref.run_id} (job {job}) had already ended")
    else:
        typer.echo(f"{cluster}: stopped run {ref.run_id}: job {job} cancelled; no step left")
    return 0
