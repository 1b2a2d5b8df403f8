"""`vmrun doctor`: preflight of the hosts for (multi-node) training, one verdict per check.

Per host, in one pass: SSH (round-trip time), the interpreter and its torch/CUDA/NCCL, GPUs,
free disk in the project's work directory, and the clock against this machine's. Across the
hosts: the same versions everywhere, every pair of hosts reaching each other on the
rendezvous port (a real TCP connection each way, answered with a nonce), the rendezvous
address `vmrun train` would use, and a short all-reduce over every process of every node
(nccl on GPUs, gloo on CPUs) with its bus bandwidth. Network probes need only a Python on
the host (`python3` when vmrun has recorded none), so doctor also helps before setup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmrun.backends.api import RunRef
from vmrun.backends.hosts.backend import HostsBackend
from vmrun.backends.hosts.netfacts import Layout, NodeFacts
from vmrun.backends.hosts.node_launch import HostEnv
from vmrun.compat import StrEnum
from vmrun.config import Settings
from vmrun.errors import UsageError, VmrunError
from vmrun.reporting import QUIET, Recorder
from vmrun.runs.state import RunState
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry, find_entry

DISK_WARN = 10 << 30
DISK_FAIL = 1 << 30
CLOCK_WARN_S = 2.0
ALLREDUCE_TIMEOUT_S = float(os.environ.get("VMRUN_DOCTOR_ALLREDUCE_TIMEOUT", "300"))


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"  # not run: an earlier failure, or a run is active


@dataclass(frozen=True)
class Check:
    name: (
        str  # ssh, python, versions, gpus, disk, clock, relay, data, network, rendezvous, allreduce
    )
    where: str  # a host, "a -> b", or "all"
    verdict: Verdict
    detail: str


@dataclass
class _Host:
    entry: HostEntry
    rtt_ms: float = 0.0
    python: str = ""
    recorded: bool = False
    skew_s: float = 0.0
    facts: NodeFacts | None = None
    busy: list[str] = field(default_factory=list)
    env: HostEnv | None = None
    image: Any = None  # the run's container (a NodeImage), where it trains in an image
    image_error: str = ""
    health: Any = None  # its GPUs' health (a vmrun.gpus.health.HostHealth)


def _inspect(entry: HostEntry, conn: Connection, workdir: str, asked: Any = None) -> _Host:
    """One host's facts in four round trips: RTT, its environment record, the host probe
    (versions, disk, clock) and its runs. The clock is the probe's, taken after its
    imports, against this machine's clock half a round trip before the answer arrived."""
    from vmrun.backends.hosts import records as runs
    from vmrun.backends.hosts.preflight import probe
    from vmrun.backends.hosts.probes import gather_facts
    from vmrun.containers.request import table_of
    from vmrun.transfer.streams import measure_rtt

    host = _Host(entry)
    rtt = measure_rtt(conn)
    host.rtt_ms = rtt * 1000
    request = asked.resolve(table_of(entry.vars)) if asked is not None else None
    try:
        host.env = probe(conn, entry, in_image=request is not None)[0]
        host.python, host.recorded = host.env.python, request is None
    except UsageError:
        host.python = "python3"
    if request is not None:
        from vmrun.backends.hosts.images import probe as probe_image

        try:
            host.image = probe_image(conn, request)
        except VmrunError as exc:
            host.image_error = exc.message
    host.facts = gather_facts(conn, host.python, versions=host.recorded, disk=workdir)
    arrived = time.time()
    clock = host.facts.data.get("time")
    host.skew_s = float(clock) - (arrived - rtt / 2) if isinstance(clock, (int, float)) else 0.0
    host.busy = [r.id for r in runs.list_runs(conn) if r.state == RunState.RUNNING]
    from vmrun.gpus.health import read_host
    from vmrun.gpus.targets import nvidia_smi_for

    host.health = read_host(conn, nvidia_smi_for(entry))
    return host


