"""Runs on SSH hosts: the `Backend` whose runs are detached process trees recorded under
~/.vmrun/runs/<id>/ on every node (vmrun.backends.hosts.records), over one connection per host.

It works on a caller's `Group`, so a command opens each host once however many verbs it
uses (find, then follow; find, then stop). `start` checks the launcher against the hosts,
preflights them (vmrun.backends.hosts.preflight), stages the code (staging), decides where the
nodes meet (node_launch, rendezvous) and starts every node detached (records).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun import hostside
from vmrun.backends.api import (
    FilesAt,
    NodeRecord,
    Prepared,
    RunRef,
    StartOptions,
    StopReport,
    combined_state,
)
from vmrun.backends.hosts import CAPABILITIES, records
from vmrun.backends.hosts.netfacts import Layout
from vmrun.backends.hosts.node_launch import (
    Node,
    Placement,
    Wiring,
    layout_note,
    meet,
    node_launch,
    node_watchers,
    rank0_node,
)
from vmrun.backends.hosts.preflight import check_launcher_hosts, cuda_warning, nproc_for, preflight
from vmrun.backends.hosts.staging import stage
from vmrun.errors import (
    ConnectionLostError,
    Detached,
    Interrupted,
    UsageError,
    VmrunError,
    run_failed,
    run_over_budget,
    run_stopped,
)
from vmrun.remote_paths import remote_workdir
from vmrun.reporting import Recorder, Reporter
from vmrun.results.cost import prices
from vmrun.results.record import HOSTS, Image, Launch, Policy, Prices, RunRecord
from vmrun.runs import launch, provenance
from vmrun.runs.lines import Prefixer
from vmrun.runs.outputs import RunLocation, location_of
from vmrun.runs.plan import STOP_GRACE_S, Plan
from vmrun.runs.state import RunState
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, Outcome, raise_for_failures
from vmrun.ssh.inventory import HostEntry, find_entry
from vmrun.transfer.types import Progress

if TYPE_CHECKING:
    from vmrun.backends.api import StacksTaken
    from vmrun.backends.hosts.resume_point import Store
    from vmrun.notify.send import Charge, Notify


def node_record(rec: records.RunRecord) -> NodeRecord:
    return NodeRecord(
        node=rec.host,
        state=rec.state,
        exit_code=rec.exit_code,
        record=rec.record,
        started=rec.started,
        first_started=rec.first_started,
        ended=rec.ended,
        failure=rec.failure,
        budget=rec.budget,
    )


def ref_of(
    run_id: str,
    recs: Sequence[records.RunRecord],
    skip: Mapping[str, int] = {},
    unreached: Mapping[str, BaseException] = {},
) -> RunRef:
    """A RunRef over these node records, in the run's own node order (master first)."""
    by_node = {r.host: node_record(r) for r in recs}
    order = [n for n in recs[0].record.hosts if n in by_node] if recs else []
    order += [n for n in by_node if n not in order]
    return RunRef(run_id, tuple(order), by_node, dict(skip), dict(unreached))


