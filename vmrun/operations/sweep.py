"""`vmrun sweep` as a library: the grid (`Grid`: node counts, processes per node, and any
list of batch sizes, learning rates, sbatch CPUs/GPUs or -e values), planned into sizes (a
new sweep) or read back from its record (`resume`), then run (vmrun.operations.sweep_run).

    from vmrun.operations.sweep import Grid, sweep
    from vmrun.operations.train import RunOptions
    outcome = sweep(RunOptions(epochs=2), Grid(nproc_per_node="1,2"), local=True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmrun.backends.select import Target
from vmrun.backends.slurm.options import SlurmOptions
from vmrun.config import Settings, load_settings
from vmrun.errors import UsageError
from vmrun.operations import refusals
from vmrun.operations.sweep_run import SweepJob, SweepOutcome, run_sweep
from vmrun.operations.train import RunOptions
from vmrun.reporting import QUIET, Reporter

GRID_FLAGS = {
    "cpus_per_task": "--cpus-per-task",
    "gpus_per_node": "--gpus-per-node",
    "batch_size": "--batch-size",
    "lr": "--lr",
}


@dataclass
class Grid:
    """A sweep's lists as given, each a comma list ("1,2") or None. One value is a fixed
    option (as `train` takes it); several are one more axis of the grid."""

    nodes: str | None = None  # [default: 1]
    nproc_per_node: str | None = None  # [default: 1; on a cluster, one per GPU]
    cpus_per_task: str | None = None  # -C
    gpus_per_node: str | None = None  # -C
    batch_size: str | None = None
    lr: str | None = None
    env: list[str] | None = None  # KEY[=V,V...]; `\,` for a comma in a value

    def flags(self) -> dict[str, Any]:
        return {
            "--nodes": self.nodes,
            "--nproc-per-node": self.nproc_per_node,
            "--cpus-per-task": self.cpus_per_task,
            "--gpus-per-node": self.gpus_per_node,
            "--batch-size": self.batch_size,
            "--lr": self.lr,
            "--env": self.env,
        }


def sweep(
    run: RunOptions,
    grid: Grid,
    settings: Settings | None = None,
    *,
    resume: str | None = None,
    local: bool = False,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    slurm: SlurmOptions | None = None,
    verbose: bool = False,
    detach: bool = False,
    out: Reporter = QUIET,
) -> SweepOutcome:
    """Plan the sweep (or load `resume`'s record) and run every size not done yet. Of `run`,
    the sweep takes script, epochs, save_every, task and name (the rest are the grid's).
    `slurm`: the sbatch options besides the grid's (on `cluster`). `detach`: on a cluster,
    queue every size and return (`resume` later follows them and writes the report)."""
    slurm = slurm or SlurmOptions()
    given = {
        "script": run.script,
        "epochs": run.epochs,
        "save_every": run.save_every,
        "batch_size": None,
        "lr": None,
        "task": run.task,
        "name": run.name,
        "image": run.image,
        "mounts": run.mounts,
    }
    refusals.check(
        "sweep",
        {
            **slurm.flags(),
            "SCRIPT": run.script,
            "--epochs": run.epochs,
            "--save-every": run.save_every,
            "--task": run.task,
            "--name": run.name,
            **grid.flags(),
            "--resume": resume,
            "--local": local,
            "-H": hosts,
            "-C": cluster,
            "--image": run.image,
            "--mount": run.mounts,
        },
    )
    settings = settings or load_settings({})
    target = Target.of(local=local, hosts=hosts, cluster=cluster)
    if resume is not None:
        parts = _resumed(resume, given, grid.env, settings)
    else:
        lists = {
            "cpus_per_task": grid.cpus_per_task,
            "gpus_per_node": grid.gpus_per_node,
            "batch_size": grid.batch_size,
            "lr": grid.lr,
        }
        fixed, axes, env = parse_grid(lists, grid.env)
        given.update((k, fixed.get(k)) for k in ("batch_size", "lr"))
        gpus = fixed.get("gpus_per_node")
        slurm = replace(slurm, cpus_per_task=fixed.get("cpus_per_task"), gpus_per_node=gpus)
        parts = _new(given, grid, env, target, axes, gpus, settings)
        parts["sweep"].options["slurm"] = slurm.given()  # a resumed sweep asks Slurm the same
    caps = Target.recorded(parts["sweep"].where).capabilities  # a resumed sweep's own
    if settings.max_cost and not caps.max_cost:
        from vmrun.operations.train import refuse_uncapped

        refuse_uncapped(settings, f"a sweep on {caps.what}, which has no price", out)
    recorded = SlurmOptions.from_record(parts["sweep"].options.get("slurm") or {})
    if detach and not caps.queued_sweeps:
        raise UsageError(
            "--detach queues a sweep on a cluster (-C NAME); on hosts the sweep"
            f" runs its sizes one after another (capability: queued_sweeps, which {caps.what}"
            " lacks)",
            code="flags-conflict",
        )
    job = SweepJob(
        **parts, settings=settings, slurm=recorded, verbose=verbose, out=out, detach=detach
    )
    _check_hosts(job)
    return run_sweep(job)


def parse_grid(
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
            parse_numbers(flag, text)
            if key == "lr"
            else parse_counts(flag, text, least=0 if key == "gpus_per_node" else 1)
        )
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


def point_plans(
    sweep: Any, given: dict[str, Any], env: list[str], settings: Settings | None = None
) -> dict[str, Any]:
    """Each point's plan, by its label (its batch size, learning rate and -e values): every
    one made, so a bad value stops the sweep before anything starts."""
    plans = {}
    for size in sweep.sizes:
        values = size.values
        own = {k: values[k] for k in ("batch_size", "lr") if k in values}
        extra = [f"{k[4:]}={v}" for k, v in values.items() if k.startswith("env:")]
        plans[size.label] = make_plan({**given, **own}, [*env, *extra], settings)
    return plans


def _new(
    given: dict[str, Any],
    grid: Grid,
    env: list[str],
    target: Target,
    axes: list[Any],
    gpus: int | None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    from vmrun.runs import launch
    from vmrun.runs.sweep import PREFIX, new_sweep, one_process_per_gpu, parse_counts, plan_sizes

    node_counts = parse_counts("--nodes", grid.nodes)
    procs = parse_counts("--nproc-per-node", grid.nproc_per_node)
    caps = target.capabilities
    if not caps.several_nodes and node_counts != [1]:
        raise UsageError(
            "--local runs on this machine alone: --nodes must be 1 (or left out)"
            f" (capability: several_nodes, which {caps.what} lacks)"
        )
    plan = make_plan(given, env, settings)
    script = None if plan.is_template else str(plan.script)  # the same file from anywhere
    options = {**given, "script": script, "env": [item.partition("=")[0] for item in env]}
    sizes = plan_sizes(node_counts, procs, axes)
    if caps.scheduler and grid.nproc_per_node is None:  # it allots the GPUs: one process each
        sizes = one_process_per_gpu(sizes, gpus)
    sweep = new_sweep(launch.run_id(PREFIX.rstrip("-")), target.record(), options, sizes)
    return {
        "sweep": sweep,
        "plan": plan,
        "project": plan.project,
        "hosts": target.host_list,
        "cluster": target.cluster,
        "plans": point_plans(sweep, given, env, settings),
    }


def _resumed(
    sweep_id: str, given: dict[str, Any], env: list[str] | None, settings: Settings | None = None
) -> dict[str, Any]:
    """The recorded sweep, with what is left of it; -e gives values its record leaves out."""
    from vmrun.config import find_project_dir
    from vmrun.runs.sweep import load

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
    plan = make_plan(shared, [*(env or []), *missing], settings)
    return {
        "sweep": sweep,
        "plan": plan,
        "project": project,
        "hosts": sweep.where.get("hosts"),
        "cluster": sweep.where.get("cluster"),
        "plans": point_plans(sweep, shared, [*(env or []), *missing], settings),
    }


def make_plan(
    given: dict[str, Any], env: list[str] | None, settings: Settings | None = None
) -> Any:
    """A point's plan: `train`'s, from the sweep's options and the point's values (and the
    image settings of `settings` where the sweep gave no --image)."""
    run = RunOptions(
        script=given["script"],
        epochs=given["epochs"],
        save_every=given["save_every"],
        env=env,
        name=given["name"],
        batch_size=given["batch_size"],
        lr=given["lr"],
        task=given["task"],
        image=given.get("image"),
        mounts=given.get("mounts"),
    )
    return run.plan(nproc_per_node=None, settings=settings)


def _check_hosts(job: SweepJob) -> None:
    """Enough hosts for the largest size, said before anything starts."""
    most = max(size.nodes for size in job.sweep.left())
    if not job.target.capabilities.several_hosts or most <= 1:  # hosts the user gives
        return
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(job.hosts, job.settings)
    if len(entries) < most:
        raise UsageError(
            f"--nodes asks for up to {most} nodes but {len(entries)} host(s) are given;"
            " add hosts with -H (or to vmrun.toml) or drop the larger node counts"
        )
