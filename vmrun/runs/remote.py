"""Training on hosts over SSH: preflight, code sync, a detached start, the live log, the exit.

One path for one host or many. Every run is started with `runs.start`, so it outlives this
process and the connection: Ctrl-C here only detaches (`vmrun logs -f RUN` reattaches).

- One host: torchrun with a private c10d rendezvous on localhost (several runs can share a
  host with --allow-concurrent), its log streamed as it is; a dropped connection says how to
  reattach instead of losing the run.
- Several hosts: one torchrun per host, started in parallel, meeting at a c10d rendezvous on
  the master (`--master`, default the first host) whose address and port are chosen and
  checked first (vmrun.runs.rendezvous); torch versions must agree everywhere; the merged log and
  the failure rule are vmrun.runs.nodes'. torch's c10d numbers the nodes itself, ordering them by
  the address each advertises: the master advertises the rendezvous address, the others
  their host names, so global rank 0 is on the master unless a host name sorts before that
  address (vmrun then says where rank 0 is). `--launcher env` starts one process per host
  with RANK = the host's place in the node order (the master first), WORLD_SIZE = the number
  of hosts and MASTER_ADDR:MASTER_PORT = the checked rendezvous address and port; `--launcher
  python` (mp.spawn: a single-node world per script) is refused on several hosts.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from vmrun.config import Settings
from vmrun.errors import (
    CommandFailed,
    ConnectionLostError,
    Interrupted,
    RemoteError,
    UsageError,
)
from vmrun.remote_paths import LIB_DIR
from vmrun.runs import launch
from vmrun.runs import records as runs
from vmrun.runs.plan import CPU_PROCESSES, Plan
from vmrun.runs.rendezvous import Layout, NodeFacts
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.types import Progress

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")

# One round trip: the home directory, setup's environment record (base64 JSON), and the
# GPUs nvidia-smi lists (for hosts whose interpreter vmrun.toml names without a setup).
_PREFLIGHT = (
    'printf "%s\\n" "$HOME"; base64 -w0 "$HOME/.vmrun/host.json" 2>/dev/null; echo;'
    " nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true"
)

Note = Callable[[str], None]


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


@dataclass(frozen=True)
class Wiring:
    """The multi-node flags: where the nodes meet and how they talk."""

    master: str | None = None
    nnodes: str | None = None
    rdzv_port: int | None = None
    nccl_debug: str | None = None


@dataclass
class Node:
    entry: HostEntry
    conn: Connection
    env: HostEnv
    facts: NodeFacts | None = None
    workdir: str = ""
    script: str = ""
    skip: int = 0  # log lines of earlier attempts (resume)

    @property
    def label(self) -> str:
        return self.entry.label


def host_env(conn: Connection, entry: HostEntry) -> HostEnv:
    """The interpreter to train with: vmrun.toml's `python` for the host, else setup's record."""
    out = conn.run(["sh", "-c", _PREFLIGHT], check=True).stdout_tail.splitlines()
    home = out[0] if out else ""
    record: dict[str, Any] = {}
    if len(out) > 1 and out[1].strip():
        try:
            record = json.loads(base64.b64decode(out[1]))
        except ValueError:
            record = {}
    listed = int(out[2]) if len(out) > 2 and out[2].strip().isdigit() else 0
    python = str(entry.vars.get("python") or record.get("python") or "")
    if not python:
        raise UsageError(
            "no Python environment is recorded for this host; nothing was started",
            host=entry.label,
            hint=f'run `vmrun setup {entry.label}` first, or set python = "/path/to/python"'
            " for it in vmrun.toml",
        )
    return HostEnv(home, python, record, listed)


def check_not_busy(
    conn: Connection, allow_concurrent: bool, resuming: str | None = None
) -> list[runs.RunRecord]:
    """Refuse a second run on a busy host unless allowed; return the runs going on there."""
    busy = [r for r in runs.list_runs(conn) if r.state == "running" and r.id != resuming]
    if busy and not allow_concurrent:
        raise UsageError(
            f"this host is already running {busy[-1].id}; two runs would share its GPUs",
            host=conn.label,
            hint=f"wait, `vmrun stop {busy[-1].id}`, or pass --allow-concurrent",
        )
    return busy


def shared_workdir_warning(plan: Plan, busy: list[runs.RunRecord], workdir: str) -> str | None:
    """A user script runs with the project's work directory as its cwd, so two concurrent
    runs of one project write fixed names (snapshot.pt) over each other; say so."""
    if plan.is_template:
        return None  # the template writes to results/<run-id>/ only
    others = [
        r.id
        for r in busy
        if str(r.meta.get("workdir") or workdir) == workdir and r.meta.get("template") is not True
    ]
    if not others:
        return None
    return (
        f"warning: {', '.join(others)} also runs in ~/{workdir}, this run's working directory;"
        " files both scripts write under fixed names (snapshot.pt) will overwrite each other"
    )


def check_launcher_hosts(plan: Plan, hosts: int, wiring: Wiring) -> None:
    """Launchers that cannot form one world across hosts are refused before any connection:
    `python` scripts spawn their own single-node world, so N hosts would run N unrelated
    jobs; `env` gives each host one fixed rank, so an elastic --nnodes MIN:MAX cannot hold."""
    if hosts < 2:
        return
    if plan.launcher == "python":
        raise UsageError(
            f"--launcher python runs a script that spawns its own single-node workers, so on"
            f" {hosts} hosts it would start {hosts} unrelated jobs; use --launcher torchrun"
            " (or env: one process per host with RANK/WORLD_SIZE/MASTER_ADDR set), or one -H"
        )
    if plan.launcher == "env" and wiring.nnodes and ":" in wiring.nnodes:
        raise UsageError(
            f"--nnodes {wiring.nnodes}: elastic sizes need --launcher torchrun; --launcher env"
            f" starts one process on each of the {hosts} hosts"
        )


def run_remote(
    plan: Plan,
    entries: list[HostEntry],
    settings: Settings,
    *,
    detach: bool,
    allow_concurrent: bool,
    on_line: Callable[[bytes], None],
    note: Note,
    wiring: Wiring | None = None,
    resume: str | None = None,
    fetch_every: float | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
) -> int:
    """Start the plan on the hosts (one node each) and, unless detached, follow it to the
    end (`fetch_every`: pulling its checkpoints meanwhile); return 0 or raise with the run's
    failure. `run_id`: the new run's id, where the caller needs to know it beforehand."""
    wiring = wiring or Wiring()
    entries = _order(entries, wiring)
    check_launcher_hosts(plan, len(entries), wiring)
    multi = len(entries) > 1
    with Group(entries, settings) as group:
        nodes = _preflight(
            group, plan, note, multi=multi, allow_concurrent=allow_concurrent, resume=resume
        )
        nproc = _nproc(plan, list(nodes.values()))
        layout = _meet(group, nodes, wiring) if multi else None
        rid = resume or run_id or launch.run_id(plan.name)
        if resume:
            from vmrun.runs.resume import prepare

            prepare(group, list(nodes), rid, note)
        live = progress if isinstance(progress, AbstractContextManager) else nullcontext()
        with live:
            staged = group.map(lambda entry, conn: _stage(nodes[entry.label], plan, note, progress))
        raise_for_failures(staged, one_as_itself=True)
        started = _start_all(group, plan, nodes, rid, nproc, layout, wiring, resume)
        names = ", ".join(nodes)
        where = f" on {names}" if multi else f" on {names} (pid {started[entries[0].label]})"
        note(
            f"run {rid} {'resumed' if resume else 'started'}{where}; its files: ~/"
            f"{_out_dir(plan, nodes[entries[0].label].workdir, rid)}/"
        )
        if layout is not None:
            note(_layout_note(layout, nodes, nproc, plan.launcher))
        if detach:
            note(f"follow it with `vmrun logs -f {rid}`; stop it with `vmrun stop {rid}`")
            return 0
        fetcher = None
        if fetch_every:
            from vmrun.runs.fetching import Fetcher

            conns = [n.conn for n in nodes.values()]
            fetcher = Fetcher(conns, rid, plan.project, fetch_every, note).start()
        try:
            code = _follow(nodes, rid, on_line, note)
        except Interrupted:
            if fetcher:
                fetcher.finish(results=False)
            raise
        except BaseException:
            if fetcher:  # the newest snapshot matters most when a node has failed
                fetcher.finish(results=False)
                fetcher.round("checkpoints")
            raise
        if fetcher:
            fetcher.finish(results=True)
        return code


