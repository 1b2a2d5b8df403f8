"""Which flags `train` and `sweep` refuse together, as one table checked in one place.

A rule refuses the flags in `refuse` that were given, when the flag `when` was given (or
when `unless` was not); the first rule that matches raises a UsageError with its code and
one line. The operations check their values with `check` before anything else, so a library
caller is refused the same way the CLI is (flags are how the docs name each value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vmrun.errors import UsageError

SLURM_ONLY = (
    "--nodes",
    "--gpus-per-node",
    "--time",
    "--cpus-per-task",
    "--mem",
    "--constraint",
    "--qos",
    "--partition",
    "--account",
    "--sbatch-arg",
    "--max-requeues",
    "--dry-run",
)
HOSTS_ONLY = (
    "-H",
    "--local",
    "--master",
    "--nnodes",
    "--rdzv-port",
    "--allow-concurrent",
    "--fresh",
    "--resume",
    "--fetch-every",
    "--down-after-run",
    "--spare",
    "--supervisor",
    "--ignore-gpu-health",
)
RECOVERY = ("--spare", "--supervisor", "--max-recoveries")
WHAT_RUNS = (
    "SCRIPT",
    "--epochs",
    "--save-every",
    "--nproc-per-node",
    "--max-restarts",
    "--name",
    "--batch-size",
    "--lr",
    "--task",
    "--fsdp",
    "-- SCRIPT_ARGS",
    "--local",
    "--launcher",
)
_LOCAL_STAYS = (
    " for runs on hosts (-H): a --local run stays in this terminal until it ends (Ctrl-C stops"
    " it) and is never refused for another run; drop {them}"
)
_DOWN_NEEDS = (
    "--down-after-run powers the hosts off once the run's results are here: it needs"
    " --fetch-every SECONDS, and vmrun following the run (no --detach)"
)


@dataclass(frozen=True)
class Rule:
    refuse: tuple[str, ...]  # the flags refused (those of them given)...
    when: str | None = None  # ...when this flag is given
    unless: str | None = None  # ...or when this one is not
    code: str = ""  # every rule names its own (docs/errors.md)
    says: str = ""  # {flags}: the refused ones given; {are}/{them}: their number; {C}: -C's
    commands: tuple[str, ...] = ("train", "sweep")


RULES: tuple[Rule, ...] = (
    Rule(
        SLURM_ONLY,
        unless="-C",
        code="needs-cluster",
        commands=("train",),
        says="{flags}: Slurm options; name the cluster with -C NAME",
    ),
    Rule(
        SLURM_ONLY[1:],
        unless="-C",
        code="needs-cluster",
        commands=("sweep",),
        says="{flags}: Slurm options; name the cluster with -C NAME",
    ),  # --nodes: a grid's
    Rule(
        HOSTS_ONLY,
        when="-C",
        commands=("train",),
        code="flags-conflict",
        says="{flags} {are} for runs on hosts (-H); Slurm runs the job on -C {C}",
    ),
    Rule(
        ("-H", "--local"),
        when="-C",
        commands=("sweep",),
        code="flags-conflict",
        says="{flags} {are} for runs on hosts (-H); Slurm runs the job on -C {C}",
    ),
    Rule(
        ("--resume",),
        when="--fresh",
        code="flags-conflict",
        says="--fresh moves the hosts' old checkpoints aside; --resume continues from them:"
        " use one",
    ),
    Rule(
        ("--local",),
        when="--fresh",
        code="flags-conflict",
        says="--fresh moves old checkpoints aside on hosts (-H); drop it with --local",
    ),
    Rule(
        WHAT_RUNS,
        when="--resume",
        code="resume-conflict",
        commands=("train",),
        says="--resume repeats the run as it was recorded; drop {flags}",
    ),
    Rule(
        (*WHAT_RUNS, "--nodes", "--cpus-per-task", "--gpus-per-node", "-H", "-C"),
        when="--resume",
        code="resume-conflict",
        commands=("sweep",),
        says="--resume repeats the sweep as it was recorded; drop {flags}",
    ),
    Rule(
        ("--detach", "--local"),
        when="--fetch-every",
        code="flags-conflict",
        says="--fetch-every needs seconds > 0 and a run that vmrun follows (not --detach or"
        " --local; use `vmrun fetch --watch` for a detached run)",
    ),
    Rule(
        ("-H",),
        when="--local",
        commands=("train",),
        code="flags-conflict",
        says="--local trains on this machine; drop -H or --local",
    ),
    Rule(
        ("-H",),
        when="--local",
        commands=("sweep",),
        code="flags-conflict",
        says="--local sweeps on this machine; drop -H or --local",
    ),
    Rule(
        ("--detach", "--allow-concurrent", "--down-after-run", "--ignore-gpu-health"),
        when="--local",
        code="flags-conflict",
        says="{flags} {are}" + _LOCAL_STAYS,
    ),
    Rule(
        ("--data",),
        when="--local",
        code="flags-conflict",
        says="--data pushes to hosts (-H); a --local run reads the data where it is",
    ),
    Rule(
        ("--store",),
        when="--local",
        code="flags-conflict",
        says="--store copies a run on hosts (-H) to the bucket; a --local run's files are"
        " here already",
    ),
    Rule(
        ("--store",),
        when="-C",
        code="flags-conflict",
        says="--store copies a run on hosts (-H) to the bucket; a Slurm run's files stay on"
        " the cluster's shared filesystem (`vmrun fetch -C`)",
    ),
    Rule(
        ("--master", "--nnodes", "--rdzv-port"),
        when="--local",
        code="flags-conflict",
        says="{flags} {are} for several hosts (-H); drop {them} with --local",
    ),
    Rule(("--down-after-run",), unless="--fetch-every", code="flags-conflict", says=_DOWN_NEEDS),
    Rule(
        RECOVERY,
        unless="--recover",
        commands=("train", "submit"),
        code="flags-conflict",
        says="{flags} {are} --recover's: add --recover, or drop {them}",
    ),
    Rule(
        ("--recover",),
        when="--local",
        commands=("train",),
        code="flags-conflict",
        says="--recover brings back a run on hosts (-H); a --local run stays in this terminal",
    ),
    Rule(
        ("--recover",),
        when="--resume",
        commands=("train",),
        code="resume-conflict",
        says="--recover starts a run with its supervisor; a resumed run keeps its own",
    ),
    Rule(
        ("--fsdp",),
        when="SCRIPT",
        code="flags-conflict",
        commands=("train",),
        says="--fsdp is the template trainer's: your SCRIPT shards its model and writes its"
        " checkpoints itself (FSDP2 and torch.distributed.checkpoint, see docs/training.md)",
    ),
)


def recovery_limit(given: int | None, default: int) -> int:
    """--max-recoveries as given (0 is given, and refused), else the settings' default."""
    limit = default if given is None else given
    if limit < 1:
        raise UsageError(f"--max-recoveries must be >= 1, got {limit}", code="flags-conflict")
    return limit


