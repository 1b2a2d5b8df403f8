"""A run's supervisor (`vmrun supervise`, started by `train --recover` on its host): it
follows the run; when the run fails it finds which nodes still answer, decides
(vmrun.recovery.policy) and resumes the run (`train --resume`, the lost nodes replaced by
spares, the outputs from the run's bucket when the master is gone), again and again within
the limits; when the run ends, either way, it takes its key off the hosts and stops. What
it is asked and what it did are in its folder (vmrun.recovery.journal)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vmrun.config import Settings
from vmrun.errors import UsageError, VmrunError
from vmrun.recovery.journal import TAG, Event, Journal, Spec, failures_of
from vmrun.recovery.policy import Failure, Recovery, decide
from vmrun.reporting import Reporter


def supervise(state: Path, settings: Settings, out: Reporter, run_id: str = "") -> int:
    """Follow and recover the run described in `state` until it ends; 0 when it finished,
    1 when it was given up."""
    spec = Spec.load(state / "spec.json")
    if run_id and run_id != spec.run_id:
        raise UsageError(f"{state} supervises run {spec.run_id}, not {run_id}")
    if spec.workdir:  # the hosts' folder is the laptop project's, not this copy's
        os.environ["VMRUN_HOST_WORKDIR"] = spec.workdir
    _mark_pid(state)
    if _load_secrets(state / "secrets.env"):  # the bucket's keys, where runs are told
        from vmrun.config import load_settings

        settings = load_settings({})
    journal = Journal(state / "events.jsonl")
    events = journal.events()
    nodes = list(events[-1].nodes) if events else list(spec.nodes)
    if events and events[-1].action == "give-up":
        out.info(f"run {spec.run_id}: given up already ({events[-1].why})")
        return _finish(state, spec, settings, nodes, out, 1)
    out.info(
        f"supervising run {spec.run_id} on {', '.join(nodes)}"
        f" (spares: {', '.join(spec.spares) or 'none'})"
    )
    while True:
        retired = [n for e in events for n in e.swap if n not in nodes]  # replaced: may return
        failure = _follow(spec.run_id, nodes, settings, out, retired)
        if failure is not None and failure.running:  # the streams alone were lost (this
            # host's own network): nothing failed, nothing to count
            out.info(f"run {spec.run_id}: it still runs on every node; following it again")
            time.sleep(settings.keepalive_interval)
            continue
        if failure is None:
            out.info(f"run {spec.run_id} finished")
            return _finish(state, spec, settings, nodes, out, 0)
        if failure.stopped:  # the user's own `vmrun stop`: the run is meant to end
            out.info(f"run {spec.run_id} was stopped (vmrun stop): nothing to bring back")
            return _finish(state, spec, settings, nodes, out, 0)
        recovery = _decide(spec, journal, events, failure, nodes)
        if recovery.gives_up:
            return _give_up(state, spec, settings, nodes, out, recovery.why)
        said = f"recovery {len(events)} of {spec.max_recoveries}: {recovery.why}"
        out.info(f"run {spec.run_id}: {said}")
        under_way = f"{len(events)} of {spec.max_recoveries}: {recovery.why}"
        answering = [n for n in dict.fromkeys([*nodes, *recovery.nodes]) if n not in failure.lost]
        _note(spec.run_id, answering, settings, "recovering", under_way)
        step = _bring_back(state, spec, nodes, recovery, settings, out)
        if step.why_not:  # refused outright: no next round can do better
            return _give_up(state, spec, settings, nodes, out, step.why_not)
        nodes, settings = step.nodes, step.settings
        if step.failed:
            continue
        facts = {**_facts(failure, recovery), "new_vm_s": step.renewed}
        said += _cost(facts)
        _note(spec.run_id, nodes, settings, "recovery", said, facts)
        _tell(settings, spec.run_id, "requeue", f"recovered ({said})", nodes, out)


@dataclass
class _Step:
    """How one recovery went: the nodes and settings after it; `failed` (the next round
    finds what is still lost, and counts it), or `why_not` (refused: give up)."""

    nodes: list[str]
    settings: Settings
    failed: bool = False
    why_not: str = ""
    renewed: float | None = None  # seconds the new VMs took


def _bring_back(
    state: Path,
    spec: Spec,
    nodes: list[str],
    recovery: Recovery,
    settings: Settings,
    out: Reporter,
) -> _Step:
    """New VMs where decided, then the resume."""
    try:
        _confirm_lost(spec, recovery.renew, settings)
        began = time.time()
        settings = _renew(state, spec, recovery, settings, out)
        renewed = round(time.time() - began, 1) if recovery.renew else None
        return _Step(_resume(spec, nodes, recovery, settings, out), settings, renewed=renewed)
    except UsageError as exc:
        if exc.code == "run-still-running":  # a follow that lost its connection alone
            out.info(f"run {spec.run_id}: it still runs on every node; following it again")
            return _Step(nodes, settings, failed=True)
        return _Step(nodes, settings, why_not=f"its resume was refused ({exc.one_line()})")
    except VmrunError as exc:  # a spare that failed too
        out.warn(f"run {spec.run_id}: the recovery failed: {exc.one_line()}")
        if recovery.renew:  # a new VM may be recorded (with its address) already
            from vmrun.config import load_settings

            settings = load_settings({})
        return _Step(list(recovery.nodes or nodes), settings, failed=True)


def _decide(
    spec: Spec, journal: Journal, events: list[Event], failure: Failure, nodes: list[str]
) -> Recovery:
    """The policy's answer to this failure, kept in the journal (and `events`)."""
    used = {n for e in events for n in e.nodes} | set(spec.nodes)
    spares = [s for s in spec.spares if s not in used]
    recovery = decide(
        failure,
        failures_of(events),
        spares,
        max_recoveries=spec.max_recoveries,
        has_store=bool(spec.store),
        renewable=spec.renewable,
    )
    event = Event(
        time.time(),
        _as_dict(failure),
        recovery.action,
        recovery.why,
        list(recovery.nodes or nodes),
        dict(recovery.swap),
    )
    journal.add(event)
    events.append(event)
    return recovery