def _follow(nodes: dict[str, Node], rid: str, on_line: Callable[[bytes], None], note: Note) -> int:
    if len(nodes) == 1:
        return _follow_single(next(iter(nodes.values())), rid, on_line, note)
    from vmrun.runs.nodes import follow_nodes

    follow_nodes(
        [n.conn for n in nodes.values()],
        rid,
        on_line,
        note,
        last={n.label: n.skip for n in nodes.values()},
    )
    note(f"run {rid} finished on {', '.join(nodes)}; `vmrun fetch --run {rid}` brings its files")
    return 0


def _order(entries: list[HostEntry], wiring: Wiring) -> list[HostEntry]:
    """The master first (--master names one of the hosts), the others in the order given."""
    if len(entries) == 1:
        if wiring.master or wiring.nnodes:
            raise UsageError("--master and --nnodes are for several hosts; give more with -H")
        return entries
    if wiring.master is None:
        return entries
    found = [e for e in entries if wiring.master in (e.label, e.name, e.spec.label)]
    if not found:
        raise UsageError(
            f"--master {wiring.master}: not one of the run's hosts"
            f" ({', '.join(e.label for e in entries)})"
        )
    return [found[0], *(e for e in entries if e is not found[0])]


def _preflight(
    group: Group, plan: Plan, note: Note, *, multi: bool, allow_concurrent: bool, resume: str | None
) -> dict[str, Node]:
    """On every host at once: its interpreter, not busy (or a warning where a concurrent run
    shares the work directory), and (several hosts) its network and torch facts. Nothing is
    started anywhere unless every host passes."""
    from vmrun.remote_paths import remote_workdir

    workdir = remote_workdir(plan.project)

    def check(entry: HostEntry, conn: Connection) -> Node:
        env = host_env(conn, entry)
        busy = check_not_busy(conn, allow_concurrent, resume)
        warning = shared_workdir_warning(plan, busy, workdir)
        if warning:
            note(f"{entry.label}: {warning}")
        node = Node(entry, conn, env)
        if multi:
            from vmrun.runs.rendezvous import gather_facts

            node.facts = gather_facts(conn, env.python, versions=True)
            if node.facts.data.get("torch") is None:
                raise UsageError(
                    f"torch is not importable by {env.python}"
                    f" ({node.facts.data.get('torch_error')}); nothing was started",
                    host=entry.label,
                    hint=f"run `vmrun setup {entry.label}`",
                )
        return node

    outcomes = group.map(check)
    raise_for_failures(outcomes, one_as_itself=True)
    nodes = {o.host: o.value for o in outcomes if o.value is not None}
    if multi:
        _check_same_env(nodes)
    return nodes


