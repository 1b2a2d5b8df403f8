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

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from vmrun.cli import output
from vmrun.cli import run_options as ro
from vmrun.cli import train_cluster as tc
from vmrun.cli.options import AcceptNewHostKey, ClusterName, ConnectTimeout, Hosts, settings_from
from vmrun.errors import UsageError

_SCRIPT_ARGS = "vmrun.runs.plan.script_args"


class _DashDashCommand(TyperCommand):
    """Keeps the words after `--` for the script, so `train -- 5 2` is not read as SCRIPT=5."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_SCRIPT_ARGS] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- SCRIPT_ARGS...]"]


def register(app: typer.Typer) -> None:
    @app.command(
        "train",
        cls=_DashDashCommand,
        help="Launch torchrun DDP training on the host (or --local: this machine), detached"
        " so it survives disconnects, and stream its output; Ctrl-C detaches."
        " SCRIPT (default: vmrun's template trainer) gets `EPOCHS SAVE_EVERY`, or the words"
        " after `--` as-is. Files go to results/<run-id>/: train.log, run.json and the"
        " template's snapshot.pt, finalmodel.pt, metrics.jsonl; a SCRIPT runs in the project"
        " directory and writes where it always does.",
    )
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
        launcher: Annotated[
            str,
            typer.Option(
                "--launcher",
                metavar="torchrun|python|env",
                help="torchrun; python (the script spawns its own workers); env (one process"
                " with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set).",
            ),
        ] = "torchrun",
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
        verbose: ro.Verbose = False,
        cluster: ClusterName = None,
        nodes: tc.Nodes = None,
        gpus_per_node: tc.GpusPerNode = None,
        time: tc.Time = None,
        cpus_per_task: tc.CpusPerTask = None,
        mem: tc.Mem = None,
        constraint: tc.Constraint = None,
        qos: tc.Qos = None,
        partition: tc.Partition = None,
        account: tc.Account = None,
        sbatch_arg: tc.SbatchArg = None,
        max_requeues: tc.MaxRequeues = None,
        dry_run: tc.DryRun = False,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.runs.plan import make_plan

        slurm_opts = {
            "nodes": nodes, "gpus_per_node": gpus_per_node, "time": time,
            "cpus_per_task": cpus_per_task, "mem": mem, "constraint": constraint, "qos": qos,
            "partition": partition, "account": account, "sbatch_arg": sbatch_arg,
            "max_requeues": max_requeues, "dry_run": dry_run,
        }  # fmt: skip
        tc.check_flags(
            cluster, slurm_opts, {"-H": host, "--local": local, "--master": master,
            "--nnodes": nnodes, "--rdzv-port": rdzv_port, "--allow-concurrent": allow_concurrent,
            "--fresh": fresh, "--resume": resume, "--fetch-every": fetch_every,
            "--down-after-run": down_after_run},
        )  # fmt: skip

        user_args = ctx.meta.get(_SCRIPT_ARGS)
        wiring = _wiring(master, nnodes, rdzv_port, nccl_debug)
        if fresh and (resume is not None or local):
            raise UsageError(
                "--fresh moves the hosts' old checkpoints aside; --resume continues from"
                " them: use one"
                if resume is not None
                else "--fresh moves old checkpoints aside on hosts (-H); drop it with --local"
            )
        if resume is not None:
            _refuse_with_resume(
                ("SCRIPT", script), ("--epochs", epochs), ("--save-every", save_every),
                ("--nproc-per-node", nproc_per_node), ("--max-restarts", max_restarts),
                ("--name", name), ("--batch-size", batch_size), ("--lr", lr),
                ("--task", task), ("-- SCRIPT_ARGS", user_args), ("--local", local or None),
                ("--launcher", None if launcher == "torchrun" else launcher),
            )  # fmt: skip
        plan = make_plan(
            script=script,
            user_args=user_args,
            epochs=epochs,
            save_every=save_every,
            nproc_per_node=None if cluster else nproc_per_node,
            max_restarts=max_restarts or 0,
            env=env,
            name=name,
            batch_size=batch_size,
            lr=lr,
            launcher=launcher,
            task=task,
        )
        if cluster:
            settings = settings_from(connect_timeout, accept_new_host_key)
            return tc.train_on_cluster(
                plan, cluster, slurm_opts, nproc_per_node, settings, detach=detach,
                verbose=verbose,
            )  # fmt: skip
        if fetch_every is not None and (fetch_every <= 0 or detach or local):
            raise UsageError(
                "--fetch-every needs seconds > 0 and a run that vmrun follows"
                " (not --detach or --local; use `vmrun fetch --watch` for a detached run)"
            )
        if local:
            _check_local(host, detach, allow_concurrent, wiring, down_after_run)
            from vmrun.runs.local import run_local

            return run_local(plan, verbose=verbose, out=output.TERMINAL)
        from vmrun.backends.hosts.node_launch import Launch

        how = Launch(allow_concurrent=allow_concurrent, wiring=wiring, resume=resume, fresh=fresh,
                     down_after_run=down_after_run)  # fmt: skip
        settings = settings_from(connect_timeout, accept_new_host_key)
        return _train_remote(plan, host, settings, how, nnodes, detach, fetch_every, verbose)


def _refuse_with_resume(*flags: tuple[str, Any]) -> None:
    given = [flag for flag, value in flags if value is not None]
    if given:
        raise UsageError(f"--resume repeats the run as it was recorded; drop {', '.join(given)}")


def _check_local(
    host: Any, detach: bool, allow_concurrent: bool, wiring: Any, down: bool = False
) -> None:
    if host:
        raise UsageError("--local trains on this machine; drop -H or --local")
    flags = (("--detach", detach), ("--allow-concurrent", allow_concurrent))
    host_only = [f for f, v in (*flags, ("--down-after-run", down)) if v]
    if host_only:
        raise UsageError(
            f"{' and '.join(host_only)} {'are' if len(host_only) > 1 else 'is'} for"
            " runs on hosts (-H): a --local run stays in this terminal until it ends"
            " (Ctrl-C stops it) and is never refused for another run; drop"
            f" {'them' if len(host_only) > 1 else 'it'}"
        )
    if wiring.master or wiring.nnodes or wiring.rdzv_port:
        raise UsageError("--master, --nnodes and --rdzv-port are for several hosts")


def _train_remote(
    plan: Any,
    host: list[str] | None,
    settings: Any,
    how: Any,
    nnodes: str | None,
    detach: bool,
    fetch_every: float | None,
    verbose: bool = False,
) -> int:
    """Open the hosts once; for --resume, find the run there (one listing per host) and take
    its plan and nodes; then start (and follow) it on those connections."""
    from vmrun.backends.hosts.training import run_remote
    from vmrun.cli.fetch_view import make_progress
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    if how.down_after_run:
        from vmrun.backends.hosts.down_after import check_flags

        check_flags(fetch_every, detach=detach)
    entries = select_hosts(host, settings)
    with Group(entries, settings) as group:
        if how.resume is not None:
            from vmrun.backends.hosts.resume import load

            resumed = load(group, how.resume, plan.env)
            plan, how.listed = resumed.plan, resumed.listed
            entries = _nodes(entries, resumed.nodes, settings)
            if how.wiring.master is None and len(entries) > 1:
                w = how.wiring
                recorded = resumed.meta.get("nnodes") if nnodes is None else nnodes
                how.wiring = _wiring(
                    str(resumed.meta.get("master")), recorded, w.rdzv_port, w.nccl_debug
                )
            if any(e.label not in group.connections for e in entries):
                group = Group(entries, settings)  # a node the search did not include
        if how.wiring.nnodes is not None and len(entries) > 1:
            _check_nnodes(how.wiring.nnodes, len(entries))
        return run_remote(
            plan,
            entries,
            settings,
            detach=detach,
            out=output.TERMINAL,
            how=how,
            fetch_every=fetch_every,
            progress=make_progress(prefix=len(entries) > 1, live=sys.stderr.isatty()),
            group=group,
            verbose=verbose,
        )


def _nodes(entries: list[Any], labels: list[str], settings: Any) -> list[Any]:
    """The run's nodes, in its recorded order, as the host entries that found it."""
    from vmrun.ssh.inventory import select_hosts

    by_label = {e.label: e for e in entries}
    if all(label in by_label for label in labels):
        return [by_label[label] for label in labels]
    return select_hosts(labels, settings)


