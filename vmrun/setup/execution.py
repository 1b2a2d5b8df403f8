"""Running one step on a host: its apply with the helpers, its verify, a reboot when the verify
asks for one (exit 100), every line logged and the last ones kept for the error."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping

from vmrun.errors import CommandFailed, RemoteError
from vmrun.setup.hostlog import HostLog
from vmrun.setup.offline import WAYS_FORWARD, offline_reason
from vmrun.setup.playbook import Step
from vmrun.setup.progress import DownloadWatch
from vmrun.setup.report import StepOutcome, StepStatus
from vmrun.setup.state import parse_records
from vmrun.setup.stepscripts import apply_script, shell_helpers
from vmrun.ssh.connection import Connection
from vmrun.ssh.result import CommandResult

STEP_TAIL_LINES = 8  # a failing step's last output lines, shown in its error
NEEDS_REBOOT = 100  # a verify's exit status for "installed, but takes effect after a reboot"


class StepRunner:
    """Runs steps' scripts on one connection; `reboot(env)` is called when a verify asks."""

    def __init__(self, conn: Connection, log: HostLog, reboot: Callable[[Mapping[str, str]], None]):
        self.conn = conn
        self.log = log
        self.reboot = reboot
        self._recent_output = ""  # the last lines of the latest script, both streams in order
        self._offline = ""  # why the latest script could not download, if it said so

    def bash(self, script: str, env: Mapping[str, str], what: str) -> CommandResult:
        """Run a step script, logging each line; its last lines of stdout and stderr, in the
        order they came, are kept for the error if it fails (its own output, not just stderr:
        a tool that says why on stdout is shown too). Download progress goes to the live
        view; a meter row (pip's raw `Progress` lines, curl's) is neither logged nor kept."""
        recent: deque[str] = deque(maxlen=STEP_TAIL_LINES)
        downloads = DownloadWatch()

        def log_line(stream: str, data: bytes) -> None:
            line = data.decode("utf-8", "replace").rstrip("\n")
            progress = downloads.feed(line)
            if progress is not None:
                self.log.progress(progress)
            if progress is None or not progress.meter:
                self.log.write(line)
                if line.strip():
                    recent.append(line)
            if not self._offline:
                self._offline = offline_reason(line)

        self.log.write(f"$ {what}")
        self._offline = ""
        # --norc: bash started under sshd sources ~/.bashrc and /etc/bash.bashrc even for -c,
        # and under -u their `[ -z "$PS1" ]` fails ("PS1: unbound variable") in every step
        result = self.conn.run(
            ["bash", "--norc", "-eu", "-o", "pipefail", "-c", script],
            env=env,
            on_output=log_line,
            what=f"setup step {what!r}",
        )
        self._recent_output = "\n".join(recent)
        return result

    def execute(self, step: Step, env: Mapping[str, str]) -> tuple[StepOutcome, dict[str, str]]:
        """Apply and verify one step; its records (when it records) come back with it."""
        started = time.monotonic()
        if step.reboot and step.verify:
            # already installed but waiting for a reboot (e.g. a driver/library mismatch)?
            first = self.bash(step.verify, env, f"{step.name}: verify before applying")
            if first.exit_status == NEEDS_REBOOT:
                self.reboot(env)
                again = self.bash(step.verify, env, f"{step.name}: verify after reboot")
                if again.ok:
                    records = parse_records(again.stdout_tail) if step.record else {}
                    took = time.monotonic() - started
                    return StepOutcome(step.name, StepStatus.RAN, "rebooted", took), records
        self.log.event(f"{step.name}: applying")
        applied = self.bash(shell_helpers() + apply_script(step), env, f"{step.name}: apply")
        if not applied.ok:
            raise self._failed(step, "apply", applied)
        records = parse_records(applied.stdout_tail) if step.record else {}
        if step.verify:
            records.update(self._verify(step, env))
        return StepOutcome(step.name, StepStatus.RAN, "", time.monotonic() - started), records

    def _verify(self, step: Step, env: Mapping[str, str]) -> dict[str, str]:
        verified = self.bash(step.verify, env, f"{step.name}: verify")
        if verified.exit_status == NEEDS_REBOOT and step.reboot:
            self.reboot(env)
            verified = self.bash(step.verify, env, f"{step.name}: verify after reboot")
        if verified.exit_status == NEEDS_REBOOT:
            raise RemoteError(
                f"step {step.name} needs a reboot to take effect",
                host=self.conn.label,
                hint="reboot the host and re-run setup",
                code="reboot-needed",
            )
        if not verified.ok:
            raise self._failed(step, "verify", verified)
        return parse_records(verified.stdout_tail) if step.record else {}

    def _failed(self, step: Step, phase: str, result: CommandResult) -> CommandFailed:
        """The error names the last line of stderr (where tools say why); its tail holds the
        script's last lines of both streams, as `bash` kept them."""
        said = result.output_tail(STEP_TAIL_LINES)
        where = f" (full log: {self.log.path})" if self.log.path else ""
        last = said.splitlines()[-1] if said else "no output"
        if self._offline:  # the one thing to say: it cannot download, and what to do instead
            last = f"the host cannot reach the package index ({self._offline}); {WAYS_FORWARD}"
        return CommandFailed(
            f"step {step.name} failed ({phase} exited {result.exit_status}): {last}{where}",
            host=self.conn.label,
            exit_status=1,
            output_tail=self._recent_output or said,
            code="setup-step-failed",
        )
