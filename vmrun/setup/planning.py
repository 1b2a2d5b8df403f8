"""Which steps run on a host: decided locally from its facts, the stored fingerprints and one
batch of checks, so a re-run with nothing to do costs a single round trip for the checks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vmrun.setup.facts import Facts
from vmrun.setup.playbook import Step, applies, fingerprint
from vmrun.setup.report import HostReport, SetupOptions, StepOutcome, StepStatus
from vmrun.setup.stepscripts import check_script, dry_run_text

Plan = list[tuple[Step, StepOutcome]]
RunChecks = Callable[[list[Step]], set[str]]  # steps -> names of those whose check passed


@dataclass
class PlanInputs:
    """What a plan is made from: the host's facts, the params, and the stored step state."""

    facts: Facts
    params: Mapping[str, str]
    state: Mapping[str, dict]
    stamps: Mapping[str, str]


def make_plan(opts: SetupOptions, inputs: PlanInputs, run_checks: RunChecks) -> Plan:
    """Every step with what will happen to it; checks run once, batched, for the undecided.
    Its steps are resolved: a script that branches on a param is the branch that runs."""
    steps = [step.resolved(inputs.params) for step in opts.playbook.steps]
    decided: Plan = [(step, _decide(opts, inputs, step)) for step in steps]
    to_check = [step for step, outcome in decided if outcome.status == StepStatus.CHECK]
    passed = run_checks(to_check) if to_check else set()
    plan: Plan = []
    for step, outcome in decided:
        if outcome.status == StepStatus.CHECK:
            stored = bool(inputs.state.get(step.name))
            if step.name in passed:
                outcome = StepOutcome(
                    step.name,
                    StepStatus.SKIPPED if stored else StepStatus.ADOPTED,
                    "check passes" if stored else "already present",
                )
            else:
                outcome = StepOutcome(
                    step.name, StepStatus.WOULD_RUN, "check failed" if stored else "not done yet"
                )
        plan.append((step, outcome))
    _mark_dependents(plan)
    return plan


def _decide(opts: SetupOptions, inputs: PlanInputs, step: Step) -> StepOutcome:
    """One step's fate before any check runs (status "check" when its check decides)."""
    if opts.only and step.name not in opts.only:
        return StepOutcome(step.name, StepStatus.UNSELECTED)
    params = inputs.params
    why_not = applies(
        step,
        gpu=inputs.facts.has_gpu,
        env=params.get("env", "venv"),
        os_release=inputs.facts.os_release,
        params=params,
        cluster=opts.cluster,
    )
    if why_not:
        return StepOutcome(step.name, StepStatus.NOT_APPLICABLE, why_not)
    if step.name in opts.force:
        return StepOutcome(step.name, StepStatus.WOULD_RUN, "forced")
    stored = inputs.state.get(step.name) or {}
    same = bool(stored) and stored.get("fingerprint") == fingerprint(step, params, inputs.stamps)
    if stored and not same:
        return StepOutcome(step.name, StepStatus.WOULD_RUN, "inputs changed")
    if check_script(step):
        return StepOutcome(step.name, StepStatus.CHECK)
    if same:
        return StepOutcome(step.name, StepStatus.SKIPPED, "done before")
    return StepOutcome(step.name, StepStatus.WOULD_RUN, "never ran")


def _mark_dependents(plan: Plan) -> None:
    """A step whose needs will run must run too (its fingerprint will change)."""
    running = set()
    for step, outcome in plan:
        if outcome.status == StepStatus.WOULD_RUN:
            running.add(step.name)
        elif outcome.status in (StepStatus.SKIPPED, StepStatus.ADOPTED) and running & set(
            step.needs
        ):
            outcome.status = StepStatus.WOULD_RUN
            outcome.detail = f"after {', '.join(sorted(running & set(step.needs)))}"
            running.add(step.name)


def dry_run_report(
    report: HostReport, plan: Plan, env: Mapping[str, str], upload_summary: str
) -> HostReport:
    """The plan with each script to run, and what needs root said plainly: a dry run never
    stops at sudo."""
    _add_scripts(plan, env)
    report.steps = [o for _, o in plan]
    if upload_summary:
        report.steps.insert(0, StepOutcome("upload", StepStatus.WOULD_RUN, upload_summary))
    root = {s.name for s, o in plan if o.status == StepStatus.WOULD_RUN and (s.sudo or s.apt)}
    if report.facts.sudo != "root":
        for outcome in report.steps:
            if outcome.name in root:
                outcome.detail += "; needs passwordless sudo"
    problem = report.facts.sudo_problem
    if root and problem:
        verb = "needs" if len(root) == 1 else "need"
        report.notes.append(
            f"{', '.join(sorted(root))} {verb} root and {problem}: a real run stops before"
            " changing anything; allow passwordless sudo for this user first"
        )
    return report


def _add_scripts(plan: Plan, env: Mapping[str, str]) -> None:
    """Each script to run; after a rebooting step (the driver), the values that come from
    nvidia-smi are said to be read again rather than shown stale."""
    shown = dict(env)
    for step, outcome in plan:
        if outcome.status != StepStatus.WOULD_RUN:
            continue
        outcome.script = dry_run_text(step, shown)
        if step.reboot:
            later = f"(read again from nvidia-smi after {step.name})"
            shown.update(
                VMRUN_CUDA_DRIVER=later,
                VMRUN_PIP_INDEX_ARGS=f"{later} the wheel index for the new driver",
            )
