"""A run's log, whatever runs it: found once (the newest run unless named) on -H's hosts or
-C's cluster, then read as it is now or followed to the end (every node merged, lines
prefixed `[host rankN]`; following applies `train`'s failure rule: a node that fails stops
the run on the others)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from vmrun.backends.api import Backend, RunRef
from vmrun.config import Settings
from vmrun.errors import Detached
from vmrun.reporting import QUIET, Reporter


@dataclass(frozen=True)
class RunLog:
    """A found run on its open backend. Its nodes that did not answer are in
    `ref.unreached`: a caller names them (before following, they would wait for the end)."""

    backend: Backend
    ref: RunRef

    def read(self, out: Reporter = QUIET, *, last: int = 0, verbose: bool = False) -> None:
        """The log of every node that answered, as it is now, to `out.output`."""
        if self.ref.nodes:
            self.backend.read_log(self.ref, out, last=last, verbose=verbose)

    def follow(self, out: Reporter = QUIET, *, last: int = 0, verbose: bool = False) -> int:
        """Follow to the end: the run's exit code (0; a failure raises). Ctrl-C is
        `Detached`: the run goes on."""
        if not self.ref.nodes:
            return 0
        from vmrun.containers.refusals import naming_refusals

        try:
            with naming_refusals(out) as watched:  # a container its runtime would not start
                return int(self.backend.follow(self.ref, watched, last=last, verbose=verbose))
        except KeyboardInterrupt:
            raise Detached(f"stopped following {self.ref.run_id}; the run goes on") from None


@contextmanager
def run_log(
    settings: Settings,
    run: str | None = None,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    nodes: Sequence[str] = (),
) -> Iterator[RunLog]:
    """The run (the newest unless named) on its backend, open until the block ends;
    `nodes` narrows a run on hosts to some of its nodes (matched as -H matches a host)."""
    from vmrun.backends.select import open_backend

    with open_backend(settings, hosts=hosts, cluster=cluster) as backend:
        yield RunLog(backend, backend.find(run, nodes=nodes))