def _wiring(
    master: str | None, nnodes: str | None, rdzv_port: int | None, nccl_debug: str | None
) -> Any:
    from vmrun.backends.hosts.node_launch import NCCL_DEBUG_LEVELS, Wiring

    if nccl_debug is not None and nccl_debug.upper() not in NCCL_DEBUG_LEVELS:
        raise UsageError(f"--nccl-debug {nccl_debug}: use one of {', '.join(NCCL_DEBUG_LEVELS)}")
    if rdzv_port is not None and not 1 <= rdzv_port <= 65535:
        raise UsageError(f"--rdzv-port {rdzv_port}: ports are 1-65535")
    return Wiring(
        master=master,
        nnodes=nnodes,
        rdzv_port=rdzv_port,
        nccl_debug=nccl_debug.upper() if nccl_debug else None,
    )


def _check_nnodes(nnodes: str, hosts: int) -> None:
    """torchrun's --nnodes against the hosts given: N must be their number, MIN:MAX cover it."""
    import re

    match = re.fullmatch(r"([1-9][0-9]*)(?::([1-9][0-9]*))?", nnodes.strip())
    if not match:
        raise UsageError(f"--nnodes {nnodes!r}: use N or MIN:MAX with whole numbers >= 1")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if match.group(2) is None and low != hosts:
        raise UsageError(f"--nnodes {low} but {hosts} hosts were given; use MIN:MAX for elastic")
    if not low <= hosts <= high or low > high:
        raise UsageError(f"--nnodes {nnodes}: {hosts} hosts are not within MIN:MAX")