def given(value: Any) -> bool:
    """A flag counts as given unless it is left at nothing (None, False, an empty list);
    0 is given."""
    return value is not None and value is not False and value != [] and value != ()


def check(command: str, flags: Mapping[str, Any]) -> None:
    """Raise the first rule of `command` that `flags` (flag -> value) break."""
    broken = first_broken(command, flags)
    if broken is not None:
        rule, refused = broken
        raise UsageError(_words(rule.says, refused, flags), code=rule.code)


def first_broken(command: str, flags: Mapping[str, Any]) -> tuple[Rule, list[str]] | None:
    """The first rule of `command` that `flags` break, and the flags it refuses."""
    for rule in RULES:
        if command not in rule.commands:
            continue
        if rule.when is not None and not given(flags.get(rule.when)):
            continue
        if rule.unless is not None and given(flags.get(rule.unless)):
            continue
        refused = [flag for flag in rule.refuse if given(flags.get(flag))]
        if refused:
            return rule, refused
    return None


def _words(says: str, refused: list[str], flags: Mapping[str, Any]) -> str:
    many = len(refused) > 1
    listed = " and ".join(refused) if len(refused) <= 2 else ", ".join(refused)
    return says.format(
        flags=listed, are="are" if many else "is", them="them" if many else "it", C=flags.get("-C")
    )
