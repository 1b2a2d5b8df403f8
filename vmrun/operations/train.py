"""`vmrun train` as a library: what the run trains (`RunOptions`), where (this machine, SSH
hosts with `HostOptions`, or a Slurm cluster with `SlurmOptions`), and `train`, which refuses
flags that do not go together (vmrun.operations.refusals), makes the plan, loads a resumed
run's record, and hands the plan to the backend's flow.

    from vmrun.operations.train import RunOptions, train
    code = train(RunOptions(epochs=2), local=True)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vmrun.backends.api import Prepared, StartOptions
from vmrun.backends.select import Target, Training, open_training
from vmrun.backends.slurm.options import SlurmOptions
from vmrun.config import Settings, load_settings
from vmrun.errors import UsageError
from vmrun.operations import refusals
from vmrun.reporting import QUIET, Reporter
from vmrun.runs.plan import Plan

# where a RunOptions field's flag is not its name with dashes
_FLAG_NAMES = {"script": "SCRIPT", "script_args": "-- SCRIPT_ARGS", "mounts": "--mount"}


@dataclass
class RunOptions:
    """What a run trains: `train`'s and `sweep`'s shared options, as given (None: the
    default). `script_args` are the words after `--` on the command line."""

    script: str | None = None
    script_args: list[str] | None = None
    epochs: int | None = None
    save_every: int | None = None
    nproc_per_node: str | None = None  # gpu|cpu|auto|N
    max_restarts: int | None = None
    env: list[str] | None = None  # KEY[=VALUE]
    name: str | None = None
    batch_size: int | None = None
    lr: float | None = None
    task: str | None = None
    fsdp: bool = False  # the template's FSDP2 and sharded checkpoints
    launcher: str | None = None  # torchrun (the default), python or env
    image: str | None = None  # None: vmrun.toml's `image`, if any
    mounts: list[str] | None = None  # SRC:DST[:ro], added to vmrun.toml's `mounts`
    pull: str | None = None  # newer|missing|always|never; None: vmrun.toml's `pull`
    data: list[str] | None = None  # PATH[:DIR], pushed to every node before the run
    store: str | None = None  # s3://BUCKET/PREFIX; None: vmrun.toml's `store`, "" none

    def flags(self) -> dict[str, Any]:
        """Each option under the name the user gave it by (`--save-every`), in field order."""
        return {
            _FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-")): getattr(self, f.name)
            for f in fields(self)
        }

    def plan(self, *, nproc_per_node: str | None, settings: Settings | None = None) -> Plan:
        """Every value checked (UsageError before anything starts), as a Plan; `settings`
        give the image and mounts that the command line does not."""
        from vmrun.containers.request import Asked, asked_from
        from vmrun.runs.plan import make_plan

        containers = (
            asked_from(self.image, self.mounts, settings, self.pull)
            if settings is not None
            else Asked(self.image or "", tuple(self.mounts or ()), pull=self.pull or "")
        )
        return make_plan(
            script=self.script,
            user_args=self.script_args,
            epochs=self.epochs,
            save_every=self.save_every,
            nproc_per_node=nproc_per_node,
            max_restarts=self.max_restarts or 0,
            env=self.env,
            name=self.name,
            batch_size=self.batch_size,
            lr=self.lr,
            launcher=self.launcher or "torchrun",
            task=self.task,
            fsdp=self.fsdp,
            containers=containers,
            data=self.data,
            store_credentials=settings.store_credentials if settings else "auto",
            store=self.store if self.store is not None else (settings.store if settings else ""),
        )


@dataclass
class HostOptions:
    """Where and how a run on SSH hosts starts and is followed (`train -H`)."""

    hosts: list[str] | None = None  # None: $VMRUN_HOSTS, else vmrun.toml's
    master: str | None = None
    nnodes: str | None = None  # N or MIN:MAX
    rdzv_port: int | None = None
    nccl_debug: str | None = None
    allow_concurrent: bool = False
    fresh: bool = False
    fetch_every: float | None = None
    down_after_run: bool = False
    # --resume by the supervisor (vmrun.recovery): lost node -> the host taking its place,
    # and the outputs from the run's bucket (its master, with the snapshots, is gone)
    replace: dict[str, str] = field(default_factory=dict)
    from_store: bool = False
    # --recover: a supervisor brings the run back by itself (vmrun.recovery)
    recover: bool = False
    max_recoveries: int | None = None
    spares: list[str] | None = None
    supervisor: str | None = None
    ignore_gpu_health: bool = False  # start where a GPU's health check fails

    def flags(self) -> dict[str, Any]:
        return {
            "-H": self.hosts,
            "--master": self.master,
            "--nnodes": self.nnodes,
            "--rdzv-port": self.rdzv_port,
            "--nccl-debug": self.nccl_debug,
            "--allow-concurrent": self.allow_concurrent,
            "--fresh": self.fresh,
            "--fetch-every": self.fetch_every,
            "--down-after-run": self.down_after_run,
            "--recover": self.recover,
            "--max-recoveries": self.max_recoveries,
            "--spare": self.spares,
            "--supervisor": self.supervisor,
            "--ignore-gpu-health": self.ignore_gpu_health,
        }


# what `train --dry-run` returns, on every target: the lines it prints
DryRun = Prepared


def train(
    run: RunOptions,
    settings: Settings | None = None,
    *,
    local: bool = False,
    hosts: HostOptions | None = None,
    resume: str | None = None,
    cluster: str | None = None,
    slurm: SlurmOptions | None = None,
    dry_run: bool = False,
    detach: bool = False,
    verbose: bool = False,
    out: Reporter = QUIET,
) -> int | Prepared:
    """Train `run` on this machine (`local`), a Slurm `cluster`, or SSH hosts (the default);
    the run's exit code (0 once a detached run has started), or what a start would do
    (`dry_run`, nothing sent). `settings`: None loads the project's (vmrun.toml).

    One flow whatever the target: refuse what the target lacks, plan, open its backend,
    then `prepare` (--dry-run) or `start` and follow the run to its end, telling it."""
    hosts = hosts or HostOptions()
    slurm = slurm or SlurmOptions()
    refusals.check(
        "train",
        {
            **run.flags(),
            **hosts.flags(),
            **slurm.flags(),
            "--local": local,
            "--resume": resume,
            "-C": cluster,
            "--dry-run": dry_run,
            "--detach": detach,
        },
    )
    target = Target.of(local=local, hosts=hosts.hosts, cluster=cluster)
    caps = target.capabilities
    wiring = _wiring(hosts.master, hosts.nnodes, hosts.rdzv_port, hosts.nccl_debug)
    settings = settings or load_settings({})
    if settings.max_cost and not caps.max_cost:
        refuse_uncapped(settings, f"a run on {caps.what}, which has no price", out)
    # a scheduler places the processes itself: --nproc-per-node goes to its job
    plan = run.plan(
        nproc_per_node=None if caps.scheduler else run.nproc_per_node, settings=settings
    )
    if hosts.fetch_every is not None and hosts.fetch_every <= 0:
        raise UsageError(
            "--fetch-every needs seconds > 0 and a run that vmrun follows"
            " (not --detach or --local; use `vmrun fetch --watch` for a detached run)"
        )
    from vmrun.notify.send import Notify

    how = StartOptions(
        allow_concurrent=hosts.allow_concurrent,
        resume=resume,
        fresh=hosts.fresh,
        down_after_run=hosts.down_after_run,
        notify=Notify.from_settings(settings.notify, settings.notify_on) or None,
        ignore_gpu_health=hosts.ignore_gpu_health,
    )
    given = _Given(target, run, hosts, slurm, settings, wiring, dry_run, verbose, out)
    with _OPEN[target.kind](given, plan, how) as ready:
        if dry_run:
            return ready.training.prepare(ready.plan, ready.how)
        progress = out.progress(several=ready.several) if ready.progress else None
        ref = ready.training.start(ready.plan, ready.how, out, progress)
        if detach or ready.detached:
            out.info(ready.training.detached(ref))
            return 0
        return ready.training.follow_and_tell(ref, ready.how.notify, out, verbose=verbose)


@dataclass(frozen=True)
class _Given:
    """What `train` was given, for the step that opens its target."""

    target: Target
    run: RunOptions
    hosts: HostOptions
    slurm: SlurmOptions
    settings: Settings
    wiring: Any
    dry_run: bool
    verbose: bool
    out: Reporter


@dataclass(frozen=True)
class _Ready:
    """A target opened for a run: its training verbs, and the plan and options as that
    target takes them (a resumed run's own plan, a cluster's recovery limit...).
    `detached`: the run is followed by other means than vmrun here (a supervisor)."""

    training: Training
    plan: Plan
    how: StartOptions
    detached: bool = False
    several: bool = False
    progress: bool = True  # the files it sends shown as they go


@contextmanager
def _open_local(given: _Given, plan: Plan, how: StartOptions) -> Iterator[_Ready]:
    with open_training(given.target, given.settings, verbose=given.verbose) as training:
        yield _Ready(training, plan, how, progress=False)


@contextmanager
def _open_cluster(given: _Given, plan: Plan, how: StartOptions) -> Iterator[_Ready]:
    """The cluster's login node, and the plan as a job takes it: its hang watch, its cap,
    and --recover's limit (the job brings itself back: slurm_recover.bash)."""
    settings, hosts, name = given.settings, given.hosts, str(given.target.cluster)
    recoveries = 0
    if hosts.recover or settings.recover:
        recoveries = refusals.recovery_limit(hosts.max_recoveries, settings.max_recoveries)
    plan = _watched(plan, settings, recover=recoveries > 0)
    plan = replace(plan, max_cost=settings.max_cost)  # else the cluster's (its backend)
    if plan.store is not None:  # vmrun.toml's (a --store flag is refused with -C)
        given.out.warn(
            f"store = {plan.store} is for runs on hosts; this Slurm run's files stay on"
            f" the cluster's shared filesystem (`vmrun fetch -C {name}`)"
        )
    from vmrun.backends.slurm.cluster import find_cluster
    from vmrun.backends.slurm.job import check_spec

    spec = given.slurm.job_spec(find_cluster(settings, name), given.run.nproc_per_node)
    spec = check_spec(spec, plan.launcher)
    with open_training(given.target, settings, spec=spec) as training:
        yield _Ready(training, plan, replace(how, max_recoveries=recoveries))


