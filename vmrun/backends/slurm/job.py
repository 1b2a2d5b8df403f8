"""What a Slurm run asks for (`JobSpec`: nodes, GPUs, time, the launcher's task layout), checked
before anything is submitted, and the batch script that asks for it.

The script is a header (`#SBATCH` lines and the run's variables, every value quoted by
vmrun.ssh.quoting) over vmrun/hostside/slurm_job.bash, which holds all the logic; the
per-task launcher (vmrun/hostside/slurm_task.sh) travels inside it as a variable, so a job
waiting in the queue holds everything it will run: with an image, so do the runtime's words
(vmrun.containers.runtime.SlurmContainer) and, for docker or podman, the host-side runner
and pull scripts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from vmrun.containers.runtime import PULL_SCRIPT, SlurmContainer
from vmrun.errors import UsageError
from vmrun.hostside import source
from vmrun.runs.launch import flight_recorder_env
from vmrun.runs.launch_spec import Budget, Hang, LaunchSpec, Notify, Watchers
from vmrun.runs.plan import CPU_PROCESSES
from vmrun.ssh.quoting import quote

# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"(\d+)(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}")
_MEM = re.compile(r"[1-9]\d*[KMGT]?", re.IGNORECASE)
_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]")  # whitespace and control characters
SIGNAL_BEFORE_S = 90  # seconds of warning before the time limit (SIGUSR2: NCCL has USR1)
DEFAULT_MAX_REQUEUES = 3


@dataclass(frozen=True)
class JobSpec:
    """The sbatch side of a run: what it asks the scheduler for."""

    nodes: int = 1
    gpus_per_node: int = 0
    nproc_per_node: int | None = None  # torchrun workers, or env tasks, per node
    time: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    constraint: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()
    max_requeues: int = DEFAULT_MAX_REQUEUES
    signal_before: int = SIGNAL_BEFORE_S


def word_problem(value: object) -> str | None:
    """Why a value cannot be one word of an `#SBATCH` line (None: it can): sbatch splits
    the line at spaces, and a newline would end it and start a line of the script."""
    if not isinstance(value, str):
        return "must be a string"
    if not value:
        return "is empty"
    if _UNSAFE.search(value):
        return "holds a space, newline or control character"
    return None


def check_spec(spec: JobSpec, launcher: str) -> JobSpec:
    """Refuse what sbatch would refuse (or mis-run) before anything is sent, one line each."""
    for flag, value in (
        ("--partition", spec.partition),
        ("--account", spec.account),
        ("--qos", spec.qos),
        ("--time", spec.time),
        ("--mem", spec.mem),
        ("--constraint", spec.constraint),
    ):
        if value is not None and (problem := word_problem(value)):
            raise UsageError(f"{flag} {value!r}: {problem}")
    for flag, count, least in (
        ("--nodes", spec.nodes, 1),
        ("--gpus-per-node", spec.gpus_per_node, 0),
        ("--nproc-per-node", spec.nproc_per_node, 1),
        ("--cpus-per-task", spec.cpus_per_task, 1),
        ("--max-requeues", spec.max_requeues, 0),
    ):
        if count is not None and count < least:
            raise UsageError(f"{flag} must be >= {least}, got {count}")
    if spec.time is not None and not _TIME.fullmatch(spec.time.strip()):
        raise UsageError(
            f"--time {spec.time!r}: use Slurm's forms, MINUTES, HH:MM:SS or D-HH:MM:SS"
            " (e.g. 01:00:00)"
        )
    if spec.mem is not None and not _MEM.fullmatch(spec.mem.strip()):
        raise UsageError(f"--mem {spec.mem!r}: use a size such as 32000M or 32G")
    _check_launcher_fits(spec, launcher)
    for arg in spec.sbatch_args:
        if word_problem(arg) or not arg.startswith("-"):
            raise UsageError(
                f"--sbatch-arg {arg!r}: give one sbatch option, no spaces, e.g. --exclusive"
            )
    return spec


def _check_launcher_fits(spec: JobSpec, launcher: str) -> None:
    """`--launcher python` is one process on one node: it spawns its own workers."""
    if launcher == "python" and spec.nodes != 1:
        raise UsageError(
            "--launcher python starts one process on one node (it spawns its own workers);"
            f" use --nodes 1, not {spec.nodes}, or --launcher torchrun|env"
        )
    if launcher == "python" and spec.nproc_per_node is not None:
        raise UsageError("--nproc-per-node is for torchrun and env; python starts one process")


def tasks_per_node(spec: JobSpec, launcher: str) -> int:
    """Slurm tasks per node: torchrun is one per node (it starts the workers); env one per
    GPU (or --nproc-per-node); python one."""
    if launcher == "env":
        return spec.nproc_per_node or spec.gpus_per_node or 1
    return 1


def workers_per_node(spec: JobSpec, launcher: str) -> int | None:
    """Processes per node that join the process group (None: the script decides)."""
    if launcher == "torchrun":
        return spec.nproc_per_node or spec.gpus_per_node or CPU_PROCESSES
    if launcher == "env":
        return tasks_per_node(spec, launcher)
    return None


def gpu_option(gpus: int, version: str) -> str:
    """`--gpus-per-node` where Slurm has it (19.05+, cons_tres), else `--gres=gpu:N`."""
    match = re.search(r"(\d+)\.(\d+)", version)
    major_minor = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    return f"--gpus-per-node={gpus}" if major_minor >= (19, 5) else f"--gres=gpu:{gpus}"


@dataclass(frozen=True)
class JobPaths:
    """Absolute paths on the cluster's shared filesystem."""

    record: str  # the run's files: job.sh, run.json, job.log, exit, nodes
    code: str  # the synced project: the job's working directory
    out: str  # the run's outputs (VMRUN_RUN_DIR; the template's --out-dir)