class HostsBackend:
    """On `group`'s connections; `entries`: the run's hosts (default: the group's), master
    first; `place`: the multi-node flags and what the caller checked already."""

    def __init__(
        self,
        group: Group,
        entries: Sequence[HostEntry] | None = None,
        place: Placement | None = None,
    ):
        self.group = group
        self.entries = list(entries if entries is not None else group.entries)
        self.place = place or Placement()

    def conn(self, node: str) -> Connection:
        return self.group.connections[node]

    def start(
        self, plan: Plan, how: StartOptions, out: Reporter, progress: Progress | None = None
    ) -> RunRef:
        """Preflight, stage and start the run on this backend's hosts (master first),
        detached; its RunRef (the nodes, and the lines of earlier attempts to skip)."""
        place = self.place
        check_launcher_hosts(plan, len(self.entries), place.wiring)
        ran = ran_before(how.resume, place.listed) if how.resume else 0.0  # earlier attempts
        budget = _budget(plan, self.entries, how.resume, ran)  # before anything runs
        multi = len(self.entries) > 1
        only = {e.label for e in self.entries}
        nodes = place.nodes or preflight(
            self.group, plan, out, multi=multi, how=how, listed=place.listed, only=only
        )
        nodes = {e.label: nodes[e.label] for e in self.entries}  # the node order: the master first
        nproc = nproc_for(plan, list(nodes.values()))
        warning = cuda_warning(plan, list(nodes.values()))
        if warning:
            out.warn(warning)
        layout = (place.layout or meet(self.group, nodes, place.wiring)) if multi else None
        rid = how.resume or how.run_id or launch.run_id(plan.name)
        banner = ""
        if how.resume and (place.restore is None or place.listed):
            from vmrun.backends.hosts.resume import prepare

            # the run's leftovers stopped; its newest checkpoints on every node (a host
            # taking a lost node's place too), unless they come from its bucket below
            banner = prepare(
                self.group,
                list(nodes),
                rid,
                out,
                place.listed,
                store=_run_store(plan, rid),
                pythons={label: n.env.python for label, n in nodes.items()},
            )
        live = progress if isinstance(progress, AbstractContextManager) else nullcontext()
        files = _synced_files(plan)  # once for every host, and for the run's record
        with live:
            _pull_images(self.group, nodes, out, progress)
            staged = self.group.map(
                lambda entry, conn: _stage(conn, nodes[entry.label], plan, out, progress, files),
                only=only,
            )
        raise_for_failures(staged, one_as_itself=True)
        if how.resume and place.restore is not None:  # its hosts are gone: from its bucket
            from vmrun.backends.hosts.resume import restore

            assert plan.store_access is not None
            out_dirs = {label: _out_dir(plan, n.workdir, rid) for label, n in nodes.items()}
            banner, place.listed = restore(
                self.group,
                out_dirs,
                rid,
                place.restore,
                plan.store_access,
                out,
                progress,
                pythons={label: n.env.python for label, n in nodes.items()},
            )
        holder = rank0_node(layout, nodes, plan.launcher)  # where the record is copied from
        if plan.store is not None:  # every node copies what its ranks write: each checked
            from vmrun.stores.sync import check_store, run_place

            access = plan.store_access
            assert access is not None
            to = run_place(plan.store, rid)
            # each node its own probe: two writes of one object race in the mover's check
            probes = {
                label: "started" if label == holder else f"started.{i}"
                for i, label in enumerate(nodes)
            }
            raise_for_failures(
                self.group.map(
                    lambda entry, conn: check_store(
                        conn,
                        to,
                        access.on(entry.vars),
                        nodes[entry.label].env.python,
                        probes[entry.label],
                    ),
                    only=only,
                ),
                one_as_itself=True,
            )
        started = _start_all(
            self.group,
            plan,
            nodes,
            rid,
            nproc,
            layout,
            place.wiring,
            how.resume,
            banner,
            alone=not how.allow_concurrent,
            notify=how.notify,
            files=files,
            earlier=_earlier_code(rid, place.listed) if how.resume else [],
            holder=holder,
            budget=budget,
            ran=ran,
        )
        names = ", ".join(nodes)
        first = self.entries[0].label
        where = f" on {names}" if multi else f" on {names} (pid {started[first]})"
        out.info(
            f"run {rid} {'resumed' if how.resume else 'started'}{where}; its files: ~/"
            f"{_out_dir(plan, nodes[first].workdir, rid)}/"
        )
        if layout is not None:
            out.info(layout_note(layout, nodes, nproc, plan.launcher))
        return RunRef(rid, tuple(nodes), skip={label: n.skip for label, n in nodes.items()})

    # -- finding runs --------------------------------------------------------------------

    def find(
        self, run_id: str | None, *, running_only: bool = False, nodes: Sequence[str] = ()
    ) -> RunRef:
        rid, found, unreached = records.find_run(self.group, run_id, running_only=running_only)
        ref = ref_of(rid, [rec for _, rec in found], unreached=unreached)
        return require_nodes(ref, nodes, self.entries) if nodes else ref

    def runs(self) -> tuple[list[records.RunRecord], list[BaseException]]:
        """Every run on every host, oldest first, and the errors of hosts that did not
        answer (`status` shows what it can and reports the rest)."""
        outcomes = self.group.map(lambda entry, conn: records.list_runs(conn))
        recs = [r for o in outcomes if o.ok for r in o.value or []]
        recs.sort(key=lambda r: (r.started, r.id, r.host))
        return recs, [o.error for o in outcomes if o.error is not None]

    def state(self, ref: RunRef) -> tuple[RunState, int | None]:
        return combined_state(self.node_records(ref))

    def node_records(self, ref: RunRef) -> list[NodeRecord]:
        """What each node's record says now."""
        outcomes = self.group.map(
            lambda entry, conn: records.list_runs(conn, [ref.run_id]), only=set(ref.nodes)
        )
        raise_for_failures(outcomes)
        return [node_record(r) for o in outcomes for r in o.value or []]

    # -- the log ---------------------------------------------------------------------------

    def follow(
        self,
        ref: RunRef,
        out: Reporter,
        *,
        last: int = 0,
        announce: bool = True,
        verbose: bool = False,
    ) -> int:
        """Follow to the end (after `ref.skip` lines per node, else the last N lines);
        0 when it finished well, else raise its failure (a failed node stops the others).
        `announce`: say that it finished and how to fetch its files (the caller may have
        something better to say, such as that they have been fetched). `verbose`: torchrun's
        banner and c10d's host name warnings too (vmrun.runs.lines)."""
        if len(ref.nodes) > 1:
            from vmrun.backends.hosts.nodes import follow_nodes

            conns = [self.conn(n) for n in ref.nodes]
            follow_nodes(conns, ref.run_id, out, last=last, skip=ref.skip, verbose=verbose)
        else:
            self._follow_one(ref, out, last=last, verbose=verbose)
        if announce:
            out.info(self._finished(ref))
        return 0

    def _follow_one(self, ref: RunRef, out: Reporter, *, last: int, verbose: bool) -> None:
        (node,) = ref.nodes
        conn = self.conn(node)
        lines = _prefixer(ref, node, out, verbose)
        rid = ref.run_id
        try:
            records.follow(conn, rid, lines, last=last, skip=ref.skip.get(node, 0))
        except (KeyboardInterrupt, Interrupted):
            raise Detached(
                f"detached from run {rid}; it goes on running on {node}",
                hint=f"reattach with `vmrun logs -f {rid}`, stop it with `vmrun stop {rid}`",
            ) from None
        except ConnectionLostError as exc:
            raise ConnectionLostError(
                f"{exc.message}; run {rid} goes on running there",
                host=node,
                hint=f"reattach with `vmrun logs -f {rid}`",
            ) from None
        finally:
            lines.flush()
        recs = self.node_records(ref)
        state, code = combined_state(recs)
        if state == RunState.DONE:
            return
        if state == RunState.STOPPED:
            budget = next((r.budget for r in recs if r.budget), None)
            if budget:
                raise run_over_budget(rid, str(budget.get("cap") or "?"), host=node)
            raise run_stopped(rid, host=node)
        code = code if code is not None else 1
        failure = next((r.failure for r in recs if r.failure), None)
        why = f"exited with {code}" + (f": {failure.describe(node)}" if failure else "")
        raise run_failed(rid, why, code, host=node, hint=f"see `vmrun logs {rid}`")

    def _finished(self, ref: RunRef) -> str:
        where = f"run {ref.run_id} finished on {', '.join(ref.nodes)}"
        return f"{where}; `vmrun fetch --run {ref.run_id}` brings its files"

    def read_log(self, ref: RunRef, out: Reporter, *, last: int = 0, verbose: bool = False) -> None:
        """The log as it is now (its last `last` lines); several nodes' merged by when each
        line was written (the hosts' clocks, hostside/run_agent.py), a node's own in order."""
        if len(ref.nodes) == 1:
            lines = _prefixer(ref, ref.nodes[0], out, verbose)
            records.read_log(self.conn(ref.nodes[0]), ref.run_id, lines, last=last)
            lines.flush()
            return
        timed = [
            (when, place, seq, line)
            for place, node in enumerate(ref.nodes)
            for seq, (when, line) in enumerate(self._timed_lines(ref, node, verbose))
        ]
        timed.sort(key=lambda t: t[:3])
        for *_, line in timed[-last:] if last else timed:
            out.output(line)

    def _timed_lines(self, ref: RunRef, node: str, verbose: bool) -> list[tuple[float, bytes]]:
        """One node's whole log as shown, each line with when its end was written."""
        conn = self.conn(node)
        marks = records.log_times(conn, ref.run_id)
        raw = Recorder()
        records.read_log(conn, ref.run_id, raw)
        lines = raw.data.splitlines(keepends=True)
        shown = _Timed()
        prefixed = _prefixer(ref, node, shown, verbose)
        for when, line in zip(records.line_times(marks, len(lines)), lines, strict=True):
            shown.when = when
            prefixed.feed(line)
        prefixed.flush()
        return shown.lines

    def timed_log(self, ref: RunRef, node: str) -> list[tuple[float, bytes]]:
        """One node's log as `logs` shows it, each line with when it was written there (the
        host's clock): what a run's timeline reads its snapshots from."""
        return self._timed_lines(ref, node, False)

    # -- stopping and outputs ----------------------------------------------------------------

    def stop(self, ref: RunRef, *, grace: float = STOP_GRACE_S) -> list[Outcome[StopReport]]:
        """Each reached node's stop, failures included (the others are in `ref.unreached`);
        a run in an image leaves no container behind."""

        def one(entry: HostEntry, conn: Connection) -> StopReport:
            result = records.stop(conn, ref.run_id, grace=grace)
            rec = ref.records.get(entry.label)
            image = rec.record.launch.image if rec is not None else None
            runtime = image.runtime if image is not None else None
            if runtime:
                from vmrun.backends.hosts.images import remove_leftovers

                remove_leftovers(conn, str(runtime), ref.run_id)
            return StopReport(entry.label, len(result.signalled), len(result.killed))

        return self.group.map(one, only=set(ref.nodes))

    def files_at(self, ref: RunRef) -> FilesAt:
        """The run's master (whose record the others share), or its first node reached."""
        node = ref.record.master or ref.nodes[0]
        if node not in ref.records:
            node = ref.nodes[0]
        location = self.outputs(ref)[node]
        python = ref.records[node].record.launch.python or "python3"
        return FilesAt(node, self.conn(node), python, location, f"-H {node}")

    def code_dir(self, project: Path) -> str:
        return remote_workdir(project)

    def outputs(self, ref: RunRef) -> dict[str, RunLocation]:
        return {
            node: location_of(ref.run_id, node, rec.record, rec.first_started)
            for node, rec in ref.records.items()
        }

    def prepare(self, plan: Plan, how: StartOptions | None = None) -> Prepared:
        """What `start` would do on these hosts, nothing sent (no host is reached: each
        one's interpreter, GPUs and meeting point are found when the run starts)."""
        from vmrun.backends.api import launch_lines

        labels = [e.label for e in self.entries]
        workdir = remote_workdir(plan.project)
        lines = [f"# on {', '.join(labels)} (the master first), as `vmrun train -H` starts it:"]
        if _synced_files(plan) is not None:
            lines.append(f"# sync {plan.project} -> ~/{workdir} on each host")
        for path, where in plan.data:
            lines.append(f"# push {path} -> {where or '~/' + workdir} on each host")
        script = None  # the template trainer: where vmrun stages it
        if plan.script.is_relative_to(plan.project):  # the project's: from its work directory
            script = str(plan.script.relative_to(plan.project))
            lines.append(f"# in ~/{workdir} on each host")
        lines += launch_lines(plan, python="PYTHON", nnodes=len(labels), script=script)
        lines.append("# detached, recorded under ~/.vmrun/runs/RUN_ID/ on each host")
        if plan.store is not None:
            lines.append(f"# its files copied to {plan.store}/RUN_ID as they are written")
        if how is not None and how.resume:
            lines.append(f"# continuing run {how.resume} from its newest snapshot")
        return Prepared(tuple(lines))

    capabilities = CAPABILITIES  # what runs on hosts can do (the refusals derive from it)

    def stacks(self, run_id: str | None, *, hang: bool = False) -> StacksTaken:
        """Each rank's stack on the run's nodes now (None: the newest running run), or with
        `hang` those each node's hang watcher took (the run may have ended since)."""
        from vmrun.backends.api import StacksTaken
        from vmrun.backends.hosts.stacks import take_on_nodes
        from vmrun.errors import UsageError
        from vmrun.runs.state import RunState

        ref = self.find(run_id, running_only=run_id is None and not hang)
        running = any(r.state == RunState.RUNNING for r in ref.records.values())
        if not hang and not running:
            raise UsageError(
                f"run {ref.run_id} is not running: its stacks are gone with it",
                hint=f"`vmrun stacks {ref.run_id} --hang` shows those its hang watcher took",
                code="not-running",
            )
        got = take_on_nodes(self.group, ref, hang=hang)
        return StacksTaken(ref.run_id, got.stacks, got.failed, got.hangs, got.flights)


