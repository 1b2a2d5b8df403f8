"""`vmrun train [SCRIPT] [-- SCRIPT_ARGS...]`: launch DDP training on a host or this machine.

Without SCRIPT it runs vmrun's template trainer (`vmrun/trainer/template.py`). The CLI
process never imports torch: torch is checked for, and runs, only in child processes.

Where things go (the project dir is the nearest directory holding vmrun.toml, else the
current directory):
- `results/<run-id>/` in the project dir, with `run.json` (the run record, rewritten
  atomically at start and end) and `train.log` (the run's stdout and stderr, merged, as also
  streamed to this terminal). The run id is `<name or script stem>-<YYYYmmdd-HHMMSS>-<4 hex>`.
- The template writes snapshot.pt, finalmodel.pt and metrics.jsonl there too (its
  `--out-dir`). A user SCRIPT runs with the project dir as its working directory, exactly as
  `torchrun script.py` typed there would, so its files land where it puts them; it also gets
  VMRUN_RUN_ID and VMRUN_RUN_DIR to write into the run directory if it wants to.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vmrun.cli import run_options as ro
from vmrun.cli.options import (
    NO_FLAGS,
    SCRIPT_ARGS,
    SLURM_GROUP,
    ClusterName,
    Hosts,
    Reach,
    SectionedCommand,
    reaching,
    slurm_options,
    with_group,
)
from vmrun.cli.output import say


class TrainCommand(SectionedCommand):
    """`vmrun train --help`: the options most runs need, under headings; `--help-all`: all."""

    sections = (
        (
            "Run",
            (
                "local",
                "host",
                "cluster",
                "name",
                "env",
                "sets",
                "launcher",
                "nproc_per_node",
                "max_restarts",
                "detach",
                "resume",
                "verbose",
                "dry_run",
                "fetch_every",
                "allow_concurrent",
                "fresh",
                "down_after_run",
            ),
        ),
        (
            "The template trainer",
            ("epochs", "save_every", "batch_size", "lr", "task", "fsdp"),
        ),
        ("Container", ("image", "mount", "pull")),
        ("Data and outputs", ("data", "store")),
        ("Several hosts", ("master", "nnodes", "rdzv_port", "nccl_debug")),
        (
            "Reliability",
            (
                "recover",
                "spare",
                "supervisor",
                "max_recoveries",
                "hang_timeout",
                "on_hang",
                "ignore_gpu_health",
                "max_cost",
            ),
        ),
        ("Notify", ("notify", "notify_on")),
        (
            "Slurm (-C)",
            (
                "nodes",
                "gpus_per_node",
                "time",
                "partition",
                "account",
                "cpus_per_task",
                "mem",
                "constraint",
                "qos",
                "sbatch_args",
                "max_requeues",
            ),
        ),
        ("Connection", ("connect_timeout", "parallel", "accept_new_host_key")),
    )
    brief = frozenset(
        (
            "local",
            "host",
            "cluster",
            "name",
            "env",
            "sets",
            "launcher",
            "nproc_per_node",
            "detach",
            "resume",
            "fetch_every",
            "epochs",
            "save_every",
            "batch_size",
            "lr",
            "image",
            "data",
            "store",
            "recover",
            "spare",
            "supervisor",
            "hang_timeout",
            "max_cost",
            "notify",
            "nodes",
            "gpus_per_node",
            "time",
            "partition",
        )
    )


def register(app: typer.Typer) -> None:
    @app.command(
        "train",
        cls=TrainCommand,
        help="Launch torchrun DDP training on the host (or --local: this machine), detached"
        " so it survives disconnects, and stream its output; Ctrl-C detaches."
        " SCRIPT (default: vmrun's template trainer) gets `EPOCHS SAVE_EVERY`, or the words"
        " after `--` as-is. Files go to results/<run-id>/: train.log, run.json and the"
        " template's snapshot.pt, finalmodel.pt, metrics.jsonl; a SCRIPT runs in the project"
        " directory and writes where it always does.",
    )
    @with_group(SLURM_GROUP, "slurm")
    @reaching()
    def train_command(
        ctx: typer.Context,
        script: ro.Script = None,
        local: Annotated[
            bool, typer.Option("--local", help="Train on this machine (no SSH).")
        ] = False,
        epochs: ro.Epochs = None,
        save_every: ro.SaveEvery = None,
        nproc_per_node: Annotated[
            str | None,
            typer.Option(
                "--nproc-per-node",
                metavar="gpu|cpu|auto|N",
                help="Worker processes (torchrun's meaning for gpu/cpu/auto). Default: one per"
                " CUDA GPU, else 2 CPU processes (gloo).",
            ),
        ] = None,
        max_restarts: Annotated[
            int | None,
            typer.Option("--max-restarts", metavar="R", help="torchrun restarts [default: 0]."),
        ] = None,
        env: ro.EnvVars = None,
        name: ro.RunName = None,
        batch_size: ro.BatchSize = None,
        lr: ro.Lr = None,
        task: ro.Task = None,
        fsdp: ro.Fsdp = False,
        launcher: Annotated[
            str | None,
            typer.Option(
                "--launcher",
                metavar="torchrun|python|env",
                help="torchrun; python (the script spawns its own workers); env (one process"
                " with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set)"
                " [default: torchrun].",
            ),
        ] = None,
        image: ro.ImageOption = None,
        mount: ro.Mounts = None,
        pull: ro.PullOption = None,
        data: ro.DataOption = None,
        store: ro.StoreOption = None,
        host: Hosts = None,
        detach: Annotated[
            bool, typer.Option("--detach", help="Start the run and return at once.")
        ] = False,
        allow_concurrent: Annotated[
            bool,
            typer.Option("--allow-concurrent", help="Start even if the host is running a run."),
        ] = False,
        master: Annotated[
            str | None,
            typer.Option(
                "--master",
                metavar="HOST",
                help="Several hosts: where the rendezvous is (torch's c10d) [default: the"
                " first host].",
            ),
        ] = None,
        nnodes: Annotated[
            str | None,
            typer.Option(
                "--nnodes",
                metavar="N|MIN:MAX",
                help="Several hosts: torchrun's node count; MIN:MAX is elastic [default: the"
                " number of hosts].",
            ),
        ] = None,
        rdzv_port: Annotated[
            int | None,
            typer.Option(
                "--rdzv-port",
                metavar="PORT",
                help="Several hosts: the rendezvous port on the master [default: 29400, or the"
                " next free one].",
            ),
        ] = None,
        nccl_debug: Annotated[
            str | None,
            typer.Option(
                "--nccl-debug", metavar="LEVEL", help="NCCL_DEBUG: VERSION, WARN, INFO, TRACE."
            ),
        ] = None,
        fetch_every: Annotated[
            float | None,
            typer.Option(
                "--fetch-every",
                metavar="SECONDS",
                help="While following the run, fetch its new checkpoints this often (and its"
                " results at the end) into results/<run-id>/.",
            ),
        ] = None,
        down_after_run: Annotated[
            bool,
            typer.Option(
                "--down-after-run",
                help="Power the hosts off once the run has ended and --fetch-every has fetched"
                " its results (never before); see `vmrun autostop`.",
            ),
        ] = False,
        resume: Annotated[
            str | None,
            typer.Option(
                "--resume",
                metavar="RUN",
                help="Another attempt of RUN, on its hosts, with its script and arguments, from"
                " its newest snapshot (copied to every node first).",
            ),
        ] = None,
        fresh: Annotated[
            bool,
            typer.Option(
                "--fresh",
                help="Move checkpoint files an earlier run left in the run's folder on the"
                " hosts aside (into .vmrun-stale-<time>/ there) instead of loading them.",
            ),
        ] = False,
        recover: Annotated[
            bool,
            typer.Option(
                "--recover",
                help="A supervisor brings the run back by itself, laptop or not: on the same"
                " nodes when a rank crashes, with a --spare in a lost node's place (needs"
                " --store: the snapshots must outlive their node). Starts detached. On a"
                " cluster (-C) the job requeues itself, never again on a lost node.",
            ),
        ] = False,
        max_recoveries: ro.MaxRecoveries = None,
        spare: Annotated[
            list[str] | None,
            typer.Option(
                "--spare",
                metavar="HOST",
                help="--recover: a host to take a lost node's place; repeatable.",
            ),
        ] = None,
        supervisor: Annotated[
            str | None,
            typer.Option(
                "--supervisor",
                metavar="HOST",
                help="--recover: where the supervisor runs [default: the master].",
            ),
        ] = None,
        ignore_gpu_health: Annotated[
            bool,
            typer.Option(
                "--ignore-gpu-health",
                help="Start even where a GPU fails its health check (uncorrectable ECC errors,"
                " a pending page retirement or row remapping, an Xid that needs a reset).",
            ),
        ] = False,
        hang_timeout: Annotated[
            str | None,
            typer.Option(
                "--hang-timeout",
                metavar="PERIOD",
                help="No progress this long (no heartbeat, no line from a rank) while the run's"
                " processes live: the run is hung; said once, every rank's stacks taken (`vmrun"
                " stacks RUN --hang`). 10m, 1h..., or off [default: 20m].",
            ),
        ] = None,
        on_hang: Annotated[
            str | None,
            typer.Option(
                "--on-hang",
                metavar="wait|stop",
                help="What a hung run does: wait, or stop (failed, exit 124; a --recover run"
                " restarts from its snapshot) [default: stop with --recover, else wait].",
            ),
        ] = None,
        max_cost: ro.MaxCost = None,
        verbose: ro.Verbose = False,
        notify: ro.NotifyUrls = None,
        notify_on: ro.NotifyOn = None,
        cluster: ClusterName = None,
        dry_run: Annotated[
            bool,
            typer.Option(
                "--dry-run",
                help="Print what the start would do (-C: the batch script and the commands;"
                " -H: the sync and the launch on each host; --local: the launch here);"
                " send and start nothing.",
            ),
        ] = False,
        reach: Reach = NO_FLAGS,
        slurm: dict[str, Any] | None = None,
    ) -> int:
        from vmrun.backends.api import Prepared
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.train import HostOptions, RunOptions, train

        run = RunOptions(
            script=script,
            script_args=ctx.meta.get(SCRIPT_ARGS),
            epochs=epochs,
            save_every=save_every,
            nproc_per_node=nproc_per_node,
            max_restarts=max_restarts,
            env=env,
            name=name,
            batch_size=batch_size,
            lr=lr,
            task=task,
            fsdp=fsdp,
            launcher=launcher,
            image=image,
            mounts=mount,
            pull=pull,
            data=data,
            store=store,
        )
        hosts = HostOptions(
            hosts=host,
            master=master,
            nnodes=nnodes,
            rdzv_port=rdzv_port,
            nccl_debug=nccl_debug,
            allow_concurrent=allow_concurrent,
            fresh=fresh,
            fetch_every=fetch_every,
            down_after_run=down_after_run,
            recover=recover,
            max_recoveries=max_recoveries,
            spares=spare,
            supervisor=supervisor,
            ignore_gpu_health=ignore_gpu_health,
        )
        told = {
            "notify": notify,
            "notify_on": notify_on,
            "hang_timeout": hang_timeout,
            "on_hang": on_hang,
            "max_cost": max_cost,
        }
        settings = reach.settings(**told)
        done = train(
            run,
            settings,
            local=local,
            hosts=hosts,
            resume=resume,
            cluster=cluster,
            slurm=slurm_options(slurm or {}),
            dry_run=dry_run,
            detach=detach,
            verbose=verbose,
            out=TERMINAL,
        )
        return show_dry_run(done) if isinstance(done, Prepared) else done


def show_dry_run(dry: Any) -> int:
    """What `train --dry-run` would do on its target (its backend's `prepare`)."""
    for line in dry.lines:
        say(line)
    return 0
