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
GRID_FLAGS = {"cpus_per_task": "--cpus-per-task", "gpus_per_node": "--gpus-per-node",
              "batch_size": "--batch-size", "lr": "--lr"}  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command(
        "sweep",
        help="Train at several sizes in turn (every --nodes x --nproc-per-node pair, smallest"
        " first; a list given to --cpus-per-task, --gpus-per-node, --batch-size, --lr or"
        " -e KEY=V,V is one more axis of the grid), fetch each run, then write a scaling"
        " report and a plot to results/sweep-<id>/. Ctrl-C stops the size in progress and"
        " keeps the others; --resume ID runs what is left.",
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
        host: Hosts = None,
        cluster: ClusterName = None,
        gpus_per_node: GpusPerNode = None,
        time: tc.Time = None,
        cpus_per_task: CpusPerTask = None,
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

        lists = {"cpus_per_task": cpus_per_task, "gpus_per_node": gpus_per_node,
                 "batch_size": batch_size, "lr": lr}  # fmt: skip
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
            given.update(lists)  # each refused: the record says what the sweep runs
            parts = _resumed(resume, given, nodes, nproc_per_node, env, local, host, cluster)
        else:
            fixed, axes, env = _grid(lists, env)
            given.update((k, fixed.get(k)) for k in ("batch_size", "lr"))
            slurm_opts.update((k, fixed.get(k)) for k in ("cpus_per_task", "gpus_per_node"))
            gpus = fixed.get("gpus_per_node")
            parts = _new(given, nodes, nproc_per_node, env, local, host, cluster, axes, gpus)
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


def _grid(
    lists: dict[str, str | None], env: list[str] | None
) -> tuple[dict[str, Any], list[Any], list[str]]:
    """The options given one value (as `train` takes them), the axes given several (in a
    fixed order, then -e's in the order given), and the -e items that stay fixed."""
    from vmrun.runs.sweep import parse_counts, parse_numbers, split_values

    fixed: dict[str, Any] = {}
    axes: list[Any] = []
    for key, text in lists.items():
        if text is None:
            continue
        flag = GRID_FLAGS[key]
        values: list[Any] = (
            parse_numbers(flag, text) if key == "lr" else
            parse_counts(flag, text, least=0 if key == "gpus_per_node" else 1)
        )  # fmt: skip
        if len(values) == 1:
            fixed[key] = values[0]
        else:
            axes.append((key, values))
    plain: list[str] = []
    names = [item.partition("=")[0] for item in env or []]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"-e {', '.join(twice)} given twice: give each variable once")
    for item in env or []:
        name, sep, value = item.partition("=")
        options = split_values(value) if sep else [value]
        if len(options) > 1:
            axes.append((f"env:{name}", options))
        else:
            plain.append(f"{name}={options[0]}" if sep else name)
    return fixed, axes, plain


def _point_plans(sweep: Any, given: dict[str, Any], env: list[str]) -> dict[str, Any]:
    """Each point's plan, by its label (its batch size, learning rate and -e values): every
    one made, so a bad value stops the sweep before anything starts."""
    plans = {}
    for size in sweep.sizes:
        values = size.values
        own = {k: values[k] for k in ("batch_size", "lr") if k in values}
        extra = [f"{k[4:]}={v}" for k, v in values.items() if k.startswith("env:")]
        plans[size.label] = _plan({**given, **own}, [*env, *extra])
    return plans


def _new(
    given: dict[str, Any],
    nodes: str | None,
    nproc_per_node: str | None,
    env: list[str] | None,
    local: bool,
    host: list[str] | None,
    cluster: str | None,
    axes: list[Any],
    gpus: int | None,
) -> dict[str, Any]:
    from vmrun.runs import launch
    from vmrun.runs.sweep import PREFIX, new_sweep, one_process_per_gpu, parse_counts, plan_sizes

    node_counts = parse_counts("--nodes", nodes)
    procs = parse_counts("--nproc-per-node", nproc_per_node)
    where = _where(local, host, cluster)
    if local and node_counts != [1]:
        raise UsageError("--local runs on this machine alone: --nodes must be 1 (or left out)")
    plan = _plan(given, env)
    script = None if plan.is_template else str(plan.script)  # the same file from anywhere
    options = {**given, "script": script, "env": [item.partition("=")[0] for item in env or []]}
    sizes = plan_sizes(node_counts, procs, axes)
    if cluster and nproc_per_node is None:
        sizes = one_process_per_gpu(sizes, gpus)
    sweep = new_sweep(launch.run_id(PREFIX.rstrip("-")), where, options, sizes)
    return {"sweep": sweep, "plan": plan, "project": plan.project, "hosts": host,
            "cluster": cluster, "plans": _point_plans(sweep, given, env or [])}  # fmt: skip


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
        raise UsageError(f"sweep {sweep.id} is complete: every size is done", code="sweep-complete")
    recorded = sweep.options
    names = {item.partition("=")[0] for item in env or []}
    missing = [k for k in recorded.get("env", []) if k not in names]
    unset = [k for k in missing if k not in os.environ]
    if unset:
        raise UsageError(
            f"sweep {sweep.id} was started with --env {', '.join(unset)}, whose values are not"
            " recorded: set them here or pass --env KEY=VALUE again",
            code="env-value-missing",
        )
    shared = {k: recorded.get(k) for k in given}
    plan = _plan(shared, [*(env or []), *missing])
    return {"sweep": sweep, "plan": plan, "project": project,
            "hosts": sweep.where.get("hosts"), "cluster": sweep.where.get("cluster"),
            "plans": _point_plans(sweep, shared, [*(env or []), *missing])}  # fmt: skip


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
