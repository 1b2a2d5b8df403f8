"""Every rank's stack on every node of a run on hosts, read at once (hostside/stacks.py,
py-spy sent where there is none), or what each node's hang watcher took: shared by `vmrun
stacks` and by `train`'s follower, which takes them the moment a node says the run hung."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vmrun.backends.api import RunRef
from vmrun.backends.hosts.records import record_dir
from vmrun.errors import VmrunError
from vmrun.hostside import HostPath, command
from vmrun.runs.stacks import Flight, RankStack, parse, parse_flights
from vmrun.ssh.channel import run_for_output
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry


@dataclass
class Taken:
    """Each rank's stack, the nodes that gave none (and why), and for `hang` what each
    node's watcher saw (its REC/hang)."""

    stacks: list[RankStack] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    hangs: dict[str, dict[str, Any]] = field(default_factory=dict)
    flights: list[Flight] = field(default_factory=list)  # flight recorder dumps (`hang`)


def take_on_nodes(group: Group, ref: RunRef, *, hang: bool = False) -> Taken:
    """The run's ranks' stacks now on each of its nodes (`hang`: the newest hang's)."""
    from vmrun.runs.stack_tool import ensure

    def one(entry: HostEntry, conn: Connection) -> str:
        record = ref.records.get(entry.label)
        python = (record.record.launch.python if record else "") or "python3"
        if hang:
            rec = HostPath(record_dir(ref.run_id))
            return run_for_output(
                conn,
                command("stacks.py", "--saved", rec, python=python),
                what="the hang's stacks",
                activity=False,
            )[1]
        spy = ensure(conn, python)
        return run_for_output(
            conn,
            command("stacks.py", ref.run_id, python=python),
            env={"VMRUN_PY_SPY": spy},
            what="the ranks' stacks",
            activity=False,
        )[1]

    taken = Taken()
    for outcome in group.map(one, only=set(ref.nodes)):
        if not outcome.ok:
            error = outcome.error
            taken.failed[outcome.host] = (
                error.one_line() if isinstance(error, VmrunError) else str(error)
            )
            continue
        text = str(outcome.value or "")
        got = parse(text, outcome.host)
        taken.stacks += got
        taken.flights += parse_flights(text, outcome.host)
        for line in text.splitlines():
            if line.startswith('{"hang": {'):
                taken.hangs[outcome.host] = json.loads(line)["hang"]
        if not got and not hang:
            taken.failed[outcome.host] = "no rank of the run found there"
    taken.stacks.sort(key=lambda s: s.rank)
    taken.flights.sort(key=lambda f: f.rank)
    return taken