def _renew(
    state: Path, spec: Spec, recovery: Recovery, settings: Settings, out: Reporter
) -> Settings:
    """A new VM of the cluster's spec in each renewed node's place (vmrun.operations.cloud:
    the same name, type, image and pinned host key, this supervisor's key allowed on it),
    set up as the cluster's `vmrun setup` recorded; the settings read again, the node's
    address being new. A failure raises: the next round finds the node lost again and
    counts it."""
    if not recovery.renew:
        return settings
    from vmrun.config import load_settings
    from vmrun.operations import cloud

    key = (state / "id_ed25519.pub").read_text().strip()
    for label in recovery.renew:
        with _cloud_credentials():
            made = cloud.replace_node(settings, spec.cluster, label, out, extra_keys=(key,))
        out.info(
            f"run {spec.run_id}: {label} is a new VM now ({made.new_instance},"
            f" {made.address}; {made.old_instance or 'the lost one'} terminated)"
        )
        settings = load_settings({})
        try:
            _set_up(settings, spec, label, out)
        except VmrunError:  # not left billing half set up: the next round makes another
            table = cloud.table_for(settings, spec.cluster)
            with _cloud_credentials(), contextlib.suppress(VmrunError):
                provider = cloud.provider_for(str(table.get("cloud") or "aws"), "")
                provider.terminate_ids(str(table.get("region") or ""), [made.new_instance])
            raise
    return settings


CONFIRM_S = 15.0  # a node to be replaced by a new VM is asked once more after this long


def _confirm_lost(spec: Spec, labels: tuple[str, ...], settings: Settings) -> None:
    """A VM is terminated only when it is lost for sure: asked again after a pause, one
    that answers now (a network hiccup, sshd busy) is followed again, not replaced."""
    if not labels:
        return
    from vmrun.errors import RemoteError
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    time.sleep(float(os.environ.get("VMRUN_RENEW_CONFIRM_S") or CONFIRM_S))
    with Group(select_hosts(list(labels), settings), settings) as group:
        back = [o.host for o in group.map(lambda e, conn: conn.run(["true"], timeout=15)) if o.ok]
    if back:
        raise RemoteError(
            f"{', '.join(back)} answer again: not replaced", host=back[0], code="supervisor-failed"
        )