def _prefixer(ref: RunRef, node: str, out: Reporter, verbose: bool) -> Prefixer:
    """Whole lines, `[node rankN]` when the run has several nodes, `[rankN]` on one."""
    several = len(ref.nodes) > 1 or len(ref.record.hosts) > 1
    return Prefixer(node if several else None, out, verbose=verbose)


class _Timed(Reporter):
    """Lines kept with the time their source line was written (set before each feed)."""

    def __init__(self) -> None:
        self.when = 0.0
        self.lines: list[tuple[float, bytes]] = []

    def output(self, data: bytes) -> None:
        self.lines.append((self.when, data))


def require_nodes(ref: RunRef, wanted: Sequence[str], entries: Sequence[HostEntry]) -> RunRef:
    """The same run narrowed to some of its nodes (`logs --node`), each name matched as `-H`
    matches a host (find_entry)."""
    nodes = [e for e in entries if e.label in ref.nodes or e.label in ref.unreached]
    chosen = {found.label for name in wanted if (found := find_entry(nodes, name)) is not None}
    if not chosen:
        ran_on = [*ref.nodes, *ref.unreached]
        raise UsageError(
            f"run {ref.run_id} has no node {', '.join(wanted)} (it ran on {', '.join(ran_on)})"
        )
    return RunRef(
        ref.run_id,
        tuple(n for n in ref.nodes if n in chosen),
        ref.records,
        ref.skip,
        {n: e for n, e in ref.unreached.items() if n in chosen},
    )


