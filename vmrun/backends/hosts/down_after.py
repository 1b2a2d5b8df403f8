"""`vmrun train --down-after-run`: the run's hosts power off once it has ended and its results
are here, never before.

"Here" is what `--fetch-every` fetched last: the run's results, from every node, after it
ended (well or not). So the flag needs `--fetch-every` (vmrun.operations.refusals), and a
node whose final fetch failed keeps every node up (said, exit non-zero). Before the run
starts, each node is checked to be able to power itself off (sudo, or its
`autostop_command`): a refusal is one line, and nothing starts. The power-off itself is
vmrun.autostop's: the host's configured command, and never while another vmrun run is alive
there or a process that is no vmrun run's holds a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from vmrun.autostop.settings import Autostop, for_host
from vmrun.autostop.watchdog import check, power_off_now
from vmrun.config import Settings
from vmrun.errors import ConnectionLostError, HostsFailed, RemoteError
from vmrun.reporting import Reporter
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry


class DownAfterRun:
    """The run's nodes, their power-off settings, and the connections to reach them."""

    def __init__(self, group: Group, entries: Sequence[HostEntry], settings: Settings):
        self.group = group
        self.configs: dict[str, Autostop] = {
            e.label: for_host(settings, e, one_off=True) for e in entries
        }

    def preflight(self) -> None:
        """Every node can power itself off, or the run does not start."""
        outcomes = self.group.map(
            lambda e, conn: check(conn, self.configs[e.label], boot=False), only=self.configs
        )
        raise_for_failures(outcomes, one_as_itself=True)

    def after(self, rid: str, failed_fetch: Sequence[str], out: Reporter) -> None:
        """Power every node off, now that the run has ended; not one if the final fetch
        failed anywhere."""
        if failed_fetch:
            raise RemoteError(
                f"--down-after-run: the hosts stay up: the final fetch of run {rid} failed on"
                f" {', '.join(failed_fetch)}, so its results are not all here",
                hint=f"fetch them with `vmrun fetch results --run {rid}`, then power off",
            )
        why = f"run {rid} ended and its results were fetched (vmrun train --down-after-run)"
        outcomes = self.group.map(
            lambda e, conn: power_off_now(conn, self.configs[e.label], why), only=self.configs
        )
        failures: dict[str, BaseException] = {}
        for outcome in outcomes:
            off = f"{outcome.host}: powering off ({self.configs[outcome.host].shown})"
            if outcome.ok:
                out.info(f"{off}: run {rid} ended, its files are here")
            elif isinstance(outcome.error, ConnectionLostError):
                out.info(f"{off}: the connection closed as it went down")
            elif outcome.error is not None:
                failures[outcome.host] = outcome.error
        if len(failures) == 1:
            raise next(iter(failures.values()))
        if failures:
            raise HostsFailed(failures, total=len(outcomes))
