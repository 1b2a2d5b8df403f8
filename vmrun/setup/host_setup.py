"""Run a setup playbook on one host: plan from facts and fingerprints, apply, reboot, record.

A re-run costs three round trips (facts with the stored fingerprints, every check in one
batch, nothing else) because everything read-only is batched and every decision is local.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun import remote_paths
from vmrun.errors import (
    AuthError,
    CommandFailed,
    ConnectionLostError,
    HostKeyError,
    RemoteError,
    UnreachableError,
    UsageError,
    VmrunError,
)
from vmrun.setup import facts as facts_mod
from vmrun.setup.facts import Facts
from vmrun.setup.playbook import Playbook, Step, applies, fingerprint
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.ssh.result import CommandResult

EventCallback = Callable[[str, str], None]  # (host label, what it is doing now)

TORCH_INDEX = "https://download.pytorch.org/whl/"
REMOTE_WHEELHOUSE = remote_paths.WHEELHOUSE
REMOTE_INSTALLERS = remote_paths.INSTALLERS
STEP_TAIL_LINES = 8  # a failing step's last output lines, shown in its error

# Starts the reboot command detached (setsid: it must outlive this channel, whose process group
# is killed; its fds closed, so the channel ends at once) after a second, so this command has
# returned. Its exit status and output land in ~/.vmrun/setup/reboot.{rc,out}: a reboot command
# that fails (sudo refusing, no systemd) is reported at once, not after the reboot timeout.
REBOOT_RC = "$HOME/.vmrun/setup/reboot.rc"
REBOOT_OUT = "$HOME/.vmrun/setup/reboot.out"
_LAUNCH_REBOOT = f"""rc="{REBOOT_RC}" out="{REBOOT_OUT}"
mkdir -p "${{rc%/*}}" && rm -f "$rc" "$out"
setsid -f bash -c 'sleep 1; bash -c "$0" >"$1" 2>&1 </dev/null
  echo $? >"$2.tmp"; mv "$2.tmp" "$2"' "$1" "$out" "$rc" </dev/null >/dev/null 2>&1