def _pull_images(
    group: Group, nodes: dict[str, Node], out: Reporter, progress: Progress | None
) -> None:
    """Each node's image pulled on its host, all at once; the same image everywhere."""
    wanted = {label for label, n in nodes.items() if n.image is not None}
    if not wanted:
        return
    from vmrun.backends.hosts.images import check_same_image, pull

    def one(entry: HostEntry, conn: Connection) -> None:
        node = nodes[entry.label]
        assert node.image is not None
        node.image = pull(conn, node.image, out, progress)

    raise_for_failures(group.map(one, only=wanted), one_as_itself=True)
    check_same_image({label: n.image for label, n in nodes.items() if n.image is not None})


def _node_argv(node: Node, argv: list[str], env: dict[str, str], rid: str, index: int) -> list[str]:
    """The node's process: `argv` itself, or argv in the node's container."""
    if node.image is None:
        return argv
    from vmrun.backends.hosts.images import container_argv
    from vmrun.containers.runtime import IMAGE_PYTHON

    home = node.env.home
    described = [  # the image's Python describes the image's packages, beside the run
        "sh",
        f"{home}/{hostside.path('run_in_image.sh')}",
        IMAGE_PYTHON,
        f"{home}/{hostside.path('run_provenance.py')}",
        f"{home}/{records.record_dir(rid)}",
        *argv,
    ]
    return container_argv(
        node.image,
        described,
        sorted(env),
        home=home,
        workdir=node.workdir,
        record=records.record_dir(rid),
        run_id=rid,
        index=index,
        gpus=node.env.gpus > 0,
    )