@contextlib.contextmanager
def _cloud_credentials() -> Iterator[None]:
    """The AWS variables as the cloud's credentials say (VMRUN_CLOUD_AWS_*, sent by the
    deploy), not the bucket's, while a VM is made; as they were after."""
    from vmrun.recovery.deploy import CLOUD_PREFIX

    names = (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_EC2",
    )
    kept = {n: os.environ.get(n) for n in names}
    try:
        for name in names:
            os.environ.pop(name, None)
            if value := os.environ.get(CLOUD_PREFIX + name):
                os.environ[name] = value
        yield
    finally:
        for name, value in kept.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def _set_up(settings: Settings, spec: Spec, label: str, out: Reporter) -> None:
    """The new VM set up as the cluster's hosts were (their recorded request)."""
    from vmrun.errors import RemoteError
    from vmrun.operations import setup as setting_up
    from vmrun.operations.cloud import table_for

    recorded = table_for(settings, spec.cluster).get("setup")
    if not isinstance(recorded, dict):
        out.warn(
            f"run {spec.run_id}: no setup recorded for {spec.cluster}: {label} is used as it booted"
        )
        return
    as_recorded = replace(settings, store="")  # the record says the mover, if it was added
    done = setting_up.setup(as_recorded, setting_up.replay(recorded), [label], out=out)
    if not done.succeeded:
        why = next(
            (
                e.one_line() if isinstance(e, VmrunError) else str(e)
                for o in done.outcomes
                if (e := o.error) is not None
            ),
            "",
        )
        raise RemoteError(
            f"the setup of the new VM {label} failed: {why}", host=label, code="supervisor-failed"
        )


def _give_up(
    state: Path, spec: Spec, settings: Settings, nodes: list[str], out: Reporter, why: str
) -> int:
    """One line in the run's log and one notification saying why; then the end."""
    out.warn(f"run {spec.run_id}: gave up: {why}")
    said = f"the supervisor gave up: {why}"
    _note(spec.run_id, nodes, settings, "gave-up", said)
    _tell(settings, spec.run_id, "fail", f"failed: {said}", nodes, out)
    return _finish(state, spec, settings, nodes, out, 1)


def _follow(
    rid: str, nodes: list[str], settings: Settings, out: Reporter, retired: Sequence[str] = ()
) -> Failure | None:
    """Follow the run to its end on `nodes`: None when it finished well, else how it
    failed (which nodes do not answer, its exit code, the newest snapshot's epoch). Every
    node is followed, and asked on a connection of its own all along (vmrun.recovery.
    heartbeat): a node silent for the connections' keepalive rule is lost, whatever its
    log stream does; a `retired` node (one an earlier recovery replaced) that answers again
    has its replaced attempt stopped."""
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(nodes, settings)
    gone = select_hosts(list(dict.fromkeys(retired)), settings) if retired else []
    with Group(entries, settings) as group, _heartbeat(entries, settings, group, rid, out, gone):
        backend = HostsBackend(group, entries)
        try:
            ref = _found_everywhere(backend, rid, nodes, settings)
            backend.follow(ref, out, announce=False)
            return None
        except VmrunError as exc:
            out.info(f"run {rid}: {exc.one_line()}")
            from vmrun.backends.hosts.nodes import SILENT

            silent = exc.host if SILENT in exc.message and exc.host in nodes else ""
    return _failure(rid, nodes, settings, silent)


def _found_everywhere(backend: Any, rid: str, nodes: list[str], settings: Settings) -> Any:
    """The run as every one of its nodes records it, asked again for as long as a node may
    be silent before it counts as lost: a node not followed would be a loss nobody sees."""
    from vmrun.errors import RemoteError

    deadline = time.monotonic() + _silent_s(settings)
    while True:
        ref = backend.find(rid)
        missing = [n for n in nodes if n not in ref.nodes]
        if not missing:
            return ref
        if time.monotonic() >= deadline:
            why = "did not answer" if set(missing) & set(ref.unreached) else "has no record of it"
            raise RemoteError(
                f"{', '.join(missing)} {why}", host=missing[0], code="supervisor-failed"
            )
        time.sleep(settings.keepalive_interval)


def _silent_s(settings: Settings) -> float:
    """How long a node may be silent before it is lost: every connection's own rule."""
    return settings.keepalive_interval * settings.keepalive_count_max