"""
# While waiting for the host to go down: the reboot command's exit status (once it ended) and
# the last lines of its output.
_REBOOT_STATUS = f"""cat "{REBOOT_RC}" 2>/dev/null || exit 0
tail -n {STEP_TAIL_LINES} "{REBOOT_OUT}" 2>/dev/null
"""

# Which PyTorch CUDA wheel index suits a host, from the CUDA version its driver reports
# (nvidia-smi's "CUDA Version") and its oldest GPU's compute capability. Why, since this ages:
# * CUDA minor-version compatibility: a driver that runs CUDA 12.0 (R525+) runs every 12.x
#   runtime, and an 11.x driver (R450+) every 11.x one, so a 12.2 driver gets the newest 12.x
#   build, not the one at or below 12.2 (PyTorch's own maintainers run cu128 on 12.4 drivers).
# * The CUDA 12 builds PyTorch publishes now are cu126 and cu128 (cu129 was 2.8 only; cu118
#   ended with 2.7, cu121/cu124 earlier): cu128 is the newest every release since 2.7 carries.
# * cu128 and the CUDA 13 builds ship kernels for Turing (7.5) and newer only; cu126 is the last
#   with Maxwell, Pascal and Volta (5.0-7.0), so those GPUs get cu126 on any 12.x or 13.x driver.
# * A 13.x driver with a Turing or newer GPU needs no index: PyPI's default torch is CUDA 13.
_CUDA12_INDEX = "cu128"
_CUDA12_LEGACY_GPU_INDEX = "cu126"
_CUDA11_INDEX = "cu118"
_OLDEST_CURRENT_ARCH = (7, 5)

# Shell functions every apply script can call (see playbooks/default.yaml's header). The lock
# holder comes from /proc/locks, which lists every POSIX lock as PID MAJ:MIN:INODE and which
# any user can read: fuser and lsof cannot see root's processes without root.
SHELL_HELPERS = r"""
vmrun_apt_holders() {
  local f dev ino key pid cmd
  local files="/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock"
  for f in ${VMRUN_APT_LOCK_FILES:-$files /var/cache/apt/archives/lock}; do
    read -r dev ino < <(stat -c '%d %i' "$f" 2>/dev/null) || continue
    key=$(printf '%02x:%02x:%s' $(((dev >> 8) & 0xfff)) \
      $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")
    awk -v k="$key" '$2 != "->" && $6 == k { print $5 }' /proc/locks
  done | sort -u | while read -r pid; do
    if [ "$pid" -gt 0 ] 2>/dev/null; then
      cmd=$(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline | cut -c1-60 | sed 's/ *$//')
      printf 'pid %s (%s)\n' "$pid" "$cmd"
    else
      echo "a process vmrun cannot name (an open file description lock)"
    fi
  done
  return 0
}
vmrun_apt_wait() {
  local limit=${VMRUN_APT_LOCK_WAIT:-300} start=$SECONDS holders said=""
  while holders=$(vmrun_apt_holders); [ -n "$holders" ]; do
    holders=${holders//$'\n'/; }
    if [ $((SECONDS - start)) -ge "$limit" ]; then
      echo "the apt/dpkg lock is still held after ${limit} s, by $holders" >&2
      echo "on a fresh cloud VM that is usually unattended-upgrades: let it finish" \
        "(or stop it) and re-run; --param apt_lock_wait=SECONDS waits longer" >&2
      return 1
    fi
    if [ "$holders" != "$said" ]; then
      echo "waiting up to ${limit} s for the apt/dpkg lock, held by $holders" >&2
      said=$holders
    fi
    sleep 1
  done
}
vmrun_apt_get() {
  vmrun_apt_wait
  $VMRUN_SUDO apt-get -o DPkg::Lock::Timeout="${VMRUN_APT_LOCK_WAIT:-300}" "$@"
}
vmrun_apt_update() {
  local mark="$HOME/.vmrun/setup/apt-updated"
  if [ "$(cat "$mark" 2>/dev/null)" = "$VMRUN_SETUP_RUN" ]; then return 0; fi
  vmrun_apt_get update
  mkdir -p "${mark%/*}" && printf '%s' "$VMRUN_SETUP_RUN" >"$mark"
}
vmrun_apt_install() {
  vmrun_apt_update
  vmrun_apt_get install -y "$@"
}
"""

# The check of a `pip:` step: every requirement is installed in the env and satisfies its
# version spec. Anything that is not a plain requirement (a file, a URL, an option) fails the
# check, so pip decides.
PIP_CHECK = """import importlib.metadata as md, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
for text in sys.argv[1:]:
    try:
        req = Requirement(text)
    except Exception:
        sys.exit(1)
    if req.url:
        sys.exit(1)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(have, prereleases=True):
        sys.exit(1)
"""


@dataclass
class SetupOptions:
    playbook: Playbook
    params: dict[str, str]
    force: frozenset[str] = frozenset()
    only: frozenset[str] = frozenset()
    dry_run: bool = False
    wheelhouse: Path | None = None
    installer: Path | None = None
    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    reboot_timeout: float = 600.0
    log_dir: Path | None = None


@dataclass
class StepOutcome:
    name: str
    status: str  # ran | skipped | adopted | n/a | unselected | would-run
    detail: str = ""
    duration: float = 0.0
    script: str = ""  # for --dry-run: exactly what would run


@dataclass
class HostReport:
    host: str
    facts: Facts
    steps: list[StepOutcome] = field(default_factory=list)
    record: dict[str, str] = field(default_factory=dict)
    rebooted: bool = False
    python: str = ""
    notes: list[str] = field(default_factory=list)  # for --dry-run: what a real run would hit

    @property
    def ran(self) -> list[str]:
        return [s.name for s in self.steps if s.status == "ran"]


def _version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = (int(p) for p in text.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def cuda_index(cuda_driver: str, compute_cap: str = "") -> str | None:
    """The torch wheel index for a driver's CUDA version and the oldest GPU (see the table's
    notes above); None means PyPI's default (the CUDA 13 build) or an unknown driver."""
    have = _version(cuda_driver)
    if have is None:
        return None
    cap = _version(compute_cap)
    if have >= (12, 0) and cap is not None and cap < _OLDEST_CURRENT_ARCH:
        return TORCH_INDEX + _CUDA12_LEGACY_GPU_INDEX
    if have >= (13, 0):
        return None
    if have >= (12, 0):
        return TORCH_INDEX + _CUDA12_INDEX
    if have >= (11, 0):
        return TORCH_INDEX + _CUDA11_INDEX
    raise RemoteError(
        f"the NVIDIA driver supports CUDA {cuda_driver} only; torch wheels need 11.0 or newer",
        hint="install a newer driver branch",
    )


def python_path(params: Mapping[str, str], facts: Facts) -> str:
    env = params.get("env", "venv")
    name = params.get("env_name", "vmrun") or "vmrun"
    if env == "python":
        if not params.get("python"):
            raise UsageError("env=python needs --python PATH (the interpreter to use)")
        return facts.absolute(params["python"])
    if env == "conda":
        return facts.absolute(f"miniconda3/envs/{name}/bin/python")
    return facts.absolute(f"{remote_paths.ENVS_DIR}/{name}/bin/python")


class HostSetup:
    """One host's setup; `run()` returns a HostReport or raises a VmrunError."""

    def __init__(
        self, conn: Connection, options: SetupOptions, on_event: EventCallback | None = None
    ):
        self.conn = conn
        self.opts = options
        self.on_event = on_event or (lambda host, text: None)
        self.log_path = self._log_path()
        self.run_token = f"{time.time_ns()}"  # `apt-get update` once per run (SHELL_HELPERS)
        self._recent_output = ""  # the last lines of the latest script, both streams in order

    # -- bookkeeping ------------------------------------------------------------------

    def _log_path(self) -> Path | None:
        if self.opts.log_dir is None:
            return None
        self.opts.log_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.@-]+", "_", self.conn.label)
        return self.opts.log_dir / f"setup-{safe}.log"

    def _log(self, text: str) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(text if text.endswith("\n") else text + "\n")

    def _event(self, text: str) -> None:
        self._log(f"== {time.strftime('%H:%M:%S')} {text}")
        self.on_event(self.conn.label, text)

    # -- the whole run ----------------------------------------------------------------

    def run(self) -> HostReport:
        self._log(f"\n===== vmrun setup {time.strftime('%Y-%m-%d %H:%M:%S')} on {self.conn.label}")
        self._event("reading host facts")
        facts = facts_mod.gather(self.conn)
        report = HostReport(self.conn.label, facts)
        params = dict(self.opts.params)
        report.python = python_path(params, facts)
        env = self._environment(params, facts, report.python)
        state = facts.state.get("steps", {}) if isinstance(facts.state.get("steps"), dict) else {}
        stamps = {
            name: rec.get("stamp", "") for name, rec in state.items() if isinstance(rec, dict)
        }
        plan = self._plan(facts, params, state, stamps, env)
        runs = [s for s, outcome in plan if outcome.status == "would-run"]
        if self.opts.dry_run:
            return self._dry_run_report(report, plan, runs)
        self._preflight_sudo(facts, runs)
        self._upload(env)
        for step, outcome in plan:
            if outcome.status == "would-run":
                outcome, records = self._execute(step, env, report)
                if step.reboot:
                    env = self._refresh_facts(step, params, report)
            elif outcome.status != "adopted":
                report.steps.append(outcome)
                continue
            else:
                records = {}
            stamps[step.name] = str(time.time_ns())
            state[step.name] = {
                "fingerprint": fingerprint(step, params, stamps),
                "stamp": stamps[step.name],
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "record": records,
            }
            self._save_state(state, report)
            report.steps.append(outcome)
        report.record = _merged_records(self.opts.playbook, state)
        self._event("done")
        return report

    def _refresh_facts(
        self, after: Step, params: Mapping[str, str], report: HostReport
    ) -> dict[str, str]:
        """Facts again after a step that may reboot (the driver): the torch wheel must follow
        the driver now installed, not the one (or none) seen before it."""
        self._event(f"reading host facts again after {after.name}")
        report.facts = facts_mod.gather(self.conn)
        env = self._environment(params, report.facts, report.python)
        self._log(
            f"CUDA {report.facts.cuda_driver or 'none'} (compute capability"
            f" {report.facts.compute_cap or 'unknown'}): torch index args"
            f" {env['VMRUN_PIP_INDEX_ARGS'] or '(PyPI default)'}"
        )
        return env

    def _dry_run_report(
        self, report: HostReport, plan: list[tuple[Step, StepOutcome]], runs: list[Step]
    ) -> HostReport:
        """The plan, with what needs root said plainly: a dry run never stops at sudo."""
        report.steps = [o for _, o in plan]
        if self.opts.wheelhouse or self.opts.installer:
            report.steps.insert(0, StepOutcome("upload", "would-run", self._upload_summary()))
        root = {s.name for s in runs if s.sudo or s.apt}
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

    # -- planning ---------------------------------------------------------------------

    def _plan(
        self,
        facts: Facts,
        params: dict[str, str],
        state: Mapping[str, dict],
        stamps: Mapping[str, str],
        env: Mapping[str, str],
    ) -> list[tuple[Step, StepOutcome]]:
        book = self.opts.playbook
        decided: list[tuple[Step, StepOutcome]] = []
        to_check: list[Step] = []
        for step in book.steps:
            if self.opts.only and step.name not in self.opts.only:
                decided.append((step, StepOutcome(step.name, "unselected")))
                continue
            why_not = applies(
                step,
                gpu=facts.has_gpu,
                env=params.get("env", "venv"),
                os_release=facts.os_release,
                params=params,
            )
            if why_not:
                decided.append((step, StepOutcome(step.name, "n/a", why_not)))
                continue
            stored = state.get(step.name) or {}
            if step.name in self.opts.force:
                decided.append((step, StepOutcome(step.name, "would-run", "forced")))
                continue
            same = bool(stored) and stored.get("fingerprint") == fingerprint(step, params, stamps)
            if stored and not same:
                decided.append((step, StepOutcome(step.name, "would-run", "inputs changed")))
                continue
            if self._check_script(step):
                to_check.append(step)
                decided.append((step, StepOutcome(step.name, "check", "")))
            elif same:
                decided.append((step, StepOutcome(step.name, "skipped", "done before")))
            else:
                decided.append((step, StepOutcome(step.name, "would-run", "never ran")))
        passed = self._run_checks(to_check, env) if to_check else set()
        plan = []
        for step, outcome in decided:
            if outcome.status == "check":
                stored = state.get(step.name) or {}
                if step.name in passed:
                    outcome = StepOutcome(
                        step.name,
                        "skipped" if stored else "adopted",
                        "check passes" if stored else "already present",
                    )
                else:
                    outcome = StepOutcome(
                        step.name, "would-run", "check failed" if stored else "not done yet"
                    )
            plan.append((step, outcome))
        self._mark_dependents(plan)
        self._add_scripts(plan, env)
        return plan

    def _add_scripts(self, plan: list[tuple[Step, StepOutcome]], env: Mapping[str, str]) -> None:
        """For --dry-run: each script to run; after a rebooting step (the driver), the values
        that come from nvidia-smi are said to be read again rather than shown stale."""
        shown = dict(env)
        for step, outcome in plan:
            if outcome.status != "would-run":
                continue
            outcome.script = self._dry_run_text(step, shown)
            if step.reboot:
                later = f"(read again from nvidia-smi after {step.name})"
                shown.update(
                    VMRUN_CUDA_DRIVER=later,
                    VMRUN_PIP_INDEX_ARGS=f"{later} the wheel index for the new driver",
                )

    def _mark_dependents(self, plan: list[tuple[Step, StepOutcome]]) -> None:
        """A step whose needs will run must run too (its fingerprint will change)."""
        running = set()
        for step, outcome in plan:
            if outcome.status == "would-run":
                running.add(step.name)
            elif outcome.status in ("skipped", "adopted") and running & set(step.needs):
                outcome.status = "would-run"
                outcome.detail = f"after {', '.join(sorted(running & set(step.needs)))}"
                running.add(step.name)

    def _check_script(self, step: Step) -> str:
        if step.apt:
            names = " ".join(quoting.quote(p) for p in step.apt)
            return (
                f"for p in {names}; do dpkg-query -W -f='${{db:Status-Abbrev}}' \"$p\""
                " 2>/dev/null | grep -q '^ii' || exit 1; done"
            )
        if step.pip and not step.check:
            # the env may have been made again since (another env manager or name, a forced
            # python-env): then the requirements are missing and the step must run again
            reqs = " ".join(quoting.quote(p) for p in step.pip)
            return f"\"$VMRUN_PYTHON\" - {reqs} <<'EOF'\n{PIP_CHECK}EOF"
        return step.check

    def _run_checks(self, steps: list[Step], env: Mapping[str, str]) -> set[str]:
        """Every check in one round trip; each runs in its own bash, read-only by contract."""
        self._event(f"checking {len(steps)} step(s)")
        parts = []
        for step in steps:
            parts.append(
                f"if bash -eu -c {quoting.quote(self._check_script(step))} "
                f">/dev/null 2>&1 </dev/null; then echo 'PASS {step.name}'; fi"
            )
        result = self.conn.run(["bash", "-c", "\n".join(parts)], env=env)
        return {line[5:] for line in result.stdout_tail.splitlines() if line.startswith("PASS ")}

    def _preflight_sudo(self, facts: Facts, runs: list[Step]) -> None:
        """Before anything changes: a step that needs root on a host where sudo cannot run."""
        needing = [s.name for s in runs if s.sudo or s.apt]
        if needing and facts.sudo_problem:
            raise RemoteError(
                f"steps {', '.join(needing)} need root, and {facts.sudo_problem};"
                " nothing was changed",
                host=self.conn.label,
                hint="allow passwordless sudo for this user, or do those steps by hand"
                " (see --dry-run) and re-run",
            )

    # -- environment for scripts --------------------------------------------------------

    def _environment(self, params: Mapping[str, str], facts: Facts, python: str) -> dict[str, str]:
        env = {f"VMRUN_{k.upper()}": v for k, v in params.items()}
        wheelhouse = facts.absolute(REMOTE_WHEELHOUSE) if self.opts.wheelhouse else ""
        installer = (
            facts.absolute(f"{REMOTE_INSTALLERS}/{self.opts.installer.name}")
            if self.opts.installer
            else ""
        )
        env.update(
            {
                "VMRUN_PYTHON": python,
                "VMRUN_GPU": "1" if facts.has_gpu else "0",
                "VMRUN_OS_RELEASE": facts.os_release,
                "VMRUN_CUDA_DRIVER": facts.cuda_driver,
                "VMRUN_WHEELHOUSE": wheelhouse,
                "VMRUN_INSTALLER": installer,
                "VMRUN_SUDO": facts.sudo_prefix,
                "VMRUN_SETUP_RUN": self.run_token,
                "VMRUN_PIP_INDEX_ARGS": " ".join(
                    self._pip_index_args(params, facts, wheelhouse, torch=True)
                ),
                "VMRUN_PIP_EXTRA_ARGS": " ".join(
                    self._pip_index_args(params, facts, wheelhouse, torch=False)
                ),
                "DEBIAN_FRONTEND": "noninteractive",
                "PIP_NO_INPUT": "1",
            }
        )
        return env

    def _pip_index_args(
        self, params: Mapping[str, str], facts: Facts, wheelhouse: str, *, torch: bool
    ) -> list[str]:
        args: list[str] = []
        if wheelhouse:
            args += ["--no-index", "--find-links", wheelhouse]
        for link in self.opts.find_links:
            args += ["--find-links", link]
        if self.opts.index_url:
            args += ["--index-url", self.opts.index_url]
        if wheelhouse or self.opts.index_url or not torch:
            return args
        choice = params.get("torch_index", "auto")
        if choice == "none":
            return args
        if choice != "auto":
            return [*args, "--index-url", choice]
        if not facts.has_gpu:
            return [*args, "--index-url", TORCH_INDEX + "cpu"]  # never the multi-GB CUDA build
        index = cuda_index(facts.cuda_driver, facts.compute_cap) if facts.cuda_driver else None
        return [*args, "--index-url", index] if index else args

    # -- doing ------------------------------------------------------------------------

    def _apply_script(self, step: Step, env: Mapping[str, str]) -> str:
        """The step's own script (SHELL_HELPERS are prepended when it runs)."""
        if step.apt:
            pkgs = " ".join(quoting.quote(p) for p in step.apt)
            return f"vmrun_apt_install {pkgs}"
        if step.pip:
            reqs = " ".join(quoting.quote(p) for p in step.pip)
            return f'"$VMRUN_PYTHON" -m pip install $VMRUN_PIP_EXTRA_ARGS {reqs}'
        return step.apply

    def _dry_run_text(self, step: Step, env: Mapping[str, str]) -> str:
        """The apply (and verify) script, preceded by the values of the variables it uses."""
        script = self._apply_script(step, env)
        if step.verify:
            script += "\n# then verify:\n" + step.verify
        used = sorted(set(re.findall(r"\$\{?(VMRUN_[A-Z0-9_]+)", script)))
        values = [f"# {name}={env.get(name, '')}" for name in used]
        return "\n".join([*values, script.rstrip()])

    def _bash(self, script: str, env: Mapping[str, str], what: str) -> CommandResult:
        """Run a step script, logging each line; its last lines of stdout and stderr, in the
        order they came, are kept for the error if it fails (its own output, not just stderr:
        a tool that says why on stdout is shown too)."""
        recent: deque[str] = deque(maxlen=STEP_TAIL_LINES)

        def log_line(stream: str, data: bytes) -> None:
            line = data.decode("utf-8", "replace").rstrip("\n")
            self._log(line)
            if line.strip():
                recent.append(line)

        self._log(f"$ {what}")
        result = self.conn.run(
            ["bash", "-eu", "-o", "pipefail", "-c", script], env=env, on_output=log_line
        )
        self._recent_output = "\n".join(recent)
        return result

    def _execute(
        self, step: Step, env: Mapping[str, str], report: HostReport
    ) -> tuple[StepOutcome, dict[str, str]]:
        started = time.monotonic()
        if step.reboot and step.verify:
            # already installed but waiting for a reboot (e.g. a driver/library mismatch)?
            first = self._bash(step.verify, env, f"{step.name}: verify before applying")
            if first.exit_status == 100:
                self._reboot(env, report)
                again = self._bash(step.verify, env, f"{step.name}: verify after reboot")
                if again.ok:
                    records = dict(_records(again.stdout_tail)) if step.record else {}
                    return StepOutcome(
                        step.name, "ran", "rebooted", time.monotonic() - started
                    ), records
        self._event(f"{step.name}: applying")
        script = SHELL_HELPERS + self._apply_script(step, env)
        applied = self._bash(script, env, f"{step.name}: apply")
        if not applied.ok:
            raise self._step_failed(step, "apply", applied)
        records = dict(_records(applied.stdout_tail)) if step.record else {}
        if step.verify:
            verified = self._bash(step.verify, env, f"{step.name}: verify")
            if verified.exit_status == 100 and step.reboot:
                self._reboot(env, report)
                verified = self._bash(step.verify, env, f"{step.name}: verify after reboot")
            if verified.exit_status == 100:
                raise RemoteError(
                    f"step {step.name} needs a reboot to take effect",
                    host=self.conn.label,
                    hint="reboot the host and re-run setup",
                )
            if not verified.ok:
                raise self._step_failed(step, "verify", verified)
            if step.record:
                records.update(_records(verified.stdout_tail))
        return StepOutcome(step.name, "ran", "", time.monotonic() - started), records

    def _step_failed(self, step: Step, phase: str, result: CommandResult) -> CommandFailed:
        """The error names the last line of stderr (where tools say why); its tail holds the
        script's last lines of both streams, as `_bash` kept them."""
        said = result.output_tail(STEP_TAIL_LINES)
        where = f" (full log: {self.log_path})" if self.log_path else ""
        last = said.splitlines()[-1] if said else "no output"
        return CommandFailed(
            f"step {step.name} failed ({phase} exited {result.exit_status}): {last}{where}",
            host=self.conn.label,
            exit_status=1,
            output_tail=self._recent_output or said,
        )

    def _save_state(self, state: Mapping[str, dict], report: HostReport) -> None:
        """State and the host record in one atomic write each (temp file + mv)."""
        host_record = {
            "python": report.python,
            "env": self.opts.params.get("env", ""),
            "env_name": self.opts.params.get("env_name", ""),
            **_merged_records(self.opts.playbook, state),
        }
        script = (
            'mkdir -p "$(dirname "$1")" && printf "%s" "$2" > "$1.tmp" && mv "$1.tmp" "$1"'
            ' && printf "%s" "$4" > "$3.tmp" && mv "$3.tmp" "$3"'
        )
        payload = json.dumps({"version": 1, "steps": state}, indent=1, sort_keys=True)
        self.conn.run(
            [
                "sh",
                "-c",
                script,
                "save",
                remote_paths.SETUP_STATE,
                payload,
                remote_paths.HOST_RECORD,
                json.dumps(host_record, sort_keys=True),
            ],
            check=True,
        )

    # -- uploads ----------------------------------------------------------------------

    def _upload_summary(self) -> str:
        parts = []
        if self.opts.wheelhouse:
            parts.append(f"wheelhouse {self.opts.wheelhouse} -> ~/{REMOTE_WHEELHOUSE}")
        if self.opts.installer:
            parts.append(f"installer {self.opts.installer} -> ~/{REMOTE_INSTALLERS}/")
        return "; ".join(parts)

    def _upload(self, env: Mapping[str, str]) -> None:
        """Wheelhouse and installer: incremental, verified, renamed into place."""
        from vmrun.transfer.upload import upload

        if self.opts.wheelhouse:
            self._event("uploading the wheelhouse")
            self._check_upload(upload(self.conn, self.opts.wheelhouse, REMOTE_WHEELHOUSE))
        if self.opts.installer:
            self._event("uploading the installer")
            remote = f"{REMOTE_INSTALLERS}/{self.opts.installer.name}"
            self._check_upload(upload(self.conn, self.opts.installer, remote))

    def _check_upload(self, report: Any) -> None:
        if not report.ok:
            path, why = next(iter(report.failed.items()), ("?", "not placed"))
            raise RemoteError(f"upload of {path} failed: {why}", host=self.conn.label)

    # -- reboot -----------------------------------------------------------------------

    def _reboot(self, env: Mapping[str, str], report: HostReport) -> None:
        """Reboot, wait for the connection to drop, then for SSH to come back (bounded)."""
        self._event("rebooting")
        command = env.get("VMRUN_REBOOT_COMMAND") or "$VMRUN_SUDO reboot"
        self._log(f"$ reboot: {command}")
        self.conn.run(["bash", "-c", _LAUNCH_REBOOT, "reboot", command], env=env, check=True)
        deadline = time.monotonic() + self.opts.reboot_timeout
        while time.monotonic() < deadline:  # wait for the host to go down
            try:
                status = self.conn.run(["bash", "-c", _REBOOT_STATUS], timeout=5)
            except (ConnectionLostError, CommandFailed, UnreachableError):
                break
            self._raise_if_reboot_failed(status.stdout_tail, command)
            time.sleep(0.5)
        else:
            raise RemoteError(
                f"the host did not go down within {self.opts.reboot_timeout:g} s"
                " after the reboot command",
                host=self.conn.label,
            )
        self.conn.close()
        waited_from = time.monotonic()
        delay = 1.0
        while True:
            try:
                self.conn.open()
                break
            except (HostKeyError, AuthError):
                raise
            except VmrunError:
                if time.monotonic() + delay > deadline:
                    raise UnreachableError(
                        f"the host did not come back within {self.opts.reboot_timeout:g} s after"
                        " rebooting",
                        host=self.conn.label,
                        hint="check its console; re-run setup once it is up",
                    ) from None
                self._event(
                    f"waiting for the host to come back ({time.monotonic() - waited_from:.0f} s)"
                )
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        report.rebooted = True
        self._event(f"back after {time.monotonic() - waited_from:.0f} s")

    def _raise_if_reboot_failed(self, status: str, command: str) -> None:
        """The reboot command ended with an error while the host is still up: say so now,
        with its output. A status of 128 or more (killed by a signal) is what the shutdown
        itself may do to it, so that one keeps waiting for the host to go down."""
        first, _, output = status.partition("\n")
        try:
            code = int(first.strip())
        except ValueError:
            return  # still running (no status yet)
        if not 0 < code < 128:
            return
        output = output.strip()
        self._log(f"the reboot command exited {code}:\n{output or '(no output)'}")
        last = output.splitlines()[-1] if output else "no output"
        raise CommandFailed(
            f"the reboot command failed (exited {code}) and the host is still up: {last}",
            host=self.conn.label,
            hint="let this user reboot with passwordless sudo, or set --param"
            f" reboot_command=... (was: {command})",
            exit_status=1,
            output_tail=output,
        )


def _merged_records(book: Playbook, state: Mapping[str, dict]) -> dict[str, str]:
    """What the steps recorded (python, torch, cuda...), later steps winning."""
    merged: dict[str, str] = {}
    for step in book.steps:
        rec = (state.get(step.name) or {}).get("record")
        if isinstance(rec, dict):
            merged.update({str(k): str(v) for k, v in rec.items()})
    return merged


def _records(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z][a-z0-9_]*", key):
            pairs.append((key, value.strip()))
    return pairs
