"""`vmrun train -C CLUSTER`: the sbatch options a Slurm run takes, and the run itself:
submitted through the cluster's login node, then followed (or left, --detach)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmrun.cli import output
from vmrun.errors import UsageError

Nodes = Annotated[
    int | None, typer.Option("--nodes", metavar="N", help="-C: nodes to allocate [default: 1].")
]
GpusPerNode = Annotated[
    int | None,
    typer.Option("--gpus-per-node", metavar="G", help="-C: GPUs per node [default: none]."),
]
Time = Annotated[
    str | None,
    typer.Option("--time", metavar="D-HH:MM:SS", help="-C: the job's time limit (sbatch --time)."),
]
CpusPerTask = Annotated[
    int | None, typer.Option("--cpus-per-task", metavar="C", help="-C: sbatch --cpus-per-task.")
]
Mem = Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="-C: sbatch --mem.")]
Constraint = Annotated[
    str | None, typer.Option("--constraint", metavar="FEATURES", help="-C: sbatch --constraint.")
]
Qos = Annotated[str | None, typer.Option("--qos", metavar="QOS", help="-C: sbatch --qos.")]
Partition = Annotated[
    str | None,
    typer.Option(
        "--partition", "-p", metavar="P", help="-C: the partition [default: the cluster's]."
    ),
]
Account = Annotated[
    str | None,
    typer.Option("--account", metavar="A", help="-C: the account [default: the cluster's]."),
]
SbatchArg = Annotated[
    list[str] | None,
    typer.Option("--sbatch-arg", metavar="OPTION", help="-C: any other sbatch option; repeatable."),
]
MaxRequeues = Annotated[
    int | None,
    typer.Option(
        "--max-requeues",
        metavar="N",
        help="-C: requeues after a time-limit warning or preemption that saved a snapshot"
        " [default: 3].",
    ),
]
DryRun = Annotated[
    bool,
    typer.Option("--dry-run", help="-C: print the batch script and the commands; submit nothing."),
]


def job_spec(cluster_opts: dict[str, Any], nproc_per_node: str | None, cluster: Any) -> Any:
    """The JobSpec the flags ask for, the cluster's defaults under them."""
    from vmrun.backends.slurm.job import DEFAULT_MAX_REQUEUES, JobSpec

    nproc = None
    if nproc_per_node is not None:
        if not nproc_per_node.isdigit():
            raise UsageError(
                f"--nproc-per-node {nproc_per_node}: on a cluster give a number (per node);"
                " --gpus-per-node sets one process per GPU"
            )
        nproc = int(nproc_per_node)
    o = cluster_opts
    return JobSpec(
        nodes=1 if o["nodes"] is None else o["nodes"],
        gpus_per_node=o["gpus_per_node"] or 0,
        nproc_per_node=nproc,
        time=o["time"],
        cpus_per_task=o["cpus_per_task"],
        mem=o["mem"],
        constraint=o["constraint"],
        partition=o["partition"] or cluster.partition,
        account=o["account"] or cluster.account,
        qos=o["qos"] or cluster.qos,
        sbatch_args=(*cluster.sbatch_args, *(o["sbatch_arg"] or ())),
        max_requeues=DEFAULT_MAX_REQUEUES if o["max_requeues"] is None else o["max_requeues"],
    )


def check_flags(
    cluster: str | None, cluster_opts: dict[str, Any], host_opts: dict[str, Any]
) -> None:
    """Slurm's options need -C; the hosts' options refuse it: one line naming them."""
    if cluster is None:
        given = [
            "--" + name.replace("_", "-")
            for name, value in cluster_opts.items()
            if value not in (None, False, [])
        ]
        if given:
            raise UsageError(f"{', '.join(given)}: Slurm options; name the cluster with -C NAME")
        return
    given = [flag for flag, value in host_opts.items() if value not in (None, False, [])]
    if given:
        raise UsageError(
            f"{', '.join(given)} {'are' if len(given) > 1 else 'is'} for runs on hosts (-H);"
            f" Slurm runs the job on -C {cluster}"
        )


def train_on_cluster(
    plan: Any,
    name: str,
    cluster_opts: dict[str, Any],
    nproc_per_node: str | None,
    settings: Any,
    *,
    detach: bool,
    verbose: bool,
) -> int:
    from vmrun.backends.slurm.cluster import find_cluster
    from vmrun.backends.slurm.job import check_spec
    from vmrun.backends.slurm.session import cluster_backend
    from vmrun.cli.fetch_view import make_progress

    spec = check_spec(job_spec(cluster_opts, nproc_per_node, find_cluster(settings, name)),
                      plan.launcher)  # fmt: skip
    with cluster_backend(settings, name, spec) as slurm:
        if cluster_opts["dry_run"]:
            return _dry_run(slurm, plan)
        import sys

        progress = make_progress(prefix=False, live=sys.stderr.isatty())
        ref = slurm.start(plan, None, output.TERMINAL, progress)
        rid = ref.run_id
        if detach:
            output.info_line(
                f"follow it with `vmrun logs -f {rid} -C {name}`; stop it with"
                f" `vmrun stop {rid} -C {name}`"
            )
            return 0
        return slurm.follow(ref, output.TERMINAL, verbose=verbose)


def _dry_run(slurm: Any, plan: Any) -> int:
    from vmrun.ssh.quoting import join

    sub = slurm.prepare(plan)
    login = slurm.cluster.login
    typer.echo(f"# the batch script vmrun would write to {sub.paths.record}/job.sh:")
    typer.echo(sub.script)
    typer.echo(f"# and the commands, on the login node ({login}):")
    if not sub.trainer:
        typer.echo(f"# sync {plan.project} -> {sub.paths.code}")
    typer.echo(join(["sbatch", "--parsable", f"{sub.paths.record}/job.sh"]))
    env = ", ".join(sorted({*slurm.cluster.env, *plan.env}))
    if env:
        typer.echo(f"# with {env} from {sub.paths.record}/env (0600), not in the script")
    return 0
