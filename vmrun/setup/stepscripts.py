"""The shell text a step runs: its check (apt and pip steps get one of their own), its apply
(with the apt helpers before it), and what --dry-run shows of it. The helpers and the checks
are host-side files (vmrun/hostside/setup_*), given their values as arguments."""

from __future__ import annotations

import re
from collections.abc import Mapping

from vmrun import hostside
from vmrun.setup.playbook import Step
from vmrun.ssh import quoting


def shell_helpers() -> str:
    """vmrun_apt_wait, vmrun_apt_get, vmrun_apt_update, vmrun_apt_install (they read
    VMRUN_APT_* from the step's environment), vmrun_pip_install and vmrun_fetch (downloads
    whose progress setup shows): every apply script can call them (read from the host's
    copy of vmrun's host-side files)."""
    files = ("setup_apt.sh", "setup_download.sh")
    return "".join(f". {quoting.quote(hostside.path(name))}\n" for name in files)


def check_script(step: Step) -> str:
    """The step's check; apt and pip steps without one get a read-only check of their own."""
    assert not step.branches, "a step is resolved (Step.resolved) before its scripts are read"
    if step.apt:
        return quoting.join([*hostside.command("setup_apt_check.sh"), *step.apt])
    if step.pip and not step.check:
        # the env may have been made again since (another env manager or name, a forced
        # python-env): then the requirements are missing and the step must run again
        check = quoting.join([hostside.path("setup_pip_check.py"), *step.pip])
        return f'"$VMRUN_PYTHON" {check}'
    return step.check


def apply_script(step: Step) -> str:
    """The step's own script (the shell helpers are prepended when it runs)."""
    assert not step.branches, "a step is resolved (Step.resolved) before its scripts are read"
    if step.apt:
        return quoting.join(["vmrun_apt_install", *step.apt])
    if step.pip:
        reqs = " ".join(quoting.quote(p) for p in step.pip)
        return f'vmrun_pip_install "$VMRUN_PYTHON" $VMRUN_PIP_EXTRA_ARGS {reqs}'
    return step.apply


def dry_run_text(step: Step, env: Mapping[str, str]) -> str:
    """The apply (and verify) script, preceded by the values of the variables it uses and of
    the params that picked its branches (the step is resolved: only those branches show)."""
    script = apply_script(step)
    if step.verify:
        script += "\n# then verify:\n" + step.verify
    picked = {f"VMRUN_{name.upper()}" for name in step.picked}
    used = sorted(set(re.findall(r"\$\{?(VMRUN_[A-Z0-9_]+)", script)) | picked)
    values = [f"# {name}={env.get(name, '')}" for name in used]
    return "\n".join([*values, script.rstrip()])
