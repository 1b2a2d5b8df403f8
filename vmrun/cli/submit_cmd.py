"""`vmrun submit SCRIPT [-- ARGS...]`: the user's own sbatch script, unchanged, with vmrun's
sync, logs, status, stop and fetch."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmrun.cli import run_options as ro
from vmrun.cli.options import (
    NO_FLAGS,
    SCRIPT_ARGS,
    SLURM_GROUP,
    ClusterName,
    DashDashCommand,
    Reach,
    reaching,
    slurm_options,
    with_group,
)
from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command(
        "submit",
        cls=DashDashCommand,
        help="Sync the project to the cluster and submit SCRIPT, your own sbatch script, as it"
        " is, from there (its #SBATCH lines rule; --time, --partition and the other Slurm"
        " options given here override them, as on sbatch's command line; the words after"
        " `--` are its arguments). Then follow the job: its output files, wherever its"
        " --output/--error patterns put them, one per array task. `logs`, `status`, `stop`"
        " and `fetch results` know it by its run id.",
    )
    @with_group(SLURM_GROUP, "slurm", skip=("max_requeues",))
    @reaching(parallel=False)
    def submit_command(
        ctx: typer.Context,
        script: Annotated[
            str, typer.Argument(metavar="SCRIPT", help="Your batch script, in the project.")
        ],
        name: ro.RunName = None,
        env: ro.EnvVars = None,
        data: ro.DataOption = None,
        detach: Annotated[
            bool, typer.Option("--detach", help="Submit and return at once.")
        ] = False,
        recover: Annotated[
            bool,
            typer.Option(
                "--recover",
                help="Submit a copy of SCRIPT (a bash script) with vmrun's lines after its"
                " header: a failed attempt requeues the job, never again on a lost node.",
            ),
        ] = False,
        max_recoveries: ro.MaxRecoveries = None,
        notify: ro.NotifyUrls = None,
        notify_on: ro.NotifyOn = None,
        cluster: ClusterName = None,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run",
                help="Print the sbatch command and the synced directory; submit nothing.",
            ),
        ] = False,
        reach: Reach = NO_FLAGS,
        slurm: dict[str, Any] | None = None,
    ) -> int:

        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.submit import SubmitDryRun, SubmitOptions, submit

        what = SubmitOptions(
            script=script,
            args=ctx.meta.get(SCRIPT_ARGS) or [],
            name=name,
            env=env,
            data=data,
            recover=recover,
            max_recoveries=max_recoveries,
        )
        told = {"notify": notify, "notify_on": notify_on}
        done = submit(
            what,
            reach.settings(**told),
            cluster=cluster,
            slurm=slurm_options(slurm or {}),
            dry_run=dry_run,
            detach=detach,
            out=TERMINAL,
        )
        return show_dry_run(done) if isinstance(done, SubmitDryRun) else done


def show_dry_run(dry: Any) -> int:
    from vmrun.ssh.quoting import join

    say(f"# on the login node ({dry.login}):")
    say(f"# sync {dry.sync}")
    for line in dry.data:
        say(f"# push {line}")
    say(f"cd {join([dry.submit[1]])} && {join(dry.submit[3:])}")
    array = f" (array {dry.array}: one file per task)" if dry.array else ""
    say(f"# the job's output: {dry.output}{array}, in {dry.work_dir}")
    if dry.error != dry.output:
        say(f"# its errors: {dry.error}")
    if dry.env_names:
        say(
            f"# with {', '.join(dry.env_names)} from {dry.env_file} (0600) in sbatch's"
            " environment, which the job inherits; not on any command line"
        )
    return 0