def _host_checks(host: _Host) -> list[Check]:
    label = host.entry.label
    facts = host.facts
    assert facts is not None
    data = facts.data
    checks = [Check("ssh", label, Verdict.OK, f"round trip {host.rtt_ms:.1f} ms")]
    if host.image is not None or host.image_error:
        checks += _image_checks(host)
    elif not host.recorded:
        checks.append(
            Check(
                "python", label, Verdict.FAIL, f"no interpreter recorded; run `vmrun setup {label}`"
            )
        )
    elif data.get("torch") is None:
        checks.append(
            Check(
                "python",
                label,
                Verdict.FAIL,
                f"{host.python}: torch not importable ({data.get('torch_error')})",
            )
        )
    else:
        checks.append(
            Check(
                "python",
                label,
                Verdict.OK,
                f"{host.python}: Python {data.get('python')}, torch {data.get('torch')}, CUDA"
                f" {data.get('cuda') or '-'}, NCCL {data.get('nccl') or '-'}",
            )
        )
        names = data.get("gpu_names") or []
        gpus = f"{len(names)} x {names[0]}" if names else "none: CPU processes, gloo"
        checks.append(Check("gpus", label, Verdict.OK, gpus))
    health = host.health
    if health is not None and (health.gpus or health.smi != "none"):
        checks.append(gpu_health_check(label, health))
    free = data.get("disk_free")
    if isinstance(free, int):
        verdict = (
            Verdict.OK if free >= DISK_WARN else Verdict.WARN if free >= DISK_FAIL else Verdict.FAIL
        )
        checks.append(
            Check("disk", label, verdict, f"{free / 2**30:.1f} GiB free for the work directory")
        )
    ahead = "ahead of" if host.skew_s > 0 else "behind"
    verdict = Verdict.OK if abs(host.skew_s) <= CLOCK_WARN_S else Verdict.WARN
    checks.append(Check("clock", label, verdict, f"{abs(host.skew_s):.2f} s {ahead} this machine"))
    return checks


def gpu_health_check(label: str, health: Any) -> Check:
    """ECC, retired pages, remapped rows, Xids, clocks held down, a narrow PCIe link: FAIL
    for what makes the GPU unfit to train on, WARN for what slows it; the worst first."""
    from vmrun.gpus.health import ERROR, WARN

    worst, said = health.worst, health.lines()
    unread = (
        ""
        if health.kernel != "unreadable"
        else "; the kernel log is not readable here: Xids not checked"
    )
    if worst in (ERROR, WARN):
        more = f" (and {len(said) - 3} more)" if len(said) > 3 else ""
        verdict = Verdict.FAIL if worst == ERROR else Verdict.WARN
        return Check("gpu-health", label, verdict, "; ".join(said[:3]) + more + unread)
    return Check(
        "gpu-health",
        label,
        Verdict.OK,
        f"{len(health.gpus)} GPU(s): no ECC, page, row, Xid, clock or PCIe problem" + unread,
    )


def _image_checks(host: _Host) -> list[Check]:
    """A run in an image: its runtime and mounts instead of the host's Python and torch."""
    label = host.entry.label
    if host.image is None:
        return [Check("image", label, Verdict.FAIL, host.image_error)]
    image = host.image
    gpus = host.env.gpus if host.env is not None else 0
    return [
        Check(
            "image",
            label,
            Verdict.OK,
            f"{image.request.image} with {image.runtime.name} (its Python and torch run)",
        ),
        Check(
            "gpus",
            label,
            Verdict.OK,
            f"{gpus} (nvidia-smi)" if gpus else "none: CPU processes, gloo",
        ),
    ]


def python_series(version: str) -> str:
    """major.minor of a Python version: what must agree across nodes (the ABI, pickles), as
    `vmrun train` requires (vmrun.backends.hosts.preflight.check_same_env); a patch level
    may differ."""
    return ".".join(version.split(".")[:2])