def _check_same_env(nodes: dict[str, Node]) -> None:
    """The same Python (major.minor: the ABI, pickles) and torch build on every node, or
    nothing starts (say which differ)."""
    for key, what in (("python", "Python"), ("torch", "torch")):
        seen: dict[str, list[str]] = {}
        for label, node in nodes.items():
            assert node.facts is not None
            value = str(node.facts.data.get(key))
            if key == "python":
                value = ".".join(value.split(".")[:2])
            seen.setdefault(value, []).append(label)
        if len(seen) > 1:
            which = "; ".join(f"{v} on {', '.join(hosts)}" for v, hosts in seen.items())
            raise UsageError(
                f"the hosts run different {what} versions ({which}); nothing was started",
                hint="install the same one everywhere (`vmrun setup` with the same --torch)",
            )


def _meet(group: Group, nodes: dict[str, Node], wiring: Wiring) -> Layout:
    from vmrun.runs.rendezvous import decide

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


def _stage(node: Node, plan: Plan, note: Note, progress: Progress | None = None) -> None:
    """Put the code on the host: node.workdir, and node.script as the run will see it."""
    from vmrun.remote_paths import remote_workdir
    from vmrun.sync.files import large_files, project_files
    from vmrun.sync.project import sync_project
    from vmrun.trainer import is_bundled
    from vmrun.transfer.upload import upload

    conn = node.conn
    node.workdir = workdir = remote_workdir(plan.project)
    if is_bundled(plan.script):  # the run's cwd; a SCRIPT's sync makes it itself
        conn.run(["mkdir", "-p", workdir], check=True)
        remote = f"{LIB_DIR}/vmrun_{plan.script.name}"
        report = upload(conn, plan.script, remote)
        if not report.ok:
            raise RemoteError(
                f"could not place vmrun's {plan.script.name} on the host", host=conn.label
            )
        node.script = f"{node.env.home}/{remote}"
        return
    try:
        script = plan.script.relative_to(plan.project).as_posix()
    except ValueError:
        raise UsageError(
            f"script {plan.script} is outside the project {plan.project}, so it"
            " would not be synced",
            hint="run vmrun from the project, or move the script into it",
        ) from None
    files = project_files(plan.project)
    if script not in files:
        raise UsageError(
            f"script {script} is excluded from the sync (.gitignore,"
            " .vmrunignore or vmrun's defaults)",
            hint=f"add `!{script}` to .vmrunignore",
        )
    for name, size in large_files(plan.project, files):
        note(
            f"{conn.label}: warning: syncing a large file: {name} ({size / 2**20:.0f} MiB);"
            " list it in .vmrunignore to leave it here"
        )
    synced = sync_project(conn, plan.project, workdir, files=files, progress=progress)
    if progress is None:  # else the progress view has shown them
        for text in synced.warnings:
            note(f"{conn.label}: warning: {text}")
    if synced.sent:
        note(
            f"{conn.label}: synced {synced.sent} file(s), {synced.sent_bytes / 2**20:.1f} MiB"
            f" ({synced.engine}, {synced.seconds:.1f} s) to ~/{workdir}"
        )
    node.script = script


