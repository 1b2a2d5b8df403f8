"""`vmrun sweep --nodes 1,2 --nproc-per-node 1,2 [train options]`: one training per size,
then a scaling report and a plot in `results/sweep-<id>/`; `--resume ID` continues one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from vmrun.cli import run_options as ro
from vmrun.cli import train_cluster as tc
from vmrun.cli.options import AcceptNewHostKey, ClusterName, ConnectTimeout, Hosts, settings_from
from vmrun.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        "sweep",
        help="Train at several sizes in turn (every --nodes x --nproc-per-node pair, smallest"
        " first), fetch each run, then write a scaling report and a plot to"
        " results/sweep-<id>/. Ctrl-C stops the size in progress and keeps the others;"
        " --resume ID runs what is left.",
    )
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
        batch_size: ro.BatchSize = None,
        lr: ro.Lr = None,
        task: ro.Task = None,
        env: ro.EnvVars = None,
        name: ro.RunName = None,
        resume: Annotated[
            str | None,
            typer.Option("--resume", metavar="SWEEP_ID", help="Continue this sweep."),
        ] = None,
        local: Annotated[
            bool, typer.Option("--local", help="Sweep on this machine (--nodes 1 only).")
        ] = False,
        host: Hosts = None,
        cluster: ClusterName = None,
        gpus_per_node: tc.GpusPerNode = None,
        time: tc.Time = None,
        cpus_per_task: tc.CpusPerTask = None,
        mem: tc.Mem = None,
        constraint: tc.Constraint = None,
        qos: tc.Qos = None,
        partition: tc.Partition = None,
        account: tc.Account = None,
        sbatch_arg: tc.SbatchArg = None,
        verbose: ro.Verbose = False,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.cli.sweep_run import SweepJob, run_sweep

        given = {
            "script": script, "epochs": epochs, "save_every": save_every,
            "batch_size": batch_size, "lr": lr, "task": task, "name": name,
        }  # fmt: skip
        slurm_opts = {
            "nodes": None, "gpus_per_node": gpus_per_node, "time": time,
            "cpus_per_task": cpus_per_task, "mem": mem, "constraint": constraint, "qos": qos,
            "partition": partition, "account": account, "sbatch_arg": sbatch_arg,
            "max_requeues": None, "dry_run": False,
        }  # fmt: skip
        tc.check_flags(cluster, slurm_opts, {"-H": host, "--local": local})
        settings = settings_from(connect_timeout, accept_new_host_key)
        if resume is not None:
            parts = _resumed(resume, given, nodes, nproc_per_node, env, local, host, cluster)
        else:
            parts = _new(given, nodes, nproc_per_node, env, local, host, cluster)
            chosen = {k: v for k, v in slurm_opts.items() if v not in (None, False, [])}
            parts["sweep"].options["slurm"] = chosen  # a resumed sweep asks Slurm the same
        slurm_opts.update(parts["sweep"].options.get("slurm") or {})
        job = SweepJob(**parts, settings=settings, cluster_opts=slurm_opts, verbose=verbose)
        _check_hosts(job)
        return run_sweep(job)


def _where(local: bool, host: list[str] | None, cluster: str | None) -> dict[str, Any]:
    if local and host:
        raise UsageError("--local sweeps on this machine; drop -H or --local")
    if local:
        return {"local": True}
    if cluster:
        return {"cluster": cluster}
    return {"hosts": list(host) if host else None}


def _new(
    given: dict[str, Any],
    nodes: str | None,
    nproc_per_node: str | None,
    env: list[str] | None,
    local: bool,
    host: list[str] | None,
    cluster: str | None,
) -> dict[str, Any]:
    from vmrun.runs import launch
    from vmrun.runs.sweep import PREFIX, new_sweep, parse_counts, plan_sizes

    node_counts = parse_counts("--nodes", nodes)
    procs = parse_counts("--nproc-per-node", nproc_per_node)
    where = _where(local, host, cluster)
    if local and node_counts != [1]:
        raise UsageError("--local runs on this machine alone: --nodes must be 1 (or left out)")
    plan = _plan(given, env)
    script = None if plan.is_template else str(plan.script)  # the same file from anywhere
    options = {**given, "script": script, "env": [item.partition("=")[0] for item in env or []]}
    sweep = new_sweep(
        launch.run_id(PREFIX.rstrip("-")), where, options, plan_sizes(node_counts, procs)
    )
    return {"sweep": sweep, "plan": plan, "project": plan.project, "hosts": host,
            "cluster": cluster}  # fmt: skip


def _resumed(
    sweep_id: str,
    given: dict[str, Any],
    nodes: str | None,
    nproc_per_node: str | None,
    env: list[str] | None,
    local: bool,
    host: list[str] | None,
    cluster: str | None,
) -> dict[str, Any]:
    from vmrun.config import find_project_dir
    from vmrun.runs.sweep import load

    flags = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    flags += [f for f, v in (("--nodes", nodes), ("--nproc-per-node", nproc_per_node)) if v]
    flags += [f for f, v in (("--local", local), ("-H", host), ("-C", cluster)) if v]
    if flags:
        raise UsageError(
            f"--resume repeats the sweep as it was recorded; drop {', '.join(sorted(flags))}"
        )
    project = find_project_dir() or Path.cwd()
    sweep = load(project, sweep_id)
    if not sweep.left():
        raise UsageError(f"sweep {sweep.id} is complete: every size is done")
    recorded = sweep.options
    names = {item.partition("=")[0] for item in env or []}
    missing = [k for k in recorded.get("env", []) if k not in names]
    unset = [k for k in missing if k not in os.environ]
    if unset:
        raise UsageError(
            f"sweep {sweep.id} was started with --env {', '.join(unset)}, whose values are not"
            " recorded: set them here or pass --env KEY=VALUE again"
        )
    plan = _plan({k: recorded.get(k) for k in given}, [*(env or []), *missing])
    return {"sweep": sweep, "plan": plan, "project": project,
            "hosts": sweep.where.get("hosts"), "cluster": sweep.where.get("cluster")}  # fmt: skip


def _plan(given: dict[str, Any], env: list[str] | None) -> Any:
    from vmrun.runs.plan import make_plan

    return make_plan(
        script=given["script"], user_args=None, epochs=given["epochs"],
        save_every=given["save_every"], nproc_per_node=None, max_restarts=0, env=env,
        name=given["name"], batch_size=given["batch_size"], lr=given["lr"], task=given["task"],
        launcher="torchrun",
    )  # fmt: skip


def _check_hosts(job: Any) -> None:
    """Enough hosts for the largest size, said before anything starts."""
    most = max(size.nodes for size in job.sweep.left())
    if job.cluster or job.sweep.where.get("local") or most <= 1:
        return
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(job.hosts, job.settings)
    if len(entries) < most:
        raise UsageError(
            f"--nodes asks for up to {most} nodes but {len(entries)} host(s) are given;"
            " add hosts with -H (or to vmrun.toml) or drop the larger node counts"
        )