@contextmanager
def _open_hosts(given: _Given, plan: Plan, how: StartOptions) -> Iterator[_Ready]:
    """Open the hosts once; for --resume, find the run there (one listing per host) and take
    its plan and nodes; for --recover, its supervisor and spares; then the run starts on
    those connections. A dry run reaches no host."""
    from vmrun.backends.hosts.node_launch import Placement
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    hosts, settings, out = given.hosts, given.settings, given.out
    place = Placement(given.wiring)
    entries = select_hosts(given.target.host_list, settings)
    with Group(entries, settings) as group:
        supervised = None
        if how.resume is not None:  # (a dry run resumes nothing: refused)
            plan, entries, group = _resumed(plan, hosts, how, place, entries, group, settings)
        if place.wiring.nnodes is not None and len(entries) > 1:
            check_nnodes(place.wiring.nnodes, len(entries))
        recover = hosts.recover or settings.recover
        if recover and how.resume is None and not given.dry_run:  # a supervisor made ready
            entries, group, supervised = _supervised(
                plan, hosts, how, entries, group, settings, out
            )
            plan = replace(plan, recover=True)
        if how.resume is None:  # a resumed run keeps its own (its run.json's)
            plan = _watched(plan, settings)
        if settings.max_cost or how.resume is None:  # a resumed run's own cap, unless given
            plan = replace(plan, max_cost=settings.max_cost)
        on_start = supervised.start(out) if supervised else None
        with open_training(
            given.target,
            settings,
            entries=entries,
            group=group,
            place=place,
            fetch_every=hosts.fetch_every,
            on_start=on_start,
        ) as training:
            several = len(entries) > 1
            yield _Ready(training, plan, how, detached=supervised is not None, several=several)


