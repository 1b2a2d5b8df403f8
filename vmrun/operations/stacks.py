"""`vmrun stacks [RUN]`: every rank's Python stack on every node of a live run, now (py-spy
on each host, all at once; vmrun sends py-spy where there is none), or with `hang` those
its hang watcher took when it found the run stuck. Each taking is kept under
results/RUN/stacks/ here: a JSON file per rank and the grouped summary."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmrun.config import Settings
from vmrun.errors import UsageError
from vmrun.results.record import Job
from vmrun.runs.stacks import (
    Flight,
    RankStack,
    flight_verdict,
    keep,
    lines,
    parse,
    parse_flights,
)
from vmrun.runs.state import RunState


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
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.backends.hosts.stacks import take_on_nodes
    from vmrun.backends.select import open_backend

    began = time.monotonic()
    with open_backend(settings, hosts=hosts, cluster=cluster) as backend:
        if not isinstance(backend, HostsBackend):
            taken = _hang_on_cluster(backend, run) if hang else _on_cluster(backend, run)
            taken = replace(taken, seconds=time.monotonic() - began)
            return _keep_if(taken, settings, keep, "hang" if hang else "")
        ref = backend.find(run, running_only=run is None and not hang)
        running = any(r.state == RunState.RUNNING for r in ref.records.values())
        if not hang and not running:
            raise UsageError(
                f"run {ref.run_id} is not running: its stacks are gone with it",
                hint=f"`vmrun stacks {ref.run_id} --hang` shows those its hang watcher took",
                code="not-running",
            )
        got = take_on_nodes(backend.group, ref, hang=hang)
    taken = Stacks(
        ref.run_id, got.stacks, got.failed, None, got.hangs, time.monotonic() - began, got.flights
    )
    return _keep_if(taken, settings, keep, "hang" if hang else "")


def _hang_on_cluster(backend: Any, run: str | None) -> Stacks:
    """What a Slurm job's hang watcher took, read from its record through the login node."""
    from vmrun.hostside import command
    from vmrun.ssh.channel import run_for_output

    ref = backend.find(run)
    record_dir = ref.record.job.record_dir if ref.record.job else ""
    argv = command("stacks.py", "--saved", record_dir, python=backend.python())
    _, text = run_for_output(backend.conn, argv, what="the hang's stacks", activity=False)
    said = [json.loads(line)["hang"] for line in text.splitlines() if line.startswith('{"hang": {')]
    hangs = {backend.cluster.name: said[-1]} if said else {}
    found = parse(text, None)
    return Stacks(
        ref.run_id,
        sorted(found, key=lambda s: s.rank),
        {},
        None,
        hangs,
        flights=parse_flights(text, backend.cluster.name),
    )


def _on_cluster(backend: Any, run: str | None) -> Stacks:
    """A Slurm job's ranks, through its login node: one task per node of the job, in its
    allocation beside the running step (`srun --overlap`), each running stacks.py from the
    shared home (py-spy there too: ~/.vmrun/tools, sent to the login node)."""
    from vmrun.hostside import command
    from vmrun.runs.stack_tool import ensure
    from vmrun.ssh.channel import run_for_output

    ref = backend.find(run, running_only=run is None)
    state, _ = backend.state(ref)
    recorded = ref.record.job or Job()
    job = recorded.job_id
    if state != RunState.RUNNING or not job:
        raise UsageError(
            f"run {ref.run_id} is not running (job {job or '?'}, {state}): its"
            " stacks are gone with it",
            code="not-running",
        )
    python = backend.python()
    spy = ensure(backend.conn, python)
    nodes = str(recorded.nodes or 1)
    # each node's task writes its ranks' files into one folder of the record (on the shared
    # filesystem): srun mixes the tasks' output, and a rank's JSON is long
    folder = f"{recorded.record_dir}/stacks/live-{time.strftime('%Y%m%dT%H%M%S')}"
    argv = [
        "srun",
        "--overlap",
        f"--jobid={job}",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        *command("stacks.py", ref.run_id, folder, python=python),
    ]
    result = backend.conn.run(
        argv, env={"VMRUN_PY_SPY": spy}, activity=False, what="the job's stacks (srun --overlap)"
    )
    _, text = run_for_output(
        backend.conn,
        command("stacks.py", "--read", folder, python=python),
        what="the job's stacks",
        activity=False,
    )
    found = parse(text, None)
    failed = {} if found else {backend.cluster.name: (result.output_tail(3) or "no rank found")}
    return Stacks(ref.run_id, sorted(found, key=lambda s: s.rank), failed)


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