def _nproc(plan: Plan, nodes: list[Node]) -> str:
    """--nproc-per-node, else one process per GPU where every node has the same number of
    GPUs, else 2 CPU processes (gloo) where none has one."""
    if plan.nproc is not None or plan.launcher != "torchrun":
        nproc = plan.nproc or "1"
        if nproc == "gpu":
            without = [n.label for n in nodes if not _gpus(n)]
            if without:
                raise UsageError(
                    f"--nproc-per-node gpu: no GPU on {', '.join(without)}",
                    hint="use --nproc-per-node cpu or a number",
                )
        return nproc
    counts = {n.label: _gpus(n) for n in nodes}
    if len(set(counts.values())) > 1:
        which = ", ".join(f"{label}: {c}" for label, c in counts.items())
        raise UsageError(
            f"the hosts have different numbers of GPUs ({which}); torchrun needs the same"
            " number of processes on every node",
            hint="pass --nproc-per-node N",
        )
    return "gpu" if next(iter(counts.values())) else str(CPU_PROCESSES)


def _gpus(node: Node) -> int:
    if node.facts is not None:
        return int(node.facts.data.get("gpus") or 0)
    return node.env.gpus


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
) -> dict[str, int]:
    """Start every node; if any fails to start, stop the ones that did and raise."""
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
        argv, env = _launch(plan, node, rid, nproc, layout, wiring, port, labels)
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
        got = runs.start(conn, rid, node.workdir, argv, meta, env=env, resume=resume is not None)
        node.skip = got.log_lines
        return got.pid

    outcomes = group.map(start)
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
    out = conn.run([python, "-c", probe], check=True).stdout_tail.split()
    return int(out[-1]) if out and out[-1].isdigit() else launch.DEFAULT_MASTER_PORT