@dataclass(frozen=True)
class Batch:
    """Everything the batch script says besides the options: what runs, and how."""

    run_id: str
    launcher: str
    python: str
    command: Sequence[str]
    max_restarts: int = 0
    modules: Sequence[str] = ()
    container: SlurmContainer | None = None  # the step inside an image
    pull: Sequence[str] = ()  # docker/podman: container_pull.sh's arguments, once per node
    container_home: str = ""  # docker/podman: the HOME inside (made before the step)
    notifier: bool = False  # the job tells its end and requeues (the record's notify.json)
    max_recoveries: int = 0  # --recover: failed attempts requeued by the job itself
    hang: str = ""  # --hang-timeout's `SECONDS ACTION RANKED` (the agent's), "" not watched
    budget: Budget | None = None  # --max-cost's: its seconds from the first attempt's start
    torch: str = ""  # the job's torch version where vmrun knows it (setup's record); "" not
    own_env: Sequence[str] = ()  # the names of the run's own variables (--env, the cluster's)


def sbatch_options(
    spec: JobSpec, launcher: str, paths: JobPaths, version: str, extra: Sequence[str] = ()
) -> list[str]:
    opts = [f"--nodes={spec.nodes}", f"--ntasks-per-node={tasks_per_node(spec, launcher)}"]
    for flag, value in (
        ("--partition", spec.partition),
        ("--account", spec.account),
        ("--qos", spec.qos),
        ("--time", spec.time),
        ("--cpus-per-task", spec.cpus_per_task),
        ("--mem", spec.mem),
        ("--constraint", spec.constraint),
    ):
        if value is not None:
            opts.append(f"{flag}={value}")
    if spec.gpus_per_node:
        opts.append(gpu_option(spec.gpus_per_node, version))
    opts += [
        f"--chdir={paths.code}",
        f"--output={paths.record}/job.log",
        "--open-mode=append",
        f"--signal=B:USR2@{spec.signal_before}",  # to the batch shell, which passes it on
        "--requeue",
        *extra,  # the runtime's (shifter's --image)
        *spec.sbatch_args,  # last: sbatch takes the last of repeated options
    ]
    return opts