def _same_versions(hosts: Sequence[_Host]) -> list[Check]:
    """Versions compared across the hosts: a different Python major.minor, torch, CUDA or
    NCCL fails (train refuses the first two); a Python patch-level difference only warns."""
    ready = [h for h in hosts if h.recorded and h.facts and h.facts.data.get("torch")]
    if len(ready) < 2:
        return []
    checks = []
    for key, what in (("python", "Python"), ("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL")):
        seen: dict[str, list[str]] = {}
        for h in ready:
            assert h.facts is not None
            seen.setdefault(str(h.facts.data.get(key) or "-"), []).append(h.entry.label)
        if len(seen) > 1:
            which = "; ".join(f"{v} on {', '.join(labels)}" for v, labels in seen.items())
            patch_only = key == "python" and len({python_series(v) for v in seen}) == 1
            if patch_only:
                checks.append(
                    Check("versions", "all", Verdict.WARN, f"{what} patch level differs: {which}")
                )
            else:
                checks.append(Check("versions", "all", Verdict.FAIL, f"{what} differs: {which}"))
    counts = {h.entry.label: len(h.facts.data.get("gpu_names") or []) for h in ready if h.facts}
    if len(set(counts.values())) > 1:
        which = ", ".join(f"{label} {n}" for label, n in counts.items())
        checks.append(
            Check(
                "gpus",
                "all",
                Verdict.WARN,
                f"different GPU counts ({which}): pass --nproc-per-node to train on all",
            )
        )
    if not any(c.name == "versions" for c in checks):
        data = ready[0].facts.data if ready[0].facts else {}
        checks.append(
            Check(
                "versions",
                "all",
                Verdict.OK,
                f"the same everywhere: Python {data.get('python')}, torch {data.get('torch')}",
            )
        )
    return checks


def diagnose(
    entries: Sequence[HostEntry],
    settings: Settings,
    *,
    project: Any,
    master: str | None = None,
    rdzv_port: int | None = None,
    allreduce: bool = True,
    size_mib: float | None = None,
    data: Sequence[str] = (),
    on_check: Callable[[Check], None] = lambda check: None,
) -> list[Check]:
    """Every check, in order; `on_check` sees each as soon as it is known. One connection
    per host serves every check, the all-reduce run and its clean-up."""
    from vmrun.remote_paths import remote_workdir

    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        on_check(check)

    from vmrun.containers.request import asked_from

    workdir = remote_workdir(project)
    ordered = _master_first(list(entries), master)
    asked = asked_from(None, None, settings)
    with Group(ordered, settings) as group:
        outcomes = group.map(lambda entry, conn: _inspect(entry, conn, workdir, asked))
        hosts = []
        for outcome in outcomes:
            if outcome.error is not None:
                message = getattr(outcome.error, "message", str(outcome.error))
                add(Check("ssh", outcome.host, Verdict.FAIL, message))
            else:
                assert outcome.value is not None
                hosts.append(outcome.value)
                for check in _host_checks(outcome.value):
                    add(check)
        for check in _same_versions(hosts):
            add(check)
        for check in _stale_relay_keys(group, hosts):
            add(check)
        for folder in data:
            add(_same_data(group, hosts, folder, workdir))
        layout = _network(group, hosts, rdzv_port, add) if len(hosts) >= 2 else None
        if allreduce:
            add(_allreduce(group, ordered, hosts, checks, size_mib, layout))
    return checks


def _stale_relay_keys(group: Group, hosts: Sequence[_Host]) -> list[Check]:
    """A host-to-host key a killed `vmrun push` left in authorized_keys: removed, and said."""
    from vmrun.transfer.relay import remove_stale_relay_keys

    found = group.map(
        lambda entry, conn: remove_stale_relay_keys(conn), only={h.entry.label for h in hosts}
    )
    return [
        Check(
            "relay",
            o.host,
            Verdict.WARN,
            f"removed {o.value} host-to-host key(s) a killed push left in authorized_keys",
        )
        for o in found
        if o.value
    ]