_OPEN = {"local": _open_local, "cluster": _open_cluster, "hosts": _open_hosts}


def _resumed(
    plan: Plan,
    hosts: HostOptions,
    how: StartOptions,
    place: Any,
    entries: list[Any],
    group: Any,
    settings: Settings,
) -> tuple[Plan, list[Any], Any]:
    """--resume on hosts: the run's own plan and nodes, as its record says (a lost node
    replaced, its outputs from the run's bucket where its master is gone)."""
    from vmrun.backends.hosts.resume import load
    from vmrun.ssh.group import Group

    assert how.resume is not None
    resumed = load(group, how.resume, plan.env, plan.store, settings.store_credentials)
    plan, place.listed, place.restore = resumed.plan, resumed.listed, resumed.restore
    if hosts.from_store and place.restore is None and plan.store is not None:
        from vmrun.stores.sync import run_place

        place.restore = run_place(plan.store, how.resume)
    swap = hosts.replace
    entries = _nodes(entries, [swap.get(n, n) for n in resumed.nodes], settings)
    if place.wiring.master is None and len(entries) > 1 and not resumed.restore:
        w = place.wiring
        nnodes = resumed.record.launch.nnodes
        recorded = nnodes if hosts.nnodes is None else hosts.nnodes
        master = resumed.record.master
        place.wiring = _wiring(swap.get(master, master), recorded, w.rdzv_port, w.nccl_debug)
    if any(e.label not in group.connections for e in entries):
        group = Group(entries, settings)  # a node the search did not include
    return plan, entries, group