@contextlib.contextmanager
def _heartbeat(
    entries: list[Any],
    settings: Settings,
    group: Any,
    rid: str,
    out: Reporter,
    retired: list[Any],
) -> Iterator[None]:
    """Each node asked `true` on a connection of its own every keepalive_interval; one
    silent past the keepalive rule has its log stream closed with the reason, so the
    follow's failure rule takes it as lost. A retired node that answers again has the
    run's replaced attempt stopped there (`replaced`: it uploads nothing more either)."""
    from vmrun.recovery.heartbeat import Heartbeat
    from vmrun.ssh.connection import Connection

    conns: dict[str, Connection] = {}
    lock = threading.Lock()
    ended = threading.Event()

    def ask(node: str, timeout: float) -> None:
        entry = next(e for e in [*entries, *retired] if e.label == node)
        with lock:
            if ended.is_set():
                raise RuntimeError("the follow ended")
            conn = conns.get(node) or conns.setdefault(
                node, Connection(entry.spec, settings, label=node)
            )
        conn.ping(timeout)  # sshd's own answer: no process started, no autostop activity

    def forget(node: str) -> None:
        with lock:
            conn = conns.pop(node, None)
        if conn is not None:
            conn.close()

    def lost(node: str, why: str) -> None:
        out.info(f"run {rid}: {node}: {why}")
        group.connections[node].lose(why)

    def back(node: str) -> None:
        from vmrun.backends.hosts import records

        conn = conns.get(node)
        if conn is None:  # the follow ended meanwhile
            return
        try:
            done = records.stop(conn, rid, grace=5, why="replaced")
        except VmrunError as exc:
            if exc.code != "run-not-found":
                out.warn(f"run {rid}: {node} answers again; its replaced attempt: {exc.one_line()}")
            return
        if done.signalled:
            out.info(
                f"run {rid}: {node} answers again: its replaced attempt is stopped there"
                f" ({len(done.signalled)} process(es))"
            )

    every, silent = settings.keepalive_interval, _silent_s(settings)
    labels = [e.label for e in entries]
    beats = Heartbeat(
        labels,
        ask,
        lost,
        forget=forget,
        period=every,
        lost_after=silent,
        retired=[e.label for e in retired],
        on_back=back,
    )
    try:
        with beats:
            yield
    finally:
        ended.set()
        for node in list(conns):
            forget(node)


def _failure(rid: str, nodes: list[str], settings: Settings, silent: str = "") -> Failure:
    """Which nodes answer now (each asked afresh), and what the run's records say;
    `silent`: the node the follow found silent (it may answer again: a blip)."""
    from vmrun.backends.hosts import records
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(nodes, settings)
    with Group(entries, settings) as group:
        outcomes = group.map(lambda entry, conn: records.list_runs(conn, [rid]))
    now = time.time()
    lost = tuple(o.host for o in outcomes if not o.ok)
    found = [r for o in outcomes if o.ok for r in o.value or []]
    codes = [r.exit_code for r in found if r.exit_code not in (None, 0)]
    failed = next((r for r in found if r.failure is not None), None)
    saved = [r.saved_epoch for r in found if r.saved_epoch is not None]
    # only the user's stop (or the run's --max-cost) ends it: the follower's own stop of the
    # other nodes when one is lost is recorded as vmrun's (`failure`), however soon the lost
    # node answers again (a blip)
    stopped = any(r.meant_to_end for r in found)
    noticed = tuple(r.host for r in found if r.notice is not None)
    where = failed.failure.describe(failed.host) if failed and failed.failure else ""
    reached = [int(m.group(1)) for r in found if (m := re.match(r"epoch (\d+)", r.progress))]
    ends = [now - (r.host_now - r.ended) for r in found if r.ended and r.host_now]  # our clock
    at = min(ends) if ends and not lost else now  # a lost node: when it was found gone
    returned = (silent,) if silent and silent not in lost else ()
    everywhere = {r.host for r in found} >= set(nodes)
    running = not lost and everywhere and all(r.running for r in found)
    return Failure(
        tuple(nodes),
        lost,
        codes[0] if codes else None,
        where,
        max(saved) if saved else None,
        stopped,
        noticed,
        max(reached) if reached else None,
        at,
        returned,
        running,
    )


def _resume(
    spec: Spec, nodes: list[str], recovery: Recovery, settings: Settings, out: Reporter
) -> list[str]:
    """The run's next attempt, detached, on the decided nodes; those nodes."""
    from vmrun.operations.train import HostOptions, RunOptions, train
    from vmrun.recovery.deploy import RUN_ENV, run_env_of

    new = list(recovery.nodes or nodes)
    master_lost = nodes[0] in recovery.swap
    hosts = HostOptions(hosts=new, replace=dict(recovery.swap), from_store=master_lost)
    given = RunOptions(env=run_env_of(os.environ.get(RUN_ENV, "")) or None)
    for attempt in range(2):  # a resume that itself fails (a hiccup) is tried once more
        try:
            train(given, settings, hosts=hosts, resume=spec.run_id, detach=True, out=out)
            return new
        except UsageError:
            raise  # refused as asked: asking again changes nothing
        except VmrunError as exc:
            out.warn(f"run {spec.run_id}: the resume failed ({exc.one_line()})")
            if attempt == 1:
                raise
            time.sleep(5)
    return new