def _stage(
    conn: Connection,
    node: Node,
    plan: Plan,
    out: Reporter,
    progress: Progress | None,
    files: list[str] | None,
) -> None:
    """The node's code and script in place; py-spy there too for a run watched for hangs
    (its watcher takes the ranks' stacks, in an image too: py-spy runs on the host; without
    py-spy a hang is told without them)."""
    stage(node, plan, out, progress, files)
    if plan.hang_timeout:
        from vmrun.runs.stack_tool import ensure

        try:
            ensure(conn, node.env.python)
        except VmrunError as exc:
            out.warn(
                f"{node.label}: a hang would be told without the ranks' stacks: {exc.one_line()}"
            )


def _run_store(plan: Plan, rid: str) -> Store | None:
    """The run's place in its bucket, where it copies there (a resume reads it)."""
    if plan.store is None or plan.store_access is None:
        return None
    from vmrun.backends.hosts.resume_point import Store
    from vmrun.stores.sync import run_place

    return Store(run_place(plan.store, rid), plan.store_access)


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
    notify: Notify | None = None,
    files: list[str] | None = None,
    earlier: list[dict[str, Any]] | None = None,
    holder: str = "",
    budget: str = "",
    ran: float = 0.0,
) -> dict[str, int]:
    """Start every node; if any fails to start, stop the ones that did and raise. `alone`:
    each host refuses if another run is alive there (the busy check, under its start lock).
    `notify` (vmrun.notify.send.Notify): the master's record gets the run's notify.json, so
    the master tells the run's end itself, with or without vmrun attached. `holder`: the
    node that copies a --store run's record to its bucket and claims the attempt there
    (every node copies its own outputs). `budget`: the budget watcher's
    `SECONDS CAP` (`train --max-cost`), "" for none. `ran`: what a resumed run's
    earlier attempts ran, kept in run.json (ran_before_s) for its cost."""
    labels = list(nodes)
    place = None
    attempt = ""  # this attempt's id: every node's copier follows the holder's claim by it
    if plan.store is not None:
        import secrets

        from vmrun.stores.sync import run_place

        place = run_place(plan.store, rid)
        attempt = secrets.token_hex(8)
    code = provenance.code_of(
        plan.project, files, trainer=plan.script if plan.is_template else None
    )
    priced = prices(
        {e.label: e.vars.get("price") for e in group.entries if e.label in nodes},
        {e.label: e.vars.get("currency") for e in group.entries if e.label in nodes},
    )
    base = RunRecord(
        run_id=rid,
        where=HOSTS,
        hosts=tuple(labels),
        master=labels[0],
        launch=Launch(
            name=plan.name,
            template=plan.is_template,
            launcher=plan.launcher,
            args=tuple(plan.args),
            nproc_requested=plan.nproc,
            nproc=nproc,
            max_restarts=plan.max_restarts,
            env_keys=tuple(sorted(plan.env)),
            nnodes=wiring.nnodes or str(len(labels)),
            rdzv=layout.endpoint if layout else None,
        ),
        code=code.facts,
        code_earlier=tuple(earlier or ()),
        ran_before_s=round(ran, 1),
        store=str(place) if place else None,
        store_node=holder if place else "",
        policy=Policy(
            recover=plan.recover,
            hang_timeout=plan.hang_timeout or None,
            on_hang=plan.on_hang if plan.hang_timeout else None,
            max_cost=plan.max_cost or None,
        ),
        prices=Prices.from_json(priced),
    )
    charge = _charge(base)

    def start(entry: HostEntry, conn: Connection) -> int:
        node = nodes[entry.label]
        single_env = plan.launcher == "env" and layout is None
        port = _free_port(conn, node.env.python) if single_env else 0
        argv, env = node_launch(plan, node, rid, nproc, layout, wiring, port, labels)
        argv = _node_argv(node, argv, env, rid, labels.index(entry.label))
        given = provenance.variables(env, _users_names(plan, node))
        master = entry.label == labels[0]
        told = ""
        if notify and master:
            told = notify.host_config(_notify_facts(plan, rid, labels), charge=charge)
        copies = place is not None  # every node: what its own ranks wrote
        watchers = node_watchers(
            plan,
            node,
            code_patch=code.sent(),
            notify_config=told,
            budget=budget,
            store=place if copies else None,
            store_config=plan.store_access.on(entry.vars).mover_config()
            if copies and plan.store_access
            else "",
        )
        if watchers.store is not None:  # the record and the claim: the holder's alone
            watchers = replace(
                watchers,
                store=replace(watchers.store, records=entry.label == holder, attempt=attempt),
            )
        record = replace(
            base,
            host=entry.label,
            launch=replace(
                base.launch,
                script=node.script,
                workdir=node.workdir,
                out_dir=_out_dir(plan, node.workdir, rid),
                python=node.env.python,
                argv=tuple(argv),
                ifname=layout.ifnames.get(entry.label, "") if layout else "",
                variables=given,
                image=Image.from_json(node.image.meta()) if node.image else None,
                data=tuple(node.data or ()),
            ),
        )
        got = records.start(
            conn,
            rid,
            node.workdir,
            argv,
            record,
            env=env,
            resume=resume is not None,
            banner=banner,
            alone=alone,
            watchers=watchers,
        )
        node.skip = got.log_lines
        return got.pid

    outcomes = group.map(start, only=set(labels))  # the run's nodes, not every host listed
    if any(not o.ok for o in outcomes):
        started = {o.host for o in outcomes if o.ok}
        group.map(lambda entry, conn: records.stop(conn, rid, grace=5, why="start"), only=started)
        raise_for_failures(outcomes, one_as_itself=True)
    return {o.host: int(o.value or 0) for o in outcomes}


