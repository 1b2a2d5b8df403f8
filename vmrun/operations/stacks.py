"""`vmrun stacks [RUN]`: every rank's Python stack on every node of a live run, now (py-spy
on each host, all at once; vmrun sends py-spy where there is none), or with `hang` those
its hang watcher took when it found the run stuck. Each taking is kept under
results/RUN/stacks/ here: a JSON file per rank and the grouped summary."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmrun.config import Settings
from vmrun.runs.stacks import (
    Flight,
    RankStack,
    flight_verdict,
    keep,
    lines,
)


@dataclass(frozen=True)
class Stacks:
    """What was found: each rank's stack, the nodes that gave none (and why), where the
    stacks were kept, and for `hang` what each node's watcher saw (its REC/hang)."""

    run_id: str
    stacks: list[RankStack]
    failed: dict[str, str] = field(default_factory=dict)
    saved: Path | None = None
    hangs: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    flights: list[Flight] = field(default_factory=list)  # torch's flight recorder (`hang`)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or not self.stacks else 0

    def lines(self, *, full: bool = False) -> list[str]:
        verdict = flight_verdict(self.flights)
        return [*lines(self.stacks, full=full), *([verdict] if verdict else [])]


def take(
    settings: Settings,
    run: str | None = None,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
    hang: bool = False,
    keep: bool = True,
) -> Stacks:
    """The stacks of `run` (the newest running one when not named) on -H's hosts; `hang`:
    the last ones its hang watcher took instead (the run may have ended since)."""
    from vmrun.backends.select import open_backend

    began = time.monotonic()
    with open_backend(settings, hosts=hosts, cluster=cluster) as backend:
        got = backend.stacks(run, hang=hang)
    taken = Stacks(
        got.run_id, got.stacks, got.failed, None, got.hangs, time.monotonic() - began, got.flights
    )
    return _keep_if(taken, settings, keep, "hang" if hang else "")


def _keep_if(taken: Stacks, settings: Settings, keep: bool, name: str = "") -> Stacks:
    if keep and taken.stacks:
        return _keep(taken, settings, name or time.strftime("%Y%m%dT%H%M%S"))
    return taken


def _keep(taken: Stacks, settings: Settings, name: str) -> Stacks:
    """results/RUN/stacks/NAME/: rank-R.json each, stacks.txt the summary."""
    project = settings.project_dir or Path.cwd()
    return replace(
        taken, saved=keep(taken.stacks, project / "results" / taken.run_id / "stacks" / name)
    )
