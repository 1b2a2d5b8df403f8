"""Before anything starts on the hosts: each host's interpreter and GPUs, not busy, the same
environment everywhere (several hosts), the node order and the process count. Nothing is
started anywhere unless every host passes.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from vmrun import hostside
from vmrun.backends.api import StartOptions
from vmrun.backends.hosts import records as runs
from vmrun.backends.hosts import stale
from vmrun.backends.hosts.node_launch import HostEnv, Node, Wiring
from vmrun.containers.request import table_of
from vmrun.errors import UsageError
from vmrun.remote_paths import HOST_RECORD, remote_workdir
from vmrun.reporting import Reporter
from vmrun.runs.plan import CPU_PROCESSES, Plan
from vmrun.runs.state import RunState
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry, find_entry


def host_env(conn: Connection, entry: HostEntry) -> HostEnv:
    """The interpreter to train with: vmrun.toml's `python` for the host, else setup's record."""
    return probe(conn, entry)[0]


def probe(
    conn: Connection,
    entry: HostEntry,
    checkpoints_in: str | None = None,
    *,
    in_image: bool = False,
) -> tuple[HostEnv, stale.Found | None]:
    """host_env and, with `checkpoints_in`, the checkpoint files there, in one round trip.
    `in_image`: the run's Python is the image's, so a host without setup's record will do
    (its own python3 runs vmrun's probes)."""
    argv = [*hostside.command("run_preflight.sh"), HOST_RECORD]
    if checkpoints_in is not None:
        argv += stale.listing_args(checkpoints_in)
    chunks: list[bytes] = []  # all of stdout (a long listing would not fit a tail)

    def keep(stream: str, data: bytes) -> None:
        if stream == "out":
            chunks.append(data)

    conn.run(argv, check=True, on_output=keep)
    home, b64, gpus, rest = (b"".join(chunks).split(b"\n", 3) + [b""] * 4)[:4]
    record: dict[str, Any] = {}
    if b64.strip():
        try:
            record = json.loads(base64.b64decode(b64))
        except ValueError:
            record = {}
    listed = int(gpus) if gpus.strip().isdigit() else 0
    python = str(entry.vars.get("python") or record.get("python") or "")
    python = python or ("python3" if in_image else "")
    if not python:
        raise UsageError(
            "no Python environment is recorded for this host; nothing was started",
            host=entry.label,
            hint=f'run `vmrun setup {entry.label}` first, or set python = "/path/to/python"'
            " for it in vmrun.toml",
            code="host-not-set-up",
        )
    env = HostEnv(home.decode("utf-8", "surrogateescape"), python, record, listed)
    found = None if checkpoints_in is None else stale.parse(checkpoints_in, rest)
    return env, found


def check_not_busy(
    conn: Connection,
    allow_concurrent: bool,
    resuming: str | None = None,
    listed: list[runs.RunRecord] | None = None,
) -> list[runs.RunRecord]:
    """Refuse a second run on a busy host unless allowed; return the runs going on there.
    `listed`: the host's runs when the caller has listed them already."""
    known = runs.list_runs(conn) if listed is None else listed
    busy = [r for r in known if r.state == RunState.RUNNING and r.id != resuming]
    if busy and not allow_concurrent:
        raise runs.busy_error(conn.label, busy[-1].id)
    return busy


def shared_workdir_warning(plan: Plan, busy: list[runs.RunRecord], workdir: str) -> str | None:
    """A user script runs with the project's work directory as its cwd, so two concurrent
    runs of one project write fixed names (snapshot.pt) over each other; say so."""
    if plan.is_template:
        return None  # the template writes to results/<run-id>/ only
    others = [
        r.id
        for r in busy
        if (r.record.launch.workdir or workdir) == workdir and r.record.launch.template is not True
    ]
    if not others:
        return None
    return (
        f"{', '.join(others)} also runs in ~/{workdir}, this run's working directory;"
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


def order(entries: list[HostEntry], wiring: Wiring) -> list[HostEntry]:
    """The master first (--master names one of the hosts), the others in the order given."""
    if len(entries) == 1:
        if wiring.master or wiring.nnodes:
            raise UsageError("--master and --nnodes are for several hosts; give more with -H")
        return entries
    if wiring.master is None:
        return entries
    master = find_entry(entries, wiring.master)  # matched as -H matches a host
    if master is None:
        raise UsageError(
            f"--master {wiring.master}: not one of the run's hosts"
            f" ({', '.join(e.label for e in entries)})"
        )
    return [master, *(e for e in entries if e is not master)]


def unfit_gpu(conn: Connection, entry: HostEntry) -> str:
    """What makes a GPU of the host unfit to train on (its health check's first ERROR),
    or "" (no GPU, or nothing wrong): for --recover, which puts a spare in its place."""
    from vmrun.gpus.health import ERROR, read_host
    from vmrun.gpus.targets import nvidia_smi_for

    health = read_host(conn, nvidia_smi_for(entry))
    return health.lines(ERROR)[0] if health.worst == ERROR else ""


def check_gpu_health(conn: Connection, entry: HostEntry, gpus: int, out: Reporter) -> None:
    """A host with GPUs (or a `nvidia_smi` named for it) is refused when a GPU is unfit to
    train on (ECC errors since the driver loaded, a pending page retirement or row
    remapping, an Xid that needs a reset); what only slows it (clocks held down, a narrow
    PCIe link) is said."""
    if not gpus and not entry.vars.get("nvidia_smi"):
        return
    from vmrun.gpus.health import ERROR, WARN, read_host
    from vmrun.gpus.targets import nvidia_smi_for

    health = read_host(conn, nvidia_smi_for(entry))
    if health.worst == ERROR:
        said = health.lines(ERROR)
        more = ""
        if len(said) > 1:
            more = f" (and {len(said) - 1} more: `vmrun doctor -H {entry.label}`)"
        raise UsageError(
            f"{said[0]}{more}; nothing was started",
            host=entry.label,
            hint="fix or reset that GPU, leave the host out, or start anyway with"
            " --ignore-gpu-health",
            code="gpu-unhealthy",
        )
    for line in health.lines(WARN):
        out.warn(f"{entry.label}: {line}")


def preflight(
    group: Group,
    plan: Plan,
    out: Reporter,
    *,
    multi: bool,
    how: StartOptions,
    listed: dict[str, list[runs.RunRecord]] | None,
    only: set[str],
) -> dict[str, Node]:
    """On every host at once: its interpreter, not busy (or a warning where a concurrent run
    shares the work directory), (several hosts) its network and torch facts, and (a new
    multi-node run, or --fresh) the checkpoint files an earlier run left where this one will
    look. Nothing is started anywhere unless every host passes; --fresh then moves those
    files aside."""
    workdir = remote_workdir(plan.project)
    listing = (multi or how.fresh) and not how.resume
    where = stale.look_in(plan, workdir) if listing else None

    def check(entry: HostEntry, conn: Connection) -> tuple[Node, stale.Found | None]:
        request = plan.containers.resolve(table_of(entry.vars))
        env, found = probe(conn, entry, where, in_image=request is not None)
        known = None if listed is None else listed.get(entry.label, [])
        busy = check_not_busy(conn, how.allow_concurrent, how.resume, known)
        warning = shared_workdir_warning(plan, busy, workdir)
        if warning:
            out.warn(f"{entry.label}: {warning}")
        node = Node(entry, conn, env)
        if not how.ignore_gpu_health:
            check_gpu_health(conn, entry, env.gpus, out)
        if request is not None:
            from vmrun.backends.hosts.images import probe as probe_image

            node.image = probe_image(conn, request)
        if multi:
            from vmrun.backends.hosts.probes import gather_facts

            node.facts = gather_facts(conn, env.python, versions=True)
            if node.facts.data.get("torch") is None and node.image is None:
                raise UsageError(
                    f"torch is not importable by {env.python}"
                    f" ({node.facts.data.get('torch_error')}); nothing was started",
                    host=entry.label,
                    hint=f"run `vmrun setup {entry.label}`",
                    code="torch-missing",
                )
            check_numpy(plan, node)
        return node, found

    outcomes = group.map(check, only=only)
    raise_for_failures(outcomes, one_as_itself=True)
    nodes = {o.host: o.value[0] for o in outcomes if o.value is not None}
    found = {o.host: o.value[1] for o in outcomes if o.value is not None and o.value[1]}
    if multi:
        check_same_env(nodes)
    if how.fresh and where is None and not how.resume:
        out.info(
            "--fresh: the template writes to results/<run-id>/, new for this run: nothing to"
            " move aside"
        )
    elif found and how.fresh:
        stale.move_aside(group, found, out)
    elif found and multi:
        stale.check_same(group, found)
    return nodes


def check_numpy(plan: Plan, node: Node) -> None:
    """The template's --fsdp over several nodes saves through torch.distributed.checkpoint,
    which needs numpy on every node: refused before the start, not at the first checkpoint
    (a host whose facts do not say, or an image's Python, is not judged)."""
    assert node.facts is not None
    fsdp = plan.is_template and "--fsdp" in plan.args
    if not fsdp or node.image is not None or node.facts.data.get("numpy") is not False:
        return
    raise UsageError(
        f"--fsdp: numpy is not importable by {node.env.python} (torch.distributed.checkpoint"
        " needs it to save over several ranks); nothing was started",
        host=node.entry.label,
        hint=f"run `vmrun setup {node.entry.label}` (it installs numpy), or pip install numpy"
        " into that Python",
        code="numpy-missing",
    )


def check_same_env(nodes: dict[str, Node]) -> None:
    """The same Python (major.minor: the ABI, pickles) and torch build on every node, or
    nothing starts (say which differ)."""
    for key, what in (("python", "Python"), ("torch", "torch")):
        seen: dict[str, list[str]] = {}
        for label, node in nodes.items():
            assert node.facts is not None
            value = str(node.facts.data.get(key))
            if node.image is not None:  # the image's, the same where the images are
                value = "the image's"
            if key == "python":
                value = ".".join(value.split(".")[:2])
            seen.setdefault(value, []).append(label)
        if len(seen) > 1:
            which = "; ".join(f"{v} on {', '.join(hosts)}" for v, hosts in seen.items())
            raise UsageError(
                f"the hosts run different {what} versions ({which}); nothing was started",
                hint="install the same one everywhere (`vmrun setup` with the same --torch)",
                code="hosts-differ",
            )


def nproc_for(plan: Plan, nodes: list[Node]) -> str:
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
            code="hosts-differ",
        )
    return "gpu" if next(iter(counts.values())) else str(CPU_PROCESSES)


def _gpus(node: Node) -> int:
    if node.facts is not None:
        return int(node.facts.data.get("gpus") or 0)
    return node.env.gpus


_CUDA = re.compile(rb"\bcuda\b|\.cuda\(|\bnccl\b", re.IGNORECASE)


def cuda_warning(plan: Plan, nodes: list[Node]) -> str | None:
    """A script that names CUDA or nccl, about to run where no node has a GPU, fails with raw
    CUDA tracebacks; say so before it starts (it may still fall back to the CPU itself)."""
    if plan.is_template or any(_gpus(n) for n in nodes):
        return None
    try:
        text = plan.script.read_bytes()
    except OSError:
        return None
    if not _CUDA.search(text):
        return None
    where = ", ".join(n.label for n in nodes)
    verb = "has" if len(nodes) == 1 else "have"
    return (
        f"{plan.script.name} uses CUDA/nccl but {where} {verb} no GPU (gpus=0);"
        " unless it falls back to the CPU (gloo) it will fail: run it on a GPU host, or make"
        " it choose `cuda` only when torch.cuda.is_available()"
    )