def _same_data(group: Group, hosts: Sequence[_Host], folder: str, workdir: str) -> Check:
    """Every host holds the same `folder` (what `vmrun push` / `train --data` put there):
    its manifest, each file's path, size and mtime, compared across the hosts."""
    from vmrun.transfer.manifest import normalize_remote
    from vmrun.transfer.push import manifest

    remote = normalize_remote(folder, base=workdir, where="the project's work directory")
    labels = [h.entry.label for h in hosts]
    found = group.map(lambda entry, conn: manifest(conn, remote), only=set(labels))
    digests = {o.host: (o.value or "") if o.error is None else "" for o in found}
    missing = [host for host, digest in digests.items() if not digest]
    if missing:
        return Check(
            "data", "all", Verdict.FAIL, f"{folder}: not on {', '.join(missing)} (`vmrun push` it)"
        )
    if len(set(digests.values())) > 1:
        shown = ", ".join(f"{host} {digest[:8]}" for host, digest in digests.items())
        return Check(
            "data",
            "all",
            Verdict.FAIL,
            f"{folder} differs: {shown} (`vmrun push` it again: only what differs travels)",
        )
    return Check("data", "all", Verdict.OK, f"{folder}: the same on {len(digests)} host(s)")


def _master_first(ordered: list[HostEntry], master: str | None) -> list[HostEntry]:
    if master is None:
        return ordered
    found = find_entry(ordered, master)  # matched as -H and `vmrun train --master` match
    if found is None:
        raise UsageError(  # as `vmrun train --master` does: checking another host misleads
            f"--master {master}: not one of the hosts ({', '.join(e.label for e in ordered)})"
        )
    return [found, *(e for e in ordered if e is not found)]


def _network(
    group: Group, hosts: Sequence[_Host], rdzv_port: int | None, add: Callable[[Check], None]
) -> Layout | None:
    """Every ordered pair of hosts connecting on the rendezvous port, then the rendezvous
    address `vmrun train` would use (returned for the all-reduce run)."""
    from vmrun.backends.hosts import rendezvous

    pythons = {h.entry.label: h.python for h in hosts}
    facts = {h.entry.label: h.facts for h in hosts if h.facts}
    overrides = {h.entry.label: str(h.entry.vars.get("private_addr") or "") for h in hosts}
    try:
        pairs = rendezvous.mesh(group, pythons, facts, port=rdzv_port, override_addrs=overrides)
    except VmrunError as exc:
        add(Check("network", "all", Verdict.FAIL, exc.one_line()))
    else:
        bad = [p for p in pairs if not p.ok]
        for p in bad:
            add(Check("network", f"{p.src} -> {p.dst}", Verdict.FAIL, f"cannot connect: {p.via}"))
        if not bad:
            port = pairs[0].via.rpartition(":")[2] if pairs else "?"
            add(
                Check(
                    "network",
                    "all",
                    Verdict.OK,
                    f"all {len(pairs)} host pairs connect on port {port}",
                )
            )
    master_label = hosts[0].entry.label
    try:
        layout = rendezvous.decide(
            group,
            pythons,
            facts,
            master_label,
            port=rdzv_port,
            override_addr=overrides.get(master_label, ""),
        )
    except VmrunError as exc:
        add(Check("rendezvous", master_label, Verdict.FAIL, exc.message))
        return None
    ifs = ", ".join(f"{k} {v or '?'}" for k, v in layout.ifnames.items())
    detail = f"{layout.endpoint}, reached by every host; interfaces: {ifs}"
    add(Check("rendezvous", master_label, Verdict.OK, detail))
    return layout