def _launch(
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
    python, script = node.env.python, node.script
    if plan.launcher == "torchrun":
        env.update(launch.torchrun_env(plan.max_restarts))
        if layout is None:
            argv = launch.torchrun_argv(
                python, script, args, nproc_per_node=nproc, max_restarts=plan.max_restarts,
                rdzv_endpoint="localhost:0", rdzv_id=rid,
            )  # fmt: skip
        else:
            is_master = node.label == layout.master
            argv = launch.torchrun_argv(
                python, script, args, nproc_per_node=nproc, max_restarts=plan.max_restarts,
                nnodes=wiring.nnodes or str(len(layout.ifnames)),
                rdzv_endpoint=layout.endpoint, rdzv_id=rid,
                rdzv_conf={"is_host": "true" if is_master else "false"},
                local_addr=layout.addr if is_master else _worker_addr(node, layout),
                log_dir=f"{node.env.home}/{runs.record_dir(rid)}/workers",
            )  # fmt: skip
            env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = launch.RANK_PREFIX_TEMPLATE
    else:
        argv = launch.python_argv(python, script, args)
        if plan.launcher == "env" and layout is None:
            env.update(
                launch.env_wiring(
                    node_rank=0, nnodes=1, master_addr="127.0.0.1",
                    master_port=port or launch.DEFAULT_MASTER_PORT,
                )
            )  # fmt: skip
        elif plan.launcher == "env":
            assert layout is not None
            ranked = [layout.master, *(x for x in order if x != layout.master)]
            env.update(
                launch.node_env_wiring(
                    ranked, node.label, master_addr=layout.addr, master_port=layout.port
                )
            )
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


def _layout_note(
    layout: Layout, nodes: dict[str, Node], nproc: str, launcher: str = "torchrun"
) -> str:
    ifs = ", ".join(f"{label} {i or '?'}" for label, i in layout.ifnames.items())
    if launcher == "env":  # vmrun ranks the nodes itself: the master is rank 0
        rank0 = layout.master
    else:
        rank0 = min(nodes.values(), key=lambda n: _advertised(n, layout)).label
    where = "" if rank0 == layout.master else f"; torch's c10d puts global rank 0 on {rank0}"
    return (
        f"{len(nodes)} nodes x {nproc} process(es), rendezvous at {layout.endpoint} on"
        f" {layout.master}; interfaces: {ifs}{where}"
    )


def _follow_single(node: Node, rid: str, on_line: Callable[[bytes], None], note: Note) -> int:
    conn = node.conn
    try:
        runs.follow(conn, rid, on_line, skip=node.skip)
    except (KeyboardInterrupt, Interrupted):
        raise Interrupted(
            f"detached from run {rid}; it goes on running on {node.label}",
            hint=f"reattach with `vmrun logs -f {rid}`, stop it with `vmrun stop {rid}`",
        ) from None
    except ConnectionLostError as exc:
        raise ConnectionLostError(
            f"{exc.message}; run {rid} goes on running there",
            host=node.label,
            hint=f"reattach with `vmrun logs -f {rid}`",
        ) from None
    (record,) = runs.list_runs(conn, [rid])
    if record.exit_code == 0:
        note(f"run {rid} finished on {node.label}; `vmrun fetch --run {rid}` brings its files")
        return 0
    code = record.exit_code if record.exit_code is not None else 1
    raise CommandFailed(
        f"run {rid} exited with {code}",
        host=node.label,
        exit_status=code,
        hint=f"see `vmrun logs {rid}`",
    )