def _budget(plan: Plan, entries: Sequence[HostEntry], resume: str | None, spent: float) -> str:
    """The budget watcher's setting for `--max-cost` (`SECONDS CAP`: how much longer
    the run may go at its nodes' prices, less `spent`, what its earlier attempts ran), ""
    without a cap; refused before anything starts where a node's price is unknown or the cap
    is spent."""
    if not plan.max_cost:
        return ""
    from vmrun.results.cost import budget_seconds, money

    labels = [e.label for e in entries]
    priced = prices(
        {e.label: e.vars.get("price") for e in entries},
        {e.label: e.vars.get("currency") for e in entries},
    )
    if not priced:
        unknown = [e.label for e in entries if not isinstance(e.vars.get("price"), (int, float))]
        why = f"no price for {', '.join(unknown)}" if unknown else "prices in different currencies"
        raise UsageError(
            f"--max-cost {plan.max_cost:g}: {why}, so the cap cannot be kept; nothing started",
            hint="give each host its `price` an hour in vmrun.toml (`vmrun up` records the"
            " cloud's), or drop --max-cost",
            code="over-budget",
        )
    per_hour, currency = priced["price_per_hour"], priced["currency"]
    cap = money(plan.max_cost, currency)
    left = budget_seconds(plan.max_cost, per_hour, spent)
    if left <= 0:
        paid = money(spent / 3600 * per_hour, currency)
        raise UsageError(
            f"run {resume} has already cost {paid} of --max-cost {cap} on {', '.join(labels)};"
            " nothing started",
            hint="a higher --max-cost lets it go on",
            code="over-budget",
        )
    return f"{left:.0f} {cap}"


