"""`vmrun sweep --nodes 1,2 --nproc-per-node 1,2 [train options]`: one training per size,
then a scaling report and a plot in `results/sweep-<id>/`; `--resume ID` continues one."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmrun.cli import run_options as ro
from vmrun.cli.options import (
    NO_FLAGS,
    SLURM_GROUP,
    ClusterName,
    Hosts,
    Reach,
    reaching,
    slurm_options,
    with_group,
)

BatchSizes = Annotated[
    str | None,
    typer.Option("--batch-size", metavar="B,B...", help="The template's per-process batch size."),
]
Lrs = Annotated[
    str | None, typer.Option("--lr", metavar="LR,LR...", help="The template's learning rate.")
]
EnvGrid = Annotated[
    list[str] | None,
    typer.Option(
        "--env",
        "-e",
        metavar="KEY[=V,V...]",
        help="Set a variable; repeatable; a list of values sweeps it (\\, for a comma).",
    ),
]
CpusPerTask = Annotated[
    str | None,
    typer.Option("--cpus-per-task", metavar="C,C...", help="-C: sbatch --cpus-per-task."),
]
GpusPerNode = Annotated[
    str | None,
    typer.Option("--gpus-per-node", metavar="G,G...", help="-C: GPUs per node [default: none]."),
]


def register(app: typer.Typer) -> None:
    @app.command(
        "sweep",
        help="Train at several sizes in turn (every --nodes x --nproc-per-node pair, smallest"
        " first; a list given to --cpus-per-task, --gpus-per-node, --batch-size, --lr or"
        " -e KEY=V,V is one more axis of the grid), fetch each run, then write a scaling"
        " report and a plot to results/sweep-<id>/. Ctrl-C stops the size in progress and"
        " keeps the others; --resume ID runs what is left.",
    )
    @with_group(
        SLURM_GROUP,
        "slurm",
        skip=("nodes", "max_requeues"),
        cpus_per_task=CpusPerTask,
        gpus_per_node=GpusPerNode,
    )
    @reaching()
    def sweep_command(
        script: ro.Script = None,
        nodes: Annotated[
            str | None,
            typer.Option("--nodes", metavar="N,N...", help="Node counts [default: 1]."),
        ] = None,
        nproc_per_node: Annotated[
            str | None,
            typer.Option(
                "--nproc-per-node", metavar="P,P...", help="Processes per node [default: 1]."
            ),
        ] = None,
        epochs: ro.Epochs = None,
        save_every: ro.SaveEvery = None,
        batch_size: BatchSizes = None,
        lr: Lrs = None,
        task: ro.Task = None,
        env: EnvGrid = None,
        name: ro.RunName = None,
        resume: Annotated[
            str | None,
            typer.Option("--resume", metavar="SWEEP_ID", help="Continue this sweep."),
        ] = None,
        local: Annotated[
            bool, typer.Option("--local", help="Sweep on this machine (--nodes 1 only).")
        ] = False,
        image: ro.ImageOption = None,
        mount: ro.Mounts = None,
        host: Hosts = None,
        cluster: ClusterName = None,
        verbose: ro.Verbose = False,
        detach: Annotated[
            bool,
            typer.Option(
                "--detach",
                help="On a cluster (-C): queue every size and return; `--resume SWEEP_ID`"
                " follows them and writes the report.",
            ),
        ] = False,
        max_cost: Annotated[
            str | None,
            typer.Option(
                "--max-cost",
                metavar="AMOUNT",
                help="On hosts: the sweep's sizes together may cost this much at the hosts'"
                " prices: each gets what is left as its own --max-cost, and none starts once it"
                " is spent [default: the max_cost setting, off].",
            ),
        ] = None,
        notify: ro.NotifyUrls = None,
        notify_on: ro.NotifyOn = None,
        reach: Reach = NO_FLAGS,
        slurm: dict[str, Any] | None = None,
    ) -> int:
        from vmrun.cli.report_cmd import show_table
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.sweep import Grid, sweep
        from vmrun.operations.train import RunOptions

        flags = dict(slurm or {})
        grid = Grid(
            nodes=nodes,
            nproc_per_node=nproc_per_node,
            batch_size=batch_size,
            lr=lr,
            env=env,
            cpus_per_task=flags.pop("cpus_per_task", None),
            gpus_per_node=flags.pop("gpus_per_node", None),
        )
        run = RunOptions(
            script=script,
            epochs=epochs,
            save_every=save_every,
            task=task,
            name=name,
            image=image,
            mounts=mount,
        )
        told = {"notify": notify, "notify_on": notify_on, "max_cost": max_cost}
        done = sweep(
            run,
            grid,
            reach.settings(**told),
            resume=resume,
            local=local,
            hosts=host,
            cluster=cluster,
            slurm=slurm_options(flags),
            verbose=verbose,
            detach=detach,
            out=TERMINAL,
        )
        if done.rows:
            show_table(done.rows)
        return done.code
