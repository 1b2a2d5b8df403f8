"""Which flags `train` and `sweep` refuse together, as one table checked in one place.

A rule refuses the flags in `refuse` that were given, when the flag `when` was given (or
when `unless` was not); the first rule that matches raises a UsageError with its code and
one line. The operations check their values with `check` before anything else, so a library
caller is refused the same way the CLI is (flags are how the docs name each value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.backends.select import Target


@dataclass(frozen=True)
class Words:
    """How a refusal of what the target lacks is said, and its code."""

    code: str
    says: str


SLURM_ONLY = (  # the Slurm option group (vmrun.backends.slurm.options)
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
# Each flag that asks the target for something, and the capability it needs
# (vmrun.backends.api.Capabilities, declared by each backend): refused, in this order, where
# the target lacks it. A sweep's own record is its --resume, and --nodes is a grid's axis.
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (
        *((flag, "scheduler") for flag in SLURM_ONLY[:-1]),
        ("--max-requeues", "self_requeue"),
        ("--dry-run", "dry_run"),
        ("--master", "several_hosts"),
        ("--nnodes", "several_hosts"),
        ("--rdzv-port", "several_hosts"),
        ("--allow-concurrent", "concurrent_starts"),
        ("--fresh", "fresh"),
        ("--resume", "resume"),
        ("--fetch-every", "fetch_every"),
        ("--down-after-run", "power_off"),
        ("--spare", "spares"),
        ("--supervisor", "supervisor"),
        ("--ignore-gpu-health", "gpu_health"),
        ("--detach", "detach"),
        ("--recover", "recovery"),
        ("--data", "data"),
        ("--store", "store"),
    ),
    "sweep": (
        *((flag, "scheduler") for flag in SLURM_ONLY[1:-1]),
        ("--max-requeues", "self_requeue"),
        ("--dry-run", "dry_run"),
        ("--detach", "detach"),
    ),
    "submit": (),
}
# the flags that name another place than the target, refused beside it (-H beside --local
# is a rule of its own: its words are the command's)
NOT_WITH: dict[str, tuple[str, ...]] = {"cluster": ("-H", "--local")}
_LOCAL_STAYS = (
    " for runs on hosts (-H): a --local run stays in this terminal until it ends (Ctrl-C stops"
    " it) and is never refused for another run; drop {them}"
)
_DOWN_NEEDS = (
    "--down-after-run powers the hosts off once the run's results are here: it needs"
    " --fetch-every SECONDS, and vmrun following the run (no --detach)"
)
_FETCH_NEEDS = (
    "--fetch-every needs seconds > 0 and a run that vmrun follows (not --detach or"
    " --local; use `vmrun fetch --watch` for a detached run)"
)
_SLURM_OPTIONS = "{flags}: Slurm options; name the cluster with -C NAME"
_ON_CLUSTER = "{flags} {are} for runs on hosts (-H); Slurm runs the job on -C {C}"
_RECOVERS = (
    "{flags} {are} for runs on hosts (-H), which --recover brings back; a --local run stays"
    " in this terminal"
)
# how a refusal says what the target lacks: (its kind, the capability) -> (code, words);
# (kind, "") is the kind's wording for every other capability
SAYS: dict[tuple[str, str], Words] = {
    ("hosts", "scheduler"): Words(code="needs-cluster", says=_SLURM_OPTIONS),
    ("hosts", "self_requeue"): Words(code="needs-cluster", says=_SLURM_OPTIONS),
    ("local", "scheduler"): Words(code="needs-cluster", says=_SLURM_OPTIONS),
    ("local", "self_requeue"): Words(code="needs-cluster", says=_SLURM_OPTIONS),
    ("cluster", "store"): Words(
        code="flags-conflict",
        says="--store copies a run on hosts (-H) to the bucket; a Slurm run's files stay on"
        " the cluster's shared filesystem (`vmrun fetch -C`)",
    ),
    ("cluster", ""): Words(code="flags-conflict", says=_ON_CLUSTER),
    ("local", "several_hosts"): Words(
        code="flags-conflict",
        says="{flags} {are} for several hosts (-H); drop {them} with --local",
    ),
    ("local", "fresh"): Words(
        code="flags-conflict",
        says="--fresh moves old checkpoints aside on hosts (-H); drop it with --local",
    ),
    ("local", "fetch_every"): Words(code="flags-conflict", says=_FETCH_NEEDS),
    ("local", "data"): Words(
        code="flags-conflict",
        says="--data pushes to hosts (-H); a --local run reads the data where it is",
    ),
    ("local", "store"): Words(
        code="flags-conflict",
        says="--store copies a run on hosts (-H) to the bucket; a --local run's files are"
        " here already",
    ),
    ("local", "recovery"): Words(code="flags-conflict", says=_RECOVERS),
    ("local", "spares"): Words(code="flags-conflict", says=_RECOVERS),
    ("local", "supervisor"): Words(code="flags-conflict", says=_RECOVERS),
    ("local", ""): Words(code="flags-conflict", says="{flags} {are}" + _LOCAL_STAYS),
    ("hosts", ""): Words(code="flags-conflict", says="{flags}: not on hosts (-H)"),
}


@dataclass(frozen=True)
class Rule:
    refuse: tuple[str, ...]  # the flags refused (those of them given)...
    when: str | None = None  # ...when this flag is given
    unless: str | None = None  # ...or when this one is not
    code: str = ""  # every rule names its own (docs/errors.md)
    says: str = ""  # {flags}: the refused ones given; {are}/{them}: their number; {C}: -C's
    commands: tuple[str, ...] = ("train", "sweep")


@dataclass(frozen=True)
class Lacking:
    """The flags (NEEDS) whose capability the target lacks, refused at this point of the
    order; `caps`: only these capabilities (None: any), `kinds`: only on these targets."""

    caps: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None


# The order the refusals are checked in: what the target lacks (derived from its backend's
# capabilities) and the rules that are not about the target (data).
ORDER: tuple[Rule | Lacking, ...] = (
    Lacking(caps=("scheduler", "self_requeue", "dry_run")),
    Lacking(kinds=("cluster",)),
    Rule(
        ("--resume",),
        when="--fresh",
        code="flags-conflict",
        says="--fresh moves the hosts' old checkpoints aside; --resume continues from them:"
        " use one",
    ),
    Rule(
        WHAT_RUNS,
        when="--resume",
        code="resume-conflict",
        commands=("train",),
        says="--resume repeats the run as it was recorded; drop {flags}",
    ),
    Rule(
        ("--dry-run",),
        when="--resume",
        code="resume-conflict",
        commands=("train",),
        says="--dry-run shows a new run's start; a resumed run's plan is its record's, on"
        " its hosts: drop --dry-run",
    ),
    Rule(
        (*WHAT_RUNS, "--nodes", "--cpus-per-task", "--gpus-per-node", "-H", "-C"),
        when="--resume",
        code="resume-conflict",
        commands=("sweep",),
        says="--resume repeats the sweep as it was recorded; drop {flags}",
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
    Lacking(),
    Rule(("--detach",), when="--fetch-every", code="flags-conflict", says=_FETCH_NEEDS),
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
RULES: tuple[Rule, ...] = tuple(r for r in ORDER if isinstance(r, Rule))


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
    """Raise the first refusal of `command` that `flags` (flag -> value) break."""
    broken = first_broken(command, flags)
    if broken is not None:
        rule, refused = broken
        raise UsageError(_words(rule.says, refused, flags), code=rule.code)


def first_broken(command: str, flags: Mapping[str, Any]) -> tuple[Rule, list[str]] | None:
    """The first refusal of `command` that `flags` break (what the target lacks, as a Rule
    naming the capability), and the flags it refuses."""
    for rule in ORDER:
        if isinstance(rule, Lacking):
            lacked = _lacking(rule, command, flags)
            if lacked is not None:
                return lacked
            continue
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


def target_of(flags: Mapping[str, Any]) -> Target:
    """The target the flags name (--local, -H, -C)."""
    from vmrun.backends.select import Target

    return Target.of(
        local=given(flags.get("--local")),
        hosts=flags.get("-H") or None,
        cluster=flags.get("-C") or None,
    )


def _lacking(
    check: Lacking, command: str, flags: Mapping[str, Any]
) -> tuple[Rule, list[str]] | None:
    """What `check` refuses: the flags given whose capability the target lacks, those that
    share the first one's words (with -H and --local beside -C), as one Rule."""
    target = target_of(flags)
    if check.kinds is not None and target.kind not in check.kinds:
        return None
    caps = target.capabilities
    lacked = [
        (flag, cap)
        for flag, cap in NEEDS.get(command, ())
        if given(flags.get(flag)) and caps.lacks(cap) and (check.caps is None or cap in check.caps)
    ]
    others = NOT_WITH.get(target.kind, ()) if check.caps is None else ()
    beside = [f for f in others if given(flags.get(f))]
    if not lacked and not beside:
        return None
    says = _says(target.kind, lacked[0][1] if lacked else "")
    same = [(f, c) for f, c in lacked if _says(target.kind, c) == says]
    named = list(dict.fromkeys(c for _, c in same))
    words = says.says
    if named:
        which = f"{'capabilities' if len(named) > 1 else 'capability'}: {', '.join(named)}"
        words += f" ({which}, which {caps.what} lacks)"
    refuse = (*beside, *(f for f, _ in same))
    return Rule(refuse, code=says.code, says=words, commands=(command,)), list(refuse)


def _says(kind: str, cap: str) -> Words:
    return SAYS.get((kind, cap)) or SAYS[(kind, "")]


def _words(says: str, refused: list[str], flags: Mapping[str, Any]) -> str:
    many = len(refused) > 1
    listed = " and ".join(refused) if len(refused) <= 2 else ", ".join(refused)
    return says.format(
        flags=listed, are="are" if many else "is", them="them" if many else "it", C=flags.get("-C")
    )