def _allreduce(
    group: Group,
    entries: Sequence[HostEntry],
    hosts: Sequence[_Host],
    checks: Sequence[Check],
    size_mib: float | None,
    layout: Layout | None,
) -> Check:
    """A short all-reduce over every node, launched as `vmrun train` would, on the checks'
    own connections and facts (no second preflight); bounded by ALLREDUCE_TIMEOUT_S."""
    where = "all" if len(entries) > 1 else entries[0].label
    if any(c.verdict == Verdict.FAIL for c in checks) or len(hosts) < len(entries):
        return Check("allreduce", where, Verdict.SKIP, "fix the failures above first")
    busy = [f"{h.entry.label} ({', '.join(h.busy)})" for h in hosts if h.busy]
    if busy:
        return Check("allreduce", where, Verdict.SKIP, f"a run is active on {'; '.join(busy)}")
    from vmrun.backends.api import StartOptions
    from vmrun.backends.hosts.node_launch import Node, Placement, Wiring
    from vmrun.runs import launch
    from vmrun.runs.plan import make_plan
    from vmrun.trainer import ALLREDUCE_PATH

    plan = make_plan(
        script=str(ALLREDUCE_PATH),
        user_args=["--size-mib", str(size_mib or 0)],
        epochs=None,
        save_every=None,
        nproc_per_node=None,
        max_restarts=0,
        env=None,
        name="doctor-allreduce",
        batch_size=None,
        lr=None,
        launcher="torchrun",
    )
    checked = {
        h.entry.label: Node(
            h.entry, group.connections[h.entry.label], h.env, h.facts, image=h.image
        )
        for h in hosts
        if h.env is not None
    }
    how = StartOptions(allow_concurrent=True, run_id=launch.run_id(plan.name))
    place = Placement(
        wiring=Wiring(master=entries[0].label if len(entries) > 1 else None),
        nodes=checked,
        layout=layout,
    )
    shown = Recorder()  # the run's lines, for its verdict (or the last of them, if it failed)
    try:
        backend = HostsBackend(group, entries, place)
        ref = backend.start(plan, how, QUIET)
        verdict, detail = _await_allreduce(backend, ref, shown)
    except VmrunError as exc:
        tail = [ln for ln in _text(shown).splitlines() if ln.strip()][-3:]
        verdict = Verdict.FAIL
        detail = exc.message + (f" (last lines: {' | '.join(tail)})" if tail else "")
    finally:
        _forget_run(group, entries, how.run_id or "")
    return Check("allreduce", where, verdict, detail)


def _text(shown: Recorder) -> str:
    return shown.data.decode("utf-8", "replace")


def _await_allreduce(backend: HostsBackend, ref: RunRef, shown: Recorder) -> tuple[Verdict, str]:
    """Follow the all-reduce run to its end, or stop it at the deadline (a hung collective
    must not hang doctor): (verdict, detail)."""
    import threading

    failure: list[BaseException] = []

    def follow() -> None:
        try:
            backend.follow(ref, shown)
        except BaseException as exc:  # reported below, never lost
            failure.append(exc)

    follower = threading.Thread(target=follow, daemon=True, name="vmrun-doctor-allreduce")
    follower.start()
    follower.join(ALLREDUCE_TIMEOUT_S)
    if follower.is_alive():
        backend.stop(ref, grace=5)
        follower.join(30)
        return Verdict.FAIL, f"no result within {ALLREDUCE_TIMEOUT_S:g} s; the run was stopped"
    if failure:
        raise failure[0]
    for line in _text(shown).splitlines():
        if "allreduce:" in line:
            return Verdict.OK, line.split("allreduce:", 1)[1].strip()
    return Verdict.FAIL, "the all-reduce printed no result"


def _forget_run(group: Group, entries: Sequence[HostEntry], rid: str) -> None:
    """Doctor's own run record goes: `vmrun status` and `fetch` should not see it."""
    from vmrun.backends.hosts import records as runs

    if rid:
        only = {e.label for e in entries}
        group.map(
            lambda entry, conn: conn.run(["rm", "-rf", "--", runs.record_dir(rid)]), only=only
        )
