"""`vmrun train` on SSH hosts: start the run through its backend, then detach or follow it
to the end, fetching its checkpoints meanwhile (`--fetch-every`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from vmrun.backends.api import Prepared, RunRef, StartOptions
from vmrun.backends.hosts.backend import HostsBackend
from vmrun.backends.hosts.down_after import DownAfterRun
from vmrun.backends.hosts.node_launch import Placement
from vmrun.backends.hosts.preflight import order
from vmrun.config import Settings
from vmrun.containers.refusals import naming_refusals
from vmrun.errors import Detached, Interrupted, VmrunError
from vmrun.reporting import QUIET, Passing, Progress, Reporter
from vmrun.runs.plan import Plan
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.types import Progress as TransferProgress

if TYPE_CHECKING:
    from vmrun.notify.send import Notify


def run_remote(
    plan: Plan,
    entries: list[HostEntry],
    settings: Settings,
    *,
    detach: bool,
    out: Reporter = QUIET,
    how: StartOptions | None = None,
    place: Placement | None = None,
    fetch_every: float | None = None,
    progress: TransferProgress | None = None,
    group: Group | None = None,
    verbose: bool = False,
    on_start: Callable[[RunRef], None] | None = None,
) -> int:
    """Start the plan on the hosts (one node each) and, unless detached, follow it to the
    end (`fetch_every`: pulling its checkpoints meanwhile); return 0 or raise with the run's
    failure. `out`: what it says, and the run's lines as they come. `group`: connections to
    use (else this opens its own); closed at the end. `verbose`: torchrun's banner and
    c10d's host name warnings too. `place`: the hosts' wiring (HostsBackend's).
    `how.down_after_run`: power the hosts
    off once it has ended and its results are here (vmrun.backends.hosts.down_after).
    `on_start`: told the run once it has started (a sweep stops it by id if it is interrupted)."""
    how = how or StartOptions()
    with group or Group(order(entries, (place or Placement()).wiring), settings) as conns:
        training = HostsTraining(conns, entries, settings, place, fetch_every, on_start)
        ref = training.start(plan, how, out, progress)
        if detach:
            out.info(training.detached(ref))
            return 0
        return training.follow_and_tell(ref, how.notify, out, verbose=verbose)


class HostsTraining:
    """`train` on SSH hosts through the backend's verbs, with what following a run from here
    adds on hosts: its checkpoints fetched meanwhile (`fetch_every`), the hosts powered off
    after it (`how.down_after_run`), every rank's stacks taken when it hangs. `on_start`:
    told the run once it has started (a sweep, a supervisor)."""

    def __init__(
        self,
        group: Group,
        entries: list[HostEntry],
        settings: Settings,
        place: Placement | None = None,
        fetch_every: float | None = None,
        on_start: Callable[[RunRef], None] | None = None,
    ):
        place = place or Placement()
        self.entries = order(entries, place.wiring)
        self.group, self.settings = group, settings
        self.backend = HostsBackend(group, self.entries, place)
        self.capabilities = self.backend.capabilities
        self.fetch_every, self.on_start = fetch_every, on_start
        self.down: DownAfterRun | None = None
        self.plan: Plan | None = None

    def prepare(self, plan: Plan, how: StartOptions | None = None) -> Prepared:
        return self.backend.prepare(plan, how)

    def start(
        self,
        plan: Plan,
        how: StartOptions,
        out: Reporter,
        progress: TransferProgress | None = None,
    ) -> RunRef:
        if how.down_after_run:
            self.down = DownAfterRun(self.group, self.entries, self.settings)
            self.down.preflight()
        self.plan = plan
        ref = self.backend.start(plan, how, out, progress)
        if self.on_start is not None:
            self.on_start(ref)
        return ref

    def detached(self, ref: RunRef) -> str:
        rid = ref.run_id
        return f"follow it with `vmrun logs -f {rid}`; stop it with `vmrun stop {rid}`"

    def follow_and_tell(
        self, ref: RunRef, notify: Notify | None, out: Reporter, *, verbose: bool = False
    ) -> int:
        """Follow the started run to its end and tell the end (a detach tells nothing: the
        run goes on, and its master tells its own end)."""
        assert self.plan is not None
        try:
            with naming_refusals(out) as watched:  # a container its runtime would not start
                done = _follow(
                    self.backend, ref, self.plan, watched, self.fetch_every, verbose, self.down
                )
        except (Detached, Interrupted):
            raise  # the run goes on: its master tells its end
        except VmrunError as failure:
            _tell_end(self.group, ref, notify, out, failure)
            raise
        _tell_end(self.group, ref, notify, out)
        return done


def _tell_end(
    conns: Group,
    ref: RunRef,
    notify: Notify | None,
    out: Reporter,
    failure: VmrunError | None = None,
) -> None:
    """The run's end to its notification targets (the master's record claims it)."""
    if not notify or not ref.nodes:
        return
    from vmrun.backends.hosts.records import record_dir
    from vmrun.notify.tell import tell_end

    tell_end(
        conns.connections.get(ref.nodes[0]),
        record_dir(ref.run_id),
        notify,
        out,
        run_id=ref.run_id,
        where=", ".join(ref.nodes),
        failure=failure,
    )


def _follow(
    backend: HostsBackend,
    ref: RunRef,
    plan: Plan,
    out: Reporter,
    fetch_every: float | None,
    verbose: bool = False,
    down: DownAfterRun | None = None,
) -> int:
    if plan.hang_timeout:
        out = HangSpotter(out, backend, ref, plan.project)
    fetcher = None
    if fetch_every:
        from vmrun.backends.hosts.fetching import Fetcher

        fetcher = Fetcher(backend.group, ref.nodes, ref.run_id, plan.project, fetch_every, out)
        fetcher.start()
    try:
        backend.follow(ref, out, announce=fetcher is None, verbose=verbose)
    except (Detached, Interrupted):
        if fetcher:  # at once: a round under way resumes next time, from its partial files
            fetcher.abandon()
        if down:
            out.info("--down-after-run: the hosts stay up, as the run goes on without vmrun")
        raise
    except BaseException:
        if fetcher and down:  # it ended badly; all it made comes here before the power-off
            try:
                down.after(ref.run_id, fetcher.finish(results=True), out)
            except VmrunError as exc:  # said; the run's own failure is what is raised
                out.info(exc.one_line())
        elif fetcher:  # the newest snapshot matters most when a node has failed
            fetcher.finish(results=False)
            fetcher.round("checkpoints")
        raise
    if fetcher:
        failed = fetcher.finish(results=True)
        rid = ref.run_id
        out.info(f"run {rid} finished on {', '.join(ref.nodes)}; its files are in results/{rid}/")
        if down:
            down.after(rid, failed, out)
    return 0


class HangSpotter(Passing):
    """The follower's part when a node says the run hung (hostside/hang_watch.py): every
    rank's stacks on every node taken from here at once, the silent nodes' too (a node
    whose ranks print nothing and beat nothing never judges itself), shown grouped and kept
    in results/RUN/stacks/hang-live-N. Everything else passes through to `out`."""

    MARK = b"vmrun: hung on "
    AGAIN = b"vmrun: progress again on "

    def __init__(self, out: Reporter, backend: HostsBackend, ref: RunRef, project: Path):
        super().__init__(out)
        self.backend, self.ref, self.project = backend, ref, project
        self.taken = 0
        self._lock = threading.Lock()
        self._armed = True  # once per stall: the other nodes say the same one

    def progress(self, *, several: bool = False, live: bool = True) -> Progress:
        return self.out.progress(several=several, live=live)

    def output(self, data: bytes) -> None:
        self.out.output(data)
        with self._lock:
            if self.AGAIN in data:
                self._armed = True
                return
            if self.MARK not in data or not self._armed:
                return
            self._armed = False
        threading.Thread(target=self._take, daemon=True, name="hang-stacks").start()

    def _take(self) -> None:
        from vmrun.backends.hosts.stacks import take_on_nodes
        from vmrun.runs.stacks import keep, lines

        try:
            got = take_on_nodes(self.backend.group, self.ref)
            if got.stacks:
                self.taken += 1
                folder = keep(
                    got.stacks,
                    self.project
                    / "results"
                    / self.ref.run_id
                    / "stacks"
                    / f"hang-live-{self.taken}",
                )
                self.out.info(f"every rank's stacks now (kept in {folder}):")
                for line in lines(got.stacks):
                    self.out.info(f"  {line}")
            for node, why in got.failed.items():
                self.out.warn(f"{node}: no stacks taken: {why}")
        except VmrunError as exc:
            self.out.warn(f"the stacks were not taken from here: {exc.one_line()}")