def batch_script(
    spec: JobSpec, batch: Batch, paths: JobPaths, version: str, *, job_name: str
) -> str:
    """The whole batch script: the header, the run's variables, then slurm_job.bash."""
    box = batch.container or SlurmContainer()
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}"]
    options = sbatch_options(spec, batch.launcher, paths, version, box.directives)
    lines += [f"#SBATCH {opt}" for opt in options]
    variables = {
        "VMRUN_RUN_ID": batch.run_id,
        "VMRUN_RECORD_DIR": paths.record,
        "VMRUN_RUN_DIR": paths.out,
        "VMRUN_LAUNCHER": batch.launcher,
        "VMRUN_NPROC": str(workers_per_node(spec, batch.launcher) or 1),
        "VMRUN_MAX_RESTARTS": str(batch.max_restarts),
        "VMRUN_MAX_REQUEUES": str(spec.max_requeues),
        "VMRUN_PYTHON": batch.python,
    }
    lines += ["", f"# vmrun run {batch.run_id}"]
    lines += [f"{name}={quote(value)}" for name, value in variables.items()]
    lines.append(f"VMRUN_MODULES=({' '.join(quote(m) for m in batch.modules)})")
    lines.append(f"VMRUN_COMMAND=({' '.join(quote(w) for w in batch.command)})")
    lines.append(f"VMRUN_TASK={quote(_commands('slurm_task.sh'))}")
    lines.append(f"VMRUN_SRUN=({' '.join(quote(w) for w in box.srun)})")
    lines.append(f"VMRUN_PREFIX=({' '.join(quote(w) for w in box.prefix)})")
    lines.append(f"VMRUN_RUNNER={quote(_commands(box.runner)) if box.runner else ''}")
    lines.append(f"VMRUN_PULL=({' '.join(quote(w) for w in batch.pull)})")
    lines.append(f"VMRUN_PULL_SCRIPT={quote(_commands(PULL_SCRIPT)) if batch.pull else ''}")
    lines.append(f"VMRUN_CONTAINER_HOME={quote(batch.container_home)}")
    lines.append(f"VMRUN_MAX_RECOVERIES={batch.max_recoveries}")
    recorder = flight_recorder_env(f"{paths.record}/nccl/fr_rank_", batch.torch, batch.own_env)
    settings = " ".join(quote(f"{name}={value}") for name, value in recorder.items())
    lines.append(f"VMRUN_FLIGHT_RECORDER=({settings})")
    launch = launch_spec(batch, paths)
    lines.append(f"VMRUN_LAUNCH={quote(launch.to_json())}")
    agent = " ".join(f"{name} {quote(source(name))}" for name in agent_files(batch, launch))
    lines.append(f"VMRUN_AGENT=({agent})")
    recover = source("slurm_recover.bash") + "\n" if batch.max_recoveries else ""
    return "\n".join(lines) + "\n\n" + recover + source("slurm_job.bash")


def launch_spec(batch: Batch, paths: JobPaths) -> LaunchSpec:
    """What the job's agent (hostside/run_agent.py's Slurm modes) is handed: the watchers
    its step wants, with their settings (the budget's seconds run from the job's first
    attempt's start: the spec is written once, for every attempt). No secret: the webhooks
    are the record's notify.json, written as the job was submitted."""
    hang = None
    if batch.hang:
        seconds, action, ranked = batch.hang.split()
        hang = Hang(float(seconds), action, ranked == "1", batch.python)
    return LaunchSpec(
        rec=paths.record,
        workdir=paths.code,
        run_id=batch.run_id,
        argv=tuple(batch.command),
        out=paths.out,
        watchers=Watchers(
            hang=hang, budget=batch.budget, notify=Notify() if batch.notifier else None
        ),
    )


def agent_files(batch: Batch, spec: LaunchSpec) -> list[str]:
    """The host-side files the job's agent runs (the batch script writes them into
    REC/.watch): none where it has nothing to do."""
    wanted = []
    if spec.watchers.budget is not None:
        wanted.append("budget_watch.py")  # which reads hang_watch.py's and spot_watch.py's
    if spec.watchers.hang is not None or spec.watchers.budget is not None:
        wanted += ["hang_watch.py", "spot_watch.py", "stacks.py"]
    if batch.launcher == "torchrun":
        wanted.append("run_failure.py")
    if spec.watchers.notify is not None:
        wanted.append("notify_send.py")
    return ["run_agent.py", *wanted] if wanted else []


def _commands(name: str) -> str:
    """A host-side script's text without its comment lines (they are in the file; the job
    shows the commands)."""
    return "\n".join(
        line for line in source(name).splitlines() if not line.lstrip().startswith("#")
    )
