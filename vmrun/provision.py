"""Run a setup playbook on one host: plan from facts and fingerprints, apply, reboot, record.

A re-run costs three round trips (facts with the stored fingerprints, every check in one
batch, nothing else) because everything read-only is batched and every decision is local.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun import facts as facts_mod
from vmrun import quoting
from vmrun.connection import Connection
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
from vmrun.facts import Facts
from vmrun.playbook import Playbook, Step, applies, fingerprint
from vmrun.result import CommandResult

EventCallback = Callable[[str, str], None]  # (host label, what it is doing now)

# Highest CUDA wheel index at or below the driver's CUDA; PyPI's default torch is a CUDA 13
# build, so a driver that runs CUDA >= 13 needs no special index.
_CUDA_INDEXES = [
    ("11.8", "cu118"),
    ("12.1", "cu121"),
    ("12.4", "cu124"),
    ("12.6", "cu126"),
    ("12.8", "cu128"),
    ("12.9", "cu129"),
]
TORCH_INDEX = "https://download.pytorch.org/whl/"
REMOTE_WHEELHOUSE = f"{facts_mod.STATE_DIR}/wheelhouse"
REMOTE_INSTALLERS = f"{facts_mod.STATE_DIR}/installers"


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

    @property
    def ran(self) -> list[str]:
        return [s.name for s in self.steps if s.status == "ran"]


def cuda_index(cuda_driver: str) -> str | None:
    """The torch wheel index for a driver's CUDA version; None = PyPI's default (CUDA 13)."""
    try:
        have = tuple(int(p) for p in cuda_driver.split(".")[:2])
    except ValueError:
        return None
    if have >= (13, 0):
        return None
    best = None
    for version, tag in _CUDA_INDEXES:
        if have >= tuple(int(p) for p in version.split(".")):
            best = tag
    if best is None:
        raise RemoteError(
            f"the NVIDIA driver supports CUDA {cuda_driver} only; current torch"
            " wheels need 11.8 or newer",
            hint="install a newer driver branch",
        )
    return TORCH_INDEX + best


def python_path(params: Mapping[str, str], facts: Facts) -> str:
    env = params.get("env", "venv")
    name = params.get("env_name", "vmrun") or "vmrun"
    if env == "python":
        if not params.get("python"):
            raise UsageError("env=python needs --python PATH (the interpreter to use)")
        return facts.absolute(params["python"])
    if env == "conda":
        return facts.absolute(f"miniconda3/envs/{name}/bin/python")
    return facts.absolute(f"{facts_mod.STATE_DIR}/envs/{name}/bin/python")


class HostSetup:
    """One host's setup; `run()` returns a HostReport or raises a VmrunError."""

    def __init__(
        self, conn: Connection, options: SetupOptions, on_event: EventCallback | None = None
    ):
        self.conn = conn
        self.opts = options
        self.on_event = on_event or (lambda host, text: None)
        self.log_path = self._log_path()
        self._apt_updated = False

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
        self._preflight_sudo(facts, runs)
        if self.opts.dry_run:
            report.steps = [o for _, o in plan]
            if self.opts.wheelhouse or self.opts.installer:
                report.steps.insert(0, StepOutcome("upload", "would-run", self._upload_summary()))
            return report
        self._upload(env)
        for step, outcome in plan:
            if outcome.status == "would-run":
                outcome, records = self._execute(step, env, report)
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
                stored = state.get(step.name)
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
            if outcome.status == "would-run":
                outcome.script = self._dry_run_text(step, env)
            plan.append((step, outcome))
        self._mark_dependents(plan)
        return plan

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
        needing = [s.name for s in runs if s.sudo or s.apt]
        if needing and not facts.can_sudo:
            why = "sudo needs a password" if facts.sudo == "password" else "there is no sudo"
            raise RemoteError(
                f"steps {', '.join(needing)} need root, and {why}; nothing was changed",
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
        index = cuda_index(facts.cuda_driver) if facts.cuda_driver else None
        return [*args, "--index-url", index] if index else args

    # -- doing ------------------------------------------------------------------------

    def _apply_script(self, step: Step, env: Mapping[str, str]) -> str:
        if step.apt:
            lock = '-o DPkg::Lock::Timeout="$VMRUN_APT_LOCK_WAIT"'
            pkgs = " ".join(quoting.quote(p) for p in step.apt)
            update = "" if self._apt_updated else f"$VMRUN_SUDO apt-get {lock} update\n"
            return f"{update}$VMRUN_SUDO apt-get {lock} install -y {pkgs}"
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
        def log_line(stream: str, data: bytes) -> None:
            self._log(data.decode("utf-8", "replace").rstrip("\n"))

        self._log(f"$ {what}")
        return self.conn.run(
            ["bash", "-eu", "-o", "pipefail", "-c", script], env=env, on_output=log_line
        )

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
        applied = self._bash(self._apply_script(step, env), env, f"{step.name}: apply")
        if step.apt:
            self._apt_updated = True
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
        tail = result.output_tail(8)
        where = f" (full log: {self.log_path})" if self.log_path else ""
        last = tail.splitlines()[-1] if tail else "no output"
        return CommandFailed(
            f"step {step.name} failed ({phase} exited {result.exit_status}): {last}{where}",
            host=self.conn.label,
            exit_status=1,
            output_tail=tail,
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
                facts_mod.SETUP_STATE,
                payload,
                facts_mod.HOST_RECORD,
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
        from vmrun.transfer_upload import upload

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
        # setsid: the reboot must outlive this channel (whose process group is killed).
        self.conn.run(["setsid", "-f", "bash", "-c", f"sleep 1; {command}"], env=env)
        deadline = time.monotonic() + self.opts.reboot_timeout
        while time.monotonic() < deadline:  # wait for the host to go down
            try:
                self.conn.run(["true"], timeout=5)
            except (ConnectionLostError, CommandFailed, UnreachableError):
                break
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
