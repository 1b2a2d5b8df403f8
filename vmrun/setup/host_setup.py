"""Run a setup playbook on one host: plan from facts and fingerprints, apply, reboot, record.

A re-run costs three round trips (facts with the stored fingerprints, every check in one
batch, nothing else) because everything read-only is batched and every decision is local.
The parts live apart: planning (which steps run), execution (running one), reboot, state
(what is remembered on the host), environment (what the scripts see).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from vmrun import hostside, remote_paths
from vmrun.errors import RemoteError
from vmrun.reporting import HostSteps
from vmrun.setup import facts as facts_mod
from vmrun.setup.environment import environment, python_path
from vmrun.setup.execution import StepRunner
from vmrun.setup.facts import Facts
from vmrun.setup.hostlog import HostLog
from vmrun.setup.planning import Plan, PlanInputs, dry_run_report, make_plan
from vmrun.setup.playbook import Step
from vmrun.setup.reboot import reboot
from vmrun.setup.report import (
    HostReport,
    SetupOptions,
    StepOutcome,
    StepStatus,
)
from vmrun.setup.state import SetupState
from vmrun.setup.stepscripts import check_script
from vmrun.ssh.connection import Connection
from vmrun.transfer.types import Report

__all__ = ["HostReport", "HostSetup", "SetupOptions", "StepOutcome"]


class HostSetup:
    """One host's setup; `run()` returns a HostReport or raises a VmrunError."""

    def __init__(
        self,
        conn: Connection,
        options: SetupOptions,
        steps: HostSteps | None = None,
    ):
        self.conn = conn
        self.opts = options
        self.log = HostLog(conn.label, options.log_dir, steps)
        self.run_token = f"{time.time_ns()}"  # `apt-get update` once per run (setup_apt.sh)
        self.report: HostReport | None = None
        self.runner = StepRunner(conn, self.log, self._reboot)

    def run(self) -> HostReport:
        self.log.write(
            f"\n===== vmrun setup {time.strftime('%Y-%m-%d %H:%M:%S')} on {self.conn.label}"
        )
        self.log.event("reading host facts")
        facts = facts_mod.gather(self.conn, self.opts.path(remote_paths.SETUP_STATE))
        report = self.report = HostReport(self.conn.label, facts)
        params = dict(self.opts.params)
        report.python = python_path(params, facts, self.opts.root)
        env = self._environment(params, facts)
        state = SetupState(facts.state)
        plan = make_plan(
            self.opts,
            PlanInputs(facts, params, state.steps, state.stamps),
            lambda steps: self._run_checks(steps, env),
        )
        if self.opts.dry_run:
            return dry_run_report(report, plan, env, self._upload_summary())
        self._preflight_sudo(facts, plan)
        self._upload()
        for step, outcome in plan:
            if outcome.status == StepStatus.WOULD_RUN:
                outcome, records = self.runner.execute(step, env)
                if step.reboot:
                    env = self._refresh_facts(step, params)
                if step.relogin:
                    self._relogin(step)
            elif outcome.status != StepStatus.ADOPTED:
                report.steps.append(outcome)
                continue
            else:
                records = {}
            state.done(step, params, records)
            state.save(self.conn, self._host_record(state), self._state_paths)
            report.steps.append(outcome)
        report.record = state.records(self.opts.playbook)
        self.log.event("done")
        return report

    def _environment(self, params: Mapping[str, str], facts: Facts) -> dict[str, str]:
        assert self.report is not None
        return environment(self.opts, params, facts, self.report.python, self.run_token)

    @property
    def _state_paths(self) -> tuple[str, str]:
        return (
            self.opts.path(remote_paths.SETUP_STATE),
            self.opts.path(remote_paths.HOST_RECORD),
        )

    def _host_record(self, state: SetupState) -> dict[str, str]:
        assert self.report is not None
        return {
            "python": self.report.python,
            "env": self.opts.params.get("env", ""),
            "env_name": self.opts.params.get("env_name", ""),
            **state.records(self.opts.playbook),
        }

    def _reboot(self, env: Mapping[str, str]) -> None:
        assert self.report is not None
        reboot(self.conn, env, self.log, self.opts.reboot_timeout)
        self.report.rebooted = True

    def _refresh_facts(self, after: Step, params: Mapping[str, str]) -> dict[str, str]:
        """Facts again after a step that may reboot (the driver): the torch wheel must follow
        the driver now installed, not the one (or none) seen before it."""
        assert self.report is not None
        self.log.event(f"reading host facts again after {after.name}")
        facts = self.report.facts = facts_mod.gather(
            self.conn, self.opts.path(remote_paths.SETUP_STATE)
        )
        env = self._environment(params, facts)
        self.log.write(
            f"CUDA {facts.cuda_driver or 'none'} (compute capability"
            f" {facts.compute_cap or 'unknown'}): torch index args"
            f" {env['VMRUN_PIP_INDEX_ARGS'] or '(PyPI default)'}"
        )
        return env

    def _relogin(self, after: Step) -> None:
        """A new SSH session for the steps after `after`: sshd gives a session the user's
        groups when it logs in, so a group just added (docker) is missing from every command
        on the old one; the connection dials again on its next command."""
        self.log.event(f"logging in again after {after.name}")
        self.conn.close()

    def _run_checks(self, steps: list[Step], env: Mapping[str, str]) -> set[str]:
        """Every check in one round trip; each runs in its own bash, read-only by contract
        (so no autostop activity either: a dry run writes nothing on the host)."""
        self.log.event(f"checking {len(steps)} step(s)")
        pairs = [word for step in steps for word in (step.name, check_script(step))]
        argv = [*hostside.command("setup_checks.sh"), *pairs]
        result = self.conn.run(argv, env=env, activity=False)
        return {line[5:] for line in result.stdout_tail.splitlines() if line.startswith("PASS ")}

    def _preflight_sudo(self, facts: Facts, plan: Plan) -> None:
        """Before anything changes: a step that needs root on a host where sudo cannot run."""
        needing = [
            s.name for s, o in plan if o.status == StepStatus.WOULD_RUN and (s.sudo or s.apt)
        ]
        if needing and facts.sudo_problem:
            raise RemoteError(
                f"steps {', '.join(needing)} need root, and {facts.sudo_problem};"
                " nothing was changed",
                host=self.conn.label,
                hint="allow passwordless sudo for this user, or do those steps by hand"
                " (see --dry-run) and re-run",
                code="needs-root",
            )

    def _upload_summary(self) -> str:
        parts = []
        if self.opts.wheelhouse:
            parts.append(f"wheelhouse {self.opts.wheelhouse} -> ~/{remote_paths.WHEELHOUSE}")
        if self.opts.installer:
            parts.append(f"installer {self.opts.installer} -> ~/{remote_paths.INSTALLERS}/")
        return "; ".join(parts)

    def _upload(self) -> None:
        """Wheelhouse and installer: incremental, verified, renamed into place."""
        from vmrun.transfer.upload import upload

        if self.opts.wheelhouse:
            self.log.event("uploading the wheelhouse")
            self._check_upload(upload(self.conn, self.opts.wheelhouse, remote_paths.WHEELHOUSE))
        if self.opts.installer:
            self.log.event("uploading the installer")
            remote = f"{remote_paths.INSTALLERS}/{self.opts.installer.name}"
            self._check_upload(upload(self.conn, self.opts.installer, remote))

    def _check_upload(self, report: Report) -> None:
        if not report.ok:
            path, why = next(iter(report.failed.items()), ("?", "not placed"))
            raise RemoteError(
                f"upload of {path} failed: {why}", host=self.conn.label, code="transfer-failed"
            )