def ran_before(rid: str, listed: dict[str, list[records.RunRecord]] | None) -> float:
    """What a resumed run's earlier attempts ran, in all (the cost of the run so far)."""
    recs = [r for found in (listed or {}).values() for r in found if r.id == rid]
    return max((r.ran_s or 0.0 for r in recs), default=0.0)


def _synced_files(plan: Plan) -> list[str] | None:
    """The project's files the run syncs (None: the template, which syncs none of them)."""
    from vmrun.sync.files import project_files
    from vmrun.trainer import is_bundled

    return None if is_bundled(plan.script) else project_files(plan.project)


def _earlier_code(
    rid: str, listed: dict[str, list[records.RunRecord]] | None
) -> list[dict[str, Any]]:
    """A resumed run's earlier attempts' code (run.json's `code` is this attempt's; each
    attempt's diff stays as code.patch.<attempt> beside it): what made its first epochs."""
    recs = [r for recs in (listed or {}).values() for r in recs if r.id == rid]
    if not recs:
        return []
    record = recs[0].record
    kept = [dict(c) for c in record.code_earlier]
    code = record.code
    return kept + ([{**code, "attempt": recs[0].attempt}] if code is not None else [])


def _users_names(plan: Plan, node: Node) -> set[str]:
    """The variables the user gave (their values are never recorded): --env, the host's
    `env` table in vmrun.toml, NCCL_* from this shell."""
    table = node.entry.vars.get("env")
    names = set(plan.env) | {k for k in os.environ if k.startswith("NCCL_")}
    return names | ({str(k) for k in table} if isinstance(table, dict) else set())


def _charge(record: RunRecord) -> Charge:
    """What the master's sender counts in the end's message: the run's prices and what its
    earlier attempts ran (its outputs' folder is the record's out_dir file)."""
    from vmrun.notify.send import Charge

    prices = record.prices
    if prices is None:
        return Charge(ran_before_s=record.ran_before_s)
    return Charge(prices.per_hour, prices.currency, record.ran_before_s)


def _notify_facts(plan: Plan, rid: str, labels: list[str]) -> dict[str, Any]:
    """What the run's notification says that the host's record does not."""
    asked = plan.args[0] if plan.is_template and plan.args and plan.args[0].isdigit() else None
    return {
        "run": rid,
        "where": ", ".join(labels),
        "epochs_asked": asked,
        "fetch": f"vmrun fetch results --run {rid}",
    }


def _free_port(conn: Connection, python: str) -> int:
    """A port nothing listens on at the host now (the `env` launcher's MASTER_PORT)."""
    probe = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    )
    out = conn.run([python, "-c", probe], check=True, what="a free port probe").stdout_tail.split()
    return int(out[-1]) if out and out[-1].isdigit() else launch.DEFAULT_MASTER_PORT
