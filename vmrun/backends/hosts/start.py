"""Starting a run on SSH hosts: preflight, code sync, a detached start on every node (the
hosts backend's `start`; following it is vmrun.backends.hosts.backend's).

One path for one host or many. Every run is started with `records.start`, so it outlives
this process and the connection: Ctrl-C here only detaches (`vmrun logs -f RUN` reattaches).

- One host: torchrun with a private c10d rendezvous on localhost (several runs can share a
  host with --allow-concurrent), its log streamed as it is; a dropped connection says how to
  reattach instead of losing the run.
- Several hosts: one torchrun per host, started in parallel, meeting at a c10d rendezvous on
  the master (`--master`, default the first host) whose address and port are chosen and
  checked first (vmrun.backends.hosts.rendezvous); torch versions must agree everywhere;
  how each node is launched is vmrun.backends.hosts.node_launch's; the merged log and the
  failure rule are vmrun.backends.hosts.nodes'. `--launcher python` (mp.spawn: a
  single-node world per script) is refused on several hosts.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from vmrun.backends.api import RunRef
from vmrun.backends.hosts import records as runs
from vmrun.backends.hosts.netfacts import Layout
from vmrun.backends.hosts.node_launch import Launch, Node, Wiring, layout_note, meet, node_launch
from vmrun.backends.hosts.preflight import (
    cuda_warning,
    nproc_for,
    preflight,
)
from vmrun.backends.hosts.staging import stage
from vmrun.reporting import Reporter
from vmrun.runs import launch
from vmrun.runs.plan import Plan
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.types import Progress


def start_remote(
    group: Group,
    plan: Plan,
    entries: list[HostEntry],
    out: Reporter,
    how: Launch,
    progress: Progress | None = None,
) -> RunRef:
    """Preflight every node, stage the code, start the run everywhere; its RunRef."""
    multi = len(entries) > 1
    only = {e.label for e in entries}
    nodes = how.nodes or preflight(group, plan, out, multi=multi, how=how, only=only)
    nodes = {e.label: nodes[e.label] for e in entries}  # the node order: the master first
    nproc = nproc_for(plan, list(nodes.values()))
    warning = cuda_warning(plan, list(nodes.values()))
    if warning:
        out.warn(warning)
    layout = (how.layout or meet(group, nodes, how.wiring)) if multi else None
    rid = how.resume or how.run_id or launch.run_id(plan.name)
    banner = ""
    if how.resume:
        from vmrun.backends.hosts.resume import prepare

        banner = prepare(group, list(nodes), rid, out, how.listed)
    live = progress if isinstance(progress, AbstractContextManager) else nullcontext()
    with live:
        staged = group.map(
            lambda entry, conn: stage(nodes[entry.label], plan, out, progress), only=only
        )
    raise_for_failures(staged, one_as_itself=True)
    started = _start_all(
        group, plan, nodes, rid, nproc, layout, how.wiring, how.resume, banner,
        alone=not how.allow_concurrent,
    )  # fmt: skip
    names = ", ".join(nodes)
    first = entries[0].label
    where = f" on {names}" if multi else f" on {names} (pid {started[first]})"
    out.info(
        f"run {rid} {'resumed' if how.resume else 'started'}{where}; its files: ~/"
        f"{_out_dir(plan, nodes[first].workdir, rid)}/"
    )
    if layout is not None:
        out.info(layout_note(layout, nodes, nproc, plan.launcher))
    return RunRef(rid, tuple(nodes), skip={label: n.skip for label, n in nodes.items()})


def _out_dir(plan: Plan, workdir: str, rid: str) -> str:
    return f"{workdir}/results/{rid}" if plan.is_template else workdir


def _start_all(
    group: Group,
    plan: Plan,
    nodes: dict[str, Node],
    rid: str,
    nproc: str,
    layout: Layout | None,
    wiring: Wiring,
    resume: str | None,
    banner: str = "",
    *,
    alone: bool = False,
) -> dict[str, int]:
    """Start every node; if any fails to start, stop the ones that did and raise. `alone`:
    each host refuses if another run is alive there (the busy check, under its start lock)."""
    labels = list(nodes)
    meta_base = {
        "name": plan.name,
        "template": plan.is_template,
        "launcher": plan.launcher,
        "args": plan.args,
        "nproc_requested": plan.nproc,
        "nproc": nproc,
        "max_restarts": plan.max_restarts,
        "env_keys": sorted(plan.env),
        "nodes": labels,
        "master": labels[0],
        "nnodes": wiring.nnodes or str(len(labels)),
        "rdzv": layout.endpoint if layout else None,
    }

    def start(entry: HostEntry, conn: Connection) -> int:
        node = nodes[entry.label]
        single_env = plan.launcher == "env" and layout is None
        port = _free_port(conn, node.env.python) if single_env else 0
        argv, env = node_launch(plan, node, rid, nproc, layout, wiring, port, labels)
        meta = {
            **meta_base,
            "script": node.script,
            "workdir": node.workdir,
            "out_dir": _out_dir(plan, node.workdir, rid),
            "python": node.env.python,
            "argv": argv,
            "host": entry.label,
            "ifname": layout.ifnames.get(entry.label, "") if layout else "",
        }
        got = runs.start(
            conn, rid, node.workdir, argv, meta, env=env, resume=resume is not None,
            banner=banner, alone=alone,
        )  # fmt: skip
        node.skip = got.log_lines
        return got.pid

    outcomes = group.map(start, only=set(labels))  # the run's nodes, not every host listed
    if any(not o.ok for o in outcomes):
        started = {o.host for o in outcomes if o.ok}
        group.map(lambda entry, conn: runs.stop(conn, rid, grace=5), only=started)
        raise_for_failures(outcomes, one_as_itself=True)
    return {o.host: int(o.value or 0) for o in outcomes}


def _free_port(conn: Connection, python: str) -> int:
    """A port nothing listens on at the host now (the `env` launcher's MASTER_PORT)."""
    probe = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    )
    out = conn.run([python, "-c", probe], check=True, what="a free port probe").stdout_tail.split()
    return int(out[-1]) if out and out[-1].isdigit() else launch.DEFAULT_MASTER_PORT