def _tell(
    settings: Settings, rid: str, event: str, state: str, nodes: list[str], out: Reporter
) -> None:
    """One notification per recovery, and one when it gives up (the notify settings: a
    recovery is told where failures are)."""
    from vmrun.notify.send import Notify, message, send

    notify = Notify.from_settings(settings.notify, settings.notify_on)
    if not notify or not (set(notify.on) & {"fail", "requeue"}):
        return
    title, body = message(
        event, run=rid, state=state, where=", ".join(nodes), fetch=f"vmrun fetch --run {rid}"
    )
    sent = send(notify.targets, title, body, "fail" if event == "fail" else "requeue")
    for target, why in sent.failed:
        out.warn(f"run {rid}: not told to {target}: {why}")


def _facts(failure: Failure, recovery: Recovery) -> dict[str, Any]:
    """What a recovery cost, for `report`: seconds from the failure to the next attempt's
    start (now), the epochs done again, which node took which one's place (and, beside
    it, `new_vm_s`: of the downtime, the new VMs' making and setup)."""
    return {
        "downtime_s": round(time.time() - failure.at, 1) if failure.at else None,
        "epochs_redone": failure.redone,
        "swap": dict(recovery.swap),
        "action": recovery.action,
    }


def _cost(facts: dict[str, Any]) -> str:
    parts = []
    if facts["downtime_s"] is not None:
        parts.append(f"{facts['downtime_s']:.0f} s down")
    if facts["epochs_redone"] is not None:
        parts.append(f"{facts['epochs_redone']} epoch(s) redone")
    return f" ({', '.join(parts)})" if parts else ""


def _note(
    rid: str,
    nodes: list[str],
    settings: Settings,
    kind: str,
    text: str,
    facts: dict[str, Any] | None = None,
) -> None:
    """A line in the run's log on the nodes that answer, and its `recoveries`: why it went
    on, or did not (with `facts`, what it cost)."""
    from vmrun import hostside
    from vmrun.remote_paths import RUNS_DIR
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    env = {"VMRUN_NOTE_FACTS": json.dumps(facts)} if facts else None
    with Group(select_hosts(nodes, settings), settings) as group:
        group.map(
            lambda e, conn: conn.run(
                hostside.command("run_note.sh", RUNS_DIR, rid, kind, text), env=env
            )
        )


def _finish(
    state: Path, spec: Spec, settings: Settings, nodes: list[str], out: Reporter, code: int
) -> int:
    """Its boot entry gone, and its key off every host that allowed it (those that answer)."""
    import subprocess

    script = state / "supervisor_start.sh"
    if script.is_file():
        subprocess.run(
            ["sh", str(script), "forget", str(state), TAG.format(run=spec.run_id)],
            check=False,
            capture_output=True,
            timeout=60,
        )
    from vmrun import hostside
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    tag = TAG.format(run=spec.run_id)
    hosts = list(dict.fromkeys([*spec.nodes, *nodes, *spec.spares]))
    with Group(select_hosts(hosts, settings), settings) as group:
        group.map(lambda e, conn: conn.run(hostside.command("supervisor_keys.sh", "forget", tag)))
    for name in ("id_ed25519", "id_ed25519.pub", "secrets.env"):  # a host that did not answer
        (state / name).unlink(missing_ok=True)  # may still allow it: nothing holds the key
    out.info(f"run {spec.run_id}: the supervisor's key is off {', '.join(hosts)}; done")
    return code


def _as_dict(failure: Failure) -> dict[str, Any]:
    return {
        "nodes": list(failure.nodes),
        "lost": list(failure.lost),
        "exit_code": failure.exit_code,
        "where": failure.where,
        "epoch": failure.epoch,
        "noticed": list(failure.noticed),
        "reached": failure.reached,
        "at": failure.at,
        "returned": list(failure.returned),
    }


def _mark_pid(state: Path) -> None:
    """pid and its start time (field 22 of /proc/PID/stat): supervisor_start.sh's check."""
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    started = stat.rsplit(")", 1)[1].split()[19]
    (state / "pid").write_text(f"{os.getpid()} {started}\n")


def _load_secrets(path: Path) -> bool:
    """NAME=VALUE lines (the bucket's keys, where runs are told) into this process's
    environment; whether there were any."""
    if not path.is_file():
        return False
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.replace("_", "").isalnum():
            os.environ[name] = value
    return True
