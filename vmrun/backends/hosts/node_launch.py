"""How each node of a run is launched: its launcher's argv and environment (torchrun with a
c10d rendezvous, or one process with RANK/WORLD_SIZE/MASTER_ADDR), the interfaces NCCL and
gloo use, and where torch's c10d puts global rank 0.

torch's c10d numbers the nodes itself, ordering them by the address each advertises: the
master advertises the rendezvous address, the others their host names, so global rank 0 is
on the master unless a host name sorts before that address (vmrun then says where rank 0
is). `--launcher env` starts one process per host with RANK = the host's place in the node
order (the master first), WORLD_SIZE = the number of hosts and MASTER_ADDR:MASTER_PORT = the
checked rendezvous address and port.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vmrun.backends.hosts import records as runs
from vmrun.backends.hosts.images import NodeImage
from vmrun.backends.hosts.netfacts import Layout, NodeFacts
from vmrun.containers.runtime import IMAGE_PYTHON
from vmrun.runs import launch
from vmrun.runs.launch_spec import Budget, Hang, Notify, Provenance, Spot, Store, Watchers
from vmrun.runs.plan import Plan
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry
from vmrun.store_url import StoreURL

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


@dataclass(frozen=True)
class HostEnv:
    home: str
    python: str
    record: dict[str, Any]
    listed_gpus: int = 0

    @property
    def gpus(self) -> int:
        try:
            return int(self.record.get("gpus", self.listed_gpus))
        except (TypeError, ValueError):
            return self.listed_gpus


@dataclass
class Node:
    entry: HostEntry
    conn: Connection
    env: HostEnv
    facts: NodeFacts | None = None
    workdir: str = ""
    script: str = ""
    skip: int = 0  # log lines of earlier attempts (resume)
    image: NodeImage | None = None  # the container its processes run in, if any
    data: list[dict[str, object]] = field(default_factory=list)  # what --data pushed there

    @property
    def label(self) -> str:
        return self.entry.label


@dataclass(frozen=True)
class Wiring:
    """The multi-node flags: where the nodes meet and how they talk."""

    master: str | None = None
    nnodes: str | None = None
    rdzv_port: int | None = None
    nccl_debug: str | None = None


@dataclass
class Placement:
    """Where the run goes on the hosts, beside the shared StartOptions: the multi-node flags,
    and what the caller already knows (so nothing is probed or listed twice)."""

    wiring: Wiring = field(default_factory=Wiring)
    listed: dict[str, list[runs.RunRecord]] | None = None  # every run per host, if known
    nodes: dict[str, Node] | None = None  # checked already (doctor): no second preflight
    layout: Layout | None = None  # the rendezvous decided already, with `nodes`
    restore: StoreURL | None = None  # --resume of a run whose hosts are gone: its bucket copy


def meet(group: Group, nodes: dict[str, Node], wiring: Wiring) -> Layout:
    from vmrun.backends.hosts.rendezvous import decide

    master = next(iter(nodes))
    facts = {label: n.facts for label, n in nodes.items() if n.facts is not None}
    return decide(
        group,
        {label: n.env.python for label, n in nodes.items()},
        facts,
        master,
        port=wiring.rdzv_port,
        override_addr=str(nodes[master].entry.vars.get("private_addr") or ""),
        ifname_overrides={
            label: str(n.entry.vars["ifname"])
            for label, n in nodes.items()
            if n.entry.vars.get("ifname")
        },
    )


def node_launch(
    plan: Plan,
    node: Node,
    rid: str,
    nproc: str,
    layout: Layout | None,
    wiring: Wiring,
    port: int = 0,
    order: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one node's launcher. `port`: the single-host `env`
    launcher's MASTER_PORT; `order`: the nodes, which the multi-host `env` launcher ranks in
    this order with the master moved first (its address is MASTER_ADDR)."""
    args = list(plan.args)
    if plan.is_template and "--out-dir" not in args:
        args += ["--out-dir", f"results/{rid}"]
    env = {"PYTHONUNBUFFERED": "1"}
    python, script = IMAGE_PYTHON if node.image else node.env.python, node.script
    if plan.launcher == "torchrun":  # per-rank files, and whole lines in the log
        workers = f"{node.env.home}/{runs.record_dir(rid)}/workers"
        env.update(launch.torchrun_env(plan.max_restarts))
        if layout is None:
            argv = launch.torchrun_argv(
                python,
                script,
                args,
                nproc_per_node=nproc,
                max_restarts=plan.max_restarts,
                rdzv_endpoint="localhost:0",
                rdzv_id=rid,
                log_dir=workers,
            )
        else:
            is_master = node.label == layout.master
            argv = launch.torchrun_argv(
                python,
                script,
                args,
                nproc_per_node=nproc,
                max_restarts=plan.max_restarts,
                nnodes=wiring.nnodes or str(len(layout.ifnames)),
                rdzv_endpoint=layout.endpoint,
                rdzv_id=rid,
                rdzv_conf={"is_host": "true" if is_master else "false"},
                local_addr=layout.addr if is_master else _worker_addr(node, layout),
                log_dir=workers,
            )
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = launch.RANK_PREFIX_TEMPLATE
    else:
        argv = launch.python_argv(python, script, args)
        if plan.launcher == "env" and layout is None:
            env.update(
                launch.env_wiring(
                    node_rank=0,
                    nnodes=1,
                    master_addr="127.0.0.1",
                    master_port=port or launch.DEFAULT_MASTER_PORT,
                )
            )
        elif plan.launcher == "env":
            assert layout is not None
            ranked = [layout.master, *(x for x in order if x != layout.master)]
            env.update(
                launch.node_env_wiring(
                    ranked, node.label, master_addr=layout.addr, master_port=layout.port
                )
            )
    env.update(_debug_env(node, rid, wiring, plan.env))
    if layout is not None:
        env.update(_network_env(node, layout, wiring))
    env.update(plan.env)  # the user's --env wins over everything vmrun sets
    return argv, env


