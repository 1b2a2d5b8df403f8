"""A Slurm job's ranks' stacks, through its login node (`vmrun stacks -C NAME`): taken now
in the job's allocation, or those its hang watcher took, read from its record. `backend`:
the SlurmBackend (which calls these, so not imported here)."""

from __future__ import annotations

import json
import time
from typing import Any

from vmrun.backends.api import StacksTaken
from vmrun.errors import UsageError
from vmrun.results.record import Job
from vmrun.runs.stacks import parse, parse_flights
from vmrun.runs.state import RunState


def hang_on_cluster(backend: Any, run: str | None) -> StacksTaken:
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
    return StacksTaken(
        ref.run_id,
        sorted(found, key=lambda s: s.rank),
        {},
        hangs,
        flights=parse_flights(text, backend.cluster.name),
    )


def on_cluster(backend: Any, run: str | None) -> StacksTaken:
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
    return StacksTaken(ref.run_id, sorted(found, key=lambda s: s.rank), failed)