def _supervised(
    plan: Plan,
    hosts: HostOptions,
    how: StartOptions,
    entries: list[Any],
    group: Any,
    settings: Settings,
    out: Reporter,
) -> tuple[list[Any], Any, Any]:
    """--recover on hosts: unfit nodes swapped for spares, and the run's supervisor made
    ready (its host while the run is staged); it follows the run, not vmrun here."""
    from vmrun.recovery.deploy import Supervised
    from vmrun.ssh.group import Group

    spares = hosts.spares if hosts.spares is not None else settings.spares
    if spares and not how.ignore_gpu_health:
        entries, spares = swap_unfit(entries, spares, settings, out)
        if any(e.label not in group.connections for e in entries):
            group = Group(entries, settings)
    supervised = Supervised.check(
        plan,
        entries,
        settings,
        spares=spares,
        supervisor=hosts.supervisor or settings.supervisor or None,
        max_recoveries=refusals.recovery_limit(hosts.max_recoveries, settings.max_recoveries),
    )
    supervised.begin()  # its host made ready while the run is staged
    return entries, group, supervised


def data_dest(where: str | None, code: str) -> str:
    from vmrun.transfer.manifest import normalize_remote

    if not where:
        return code
    return normalize_remote(where, base=code, where="the project's work directory")


def refuse_uncapped(settings: Settings, what: str, out: Reporter) -> None:
    """--max-cost where it cannot be kept: refused when asked on the command line, said
    once when it comes from vmrun.toml or the environment (the setting is for hosts)."""
    if settings.sources.get("max_cost") == "command line":
        raise UsageError(
            f"--max-cost cannot cap {what}; nothing started",
            hint="drop --max-cost",
            code="over-budget",
        )
    out.warn(
        f"max_cost {settings.max_cost:g} ({settings.sources.get('max_cost')}) does not cap {what}"
    )


def _watched(plan: Plan, settings: Settings, *, recover: bool = False) -> Plan:
    """The plan with its hang watch (`hang_timeout`, `on_hang`: flags over vmrun.toml);
    `recover`: brought back by other means than plan.recover (a Slurm job)."""
    from vmrun.setting_types import OFF, period_seconds

    if settings.hang_timeout == OFF:
        return replace(plan, hang_timeout=0)
    action = settings.on_hang
    if action == "auto":
        action = "stop" if plan.recover or recover else "wait"
    return replace(plan, hang_timeout=period_seconds(settings.hang_timeout), on_hang=action)


def swap_unfit(
    entries: list[Any],
    spares: list[str],
    settings: Settings,
    out: Reporter,
    unfit: Any = None,
) -> tuple[list[Any], list[str]]:
    """--recover: a node whose GPU is unfit to train on (its health check fails) is not
    used; the first fit spare takes its place, and is no spare any more. Where no spare is
    fit, the node stays, and the run's preflight refuses it by name. `unfit(entry) -> why`
    (the tests' stand-in; else each host's health, read at once)."""
    from vmrun.ssh.inventory import select_hosts

    spared = select_hosts(list(spares), settings)
    if unfit is None:
        from vmrun.backends.hosts.preflight import unfit_gpu
        from vmrun.ssh.group import Group

        with Group([*entries, *spared], settings) as group:
            found = group.map(lambda entry, conn: unfit_gpu(conn, entry))
        said = {o.host: str(o.value or "") if o.ok else "" for o in found}
        unfit = lambda entry: said.get(entry.label, "")  # noqa: E731
    free = [s for s in spared if not unfit(s)]
    nodes = []
    for entry in entries:
        why = unfit(entry)
        if why and free:
            spare = free.pop(0)
            out.info(f"{entry.label}: {why}; --recover puts the spare {spare.label} in its place")
            spared = [e for e in spared if e.label != spare.label]
            entry = spare
        nodes.append(entry)
    return nodes, [e.label for e in spared]


def _nodes(entries: list[Any], labels: list[str], settings: Settings) -> list[Any]:
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


def check_nnodes(nnodes: str, hosts: int) -> None:
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