def _worker_addr(node: Node, layout: Layout) -> str | None:
    """A worker advertises its host name (torch's default), which sorts after the master's
    numeric address so the master becomes global rank 0; a name that would sort first is
    replaced by the worker's own address, which the others can reach if it leads."""
    assert node.facts is not None
    if node.facts.fqdn and node.facts.fqdn > layout.addr:
        return None
    ifname = layout.ifnames.get(node.label)
    iface = next((i for i in node.facts.ifaces if i.ifname == ifname), None)
    return iface.addr if iface else None


def _advertised(node: Node, layout: Layout) -> str:
    """What the node's torchrun names itself in the rendezvous (c10d sorts nodes by it)."""
    if node.label == layout.master:
        return layout.addr
    assert node.facts is not None
    return _worker_addr(node, layout) or node.facts.fqdn


def _debug_env(node: Node, rid: str, wiring: Wiring, given: dict[str, str]) -> dict[str, str]:
    """What a stuck or slow NCCL run is read from afterwards, in the record's nccl/ folder:
    torch's flight recorder (each rank's last collectives, dumped when one times out: who
    had not arrived), and NCCL's INIT and NET lines in files of their own, so the log stays
    the script's and the run's watcher reads which transport NCCL chose (hang_watch.py).
    --nccl-debug (or NCCL_DEBUG set by the user) puts NCCL's lines in the log instead."""
    folder = f"{node.env.home}/{runs.record_dir(rid)}/nccl"
    table = node.entry.vars.get("env")
    own = table if isinstance(table, dict) else {}  # the host's `env` in vmrun.toml
    env = launch.flight_recorder_env(f"{folder}/fr_rank_", _torch_of(node), [*given, *own])
    asked = [os.environ, given, own]
    if wiring.nccl_debug:  # one host too
        env["NCCL_DEBUG"] = wiring.nccl_debug
    elif not any("NCCL_DEBUG" in where for where in asked):
        env.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=f"{folder}/%h.%p.log"
        )
    return env


def _torch_of(node: Node) -> str | None:
    """The node's torch version, where vmrun knows it: the multi-node probe's, else what
    setup recorded for the Python the run uses; None in an image (its own torch)."""
    if node.image is not None:
        return None
    probed = node.facts.data.get("torch") if node.facts is not None else None
    if probed:
        return str(probed)
    record = node.env.record
    if record.get("torch") and record.get("python") == node.env.python:
        return str(record["torch"])
    return None


def _network_env(node: Node, layout: Layout, wiring: Wiring) -> dict[str, str]:
    """NCCL/gloo interfaces from the route to the master; the user's NCCL_* settings (this
    shell's environment, then vmrun.toml's `env` for the host) on top."""
    env: dict[str, str] = {}
    ifname = layout.ifnames.get(node.label, "")
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
        env["NCCL_SOCKET_IFNAME"] = f"={ifname}"
    env.update({k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    host_env_table = node.entry.vars.get("env") or {}
    if isinstance(host_env_table, dict):
        env.update({str(k): str(v) for k, v in host_env_table.items()})
    if wiring.nccl_debug:
        env["NCCL_DEBUG"] = wiring.nccl_debug
    return env


def rank0_node(layout: Layout | None, nodes: dict[str, Node], launcher: str = "torchrun") -> str:
    """The node where global rank 0 runs: where the template writes its snapshots."""
    if layout is None:
        return next(iter(nodes))
    if launcher == "env":  # vmrun ranks the nodes itself: the master is rank 0
        return layout.master
    return min(nodes.values(), key=lambda n: _advertised(n, layout)).label


def layout_note(
    layout: Layout, nodes: dict[str, Node], nproc: str, launcher: str = "torchrun"
) -> str:
    ifs = ", ".join(f"{label} {i or '?'}" for label, i in layout.ifnames.items())
    rank0 = rank0_node(layout, nodes, launcher)
    where = "" if rank0 == layout.master else f"; torch's c10d puts global rank 0 on {rank0}"
    return (
        f"{len(nodes)} nodes x {nproc} process(es), rendezvous at {layout.endpoint} on"
        f" {layout.master}; interfaces: {ifs}{where}"
    )


def node_watchers(
    plan: Plan,
    node: Node,
    *,
    code_patch: str = "",
    notify_config: str = "",
    budget: str = "",
    store: StoreURL | None = None,
    store_config: str = "",
) -> Watchers:
    """What the node's agent runs beside the run (hostside/run_agent.py). `budget`: `SECONDS
    CAP` (`train --max-cost`: every node stops its own ranks); `store`: this node copies the
    run's outputs there, with the mover's `store_config`."""
    hang = None
    if plan.hang_timeout:  # torchrun's ranks' lines carry their prefix: its banner is not progress
        hang = Hang(
            float(plan.hang_timeout), plan.on_hang, plan.launcher == "torchrun", node.env.python
        )
    seconds, _, cap = budget.partition(" ")
    return Watchers(
        hang=hang,
        budget=Budget(float(seconds), cap) if budget else None,
        # in an image the ranks are the engine's, out of a spot watcher's reach
        spot=Spot() if plan.recover and not node.image else None,
        store=(
            Store(store.path, str(store), node.env.python, not plan.is_template, store_config)
            if store is not None
            else None
        ),
        notify=Notify(notify_config) if notify_config else None,
        # in an image the image's Python describes it (hostside/run_in_image.sh)
        provenance=Provenance("" if node.image else node.env.python, code_patch),
    )
