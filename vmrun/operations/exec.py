"""One command on every host at once, its output streamed as it comes: each host's result,
the hosts that failed (could not run it, or it exited non-zero) and the exit code come back
as a value; nothing is printed."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.operations.hostlist import Hosts, entries_for
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.group import Outcome, worst_exit_code
from vmrun.ssh.inventory import HostEntry
from vmrun.ssh.result import CommandResult

if TYPE_CHECKING:
    from vmrun.ssh.connection import Connection

# (host, stream, line): stream "out" or "err"; the line keeps its b"\n" when it had one.
HostOutput = Callable[[str, str, bytes], None]


@dataclass(frozen=True)
class HostFailure:
    """A host where the command did not succeed: it could not run there (`error`), or it
    ran and exited with `exit_status`."""

    host: str
    error: BaseException | None = None
    exit_status: int | None = None


@dataclass(frozen=True)
class Ran:
    """Each host's outcome (its CommandResult, or the error it failed with), in host order."""

    outcomes: list[Outcome[CommandResult]]

    @property
    def failures(self) -> list[HostFailure]:
        failed = []
        for outcome in self.outcomes:
            if outcome.error is not None:
                failed.append(HostFailure(outcome.host, error=outcome.error))
            elif outcome.value is not None and not outcome.value.ok:
                failed.append(HostFailure(outcome.host, exit_status=outcome.value.exit_status))
        return failed

    def to_json(self) -> str:
        """`exec --json`: per host, in host order, its own exit status (the command's, or
        vmrun's code for its error), the error, and the output's last lines."""
        import json

        from vmrun.errors import error_json, exit_code_for

        hosts = []
        for o in self.outcomes:
            item: dict[str, object] = {"host": o.host, "seconds": round(o.duration, 3)}
            if o.error is not None:
                item.update(exit_status=exit_code_for(o.error), error=error_json(o.error))
            elif o.value is not None:
                got = o.value
                item.update(
                    exit_status=got.exit_status,
                    error=None,
                    stdout_tail=got.stdout_tail,
                    stderr_tail=got.stderr_tail,
                )
            hosts.append(item)
        failed = len(self.failures)
        return json.dumps({"hosts": hosts, "failed": failed, "exit_code": self.exit_code}, indent=2)

    @property
    def exit_code(self) -> int:
        """0 when it succeeded everywhere; else the worst host's: its exit status, or
        vmrun's code for its error (12: unreachable)."""
        return worst_exit_code(self.outcomes)


def run(
    command: Sequence[str],
    settings: Settings,
    hosts: Hosts = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
    on_output: HostOutput | None = None,
    out: Reporter = QUIET,
) -> Ran:
    """Run `command` (argv) on `hosts` (names, or entries already chosen; None: the
    project's) in parallel, in `cwd`, with `env` (sent over stdin), stopped after `timeout`
    seconds. Each line of output goes to `on_output` with its host, or else to `out.output`."""
    from vmrun.ssh.channel import command_line
    from vmrun.ssh.group import Group

    argv = tuple(command)
    entries = entries_for(hosts, settings)

    def work(entry: HostEntry, conn: Connection) -> CommandResult:
        def line(stream: str, data: bytes) -> None:
            if on_output is not None:
                on_output(entry.label, stream, data)
            else:
                out.output(data)

        return conn.run(
            argv, env=env, cwd=cwd, timeout=timeout, on_output=line, what=command_line(argv)
        )

    with Group(entries, settings) as group:
        return Ran(group.map(work))
