"""A run's TensorBoard in this machine's browser. `place` finds the node that has the run's
files (a multi-node run's master; on a cluster, the login node, over the shared filesystem);
`serving` runs TensorBoard there with the run's python and forwards it here over vmrun's
connection (vmrun.runs.tensorboard, vmrun.ssh.forward), or with --local fetches the event
files here round after round and serves them from here (vmrun.runs.tensorboard_local)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vmrun.reporting import QUIET, Reporter

if TYPE_CHECKING:  # this module is imported for --help (DEFAULT_PORT): nothing heavy
    from vmrun.config import Settings
    from vmrun.runs.outputs import RunLocation
    from vmrun.runs.tensorboard import LogDir
    from vmrun.ssh.connection import Connection
    from vmrun.ssh.forward import Forward

DEFAULT_PORT = 6006  # TensorBoard's own


def check(logdirs: Sequence[str] = (), *, local: bool = False) -> None:
    """What fails before any connection: a bad --logdir; for `local`, no tensorboard here."""
    from vmrun.errors import VmrunError
    from vmrun.runs.tensorboard import host_path

    for item in logdirs:
        host_path(item, "")
    if local:
        from vmrun.runs.tensorboard_local import tensorboard_here

        if not tensorboard_here():
            raise VmrunError(
                "tensorboard is not installed here",
                hint="`pip install tensorboard`, or run it on the host: drop --local",
                code="tensorboard-missing",
            )


@dataclass(frozen=True)
class Place:
    """The node that has a run's files, and what TensorBoard needs to know there."""

    conn: Connection
    run_id: str
    python: str
    record: Any  # its run.json (vmrun.results.record.RunRecord)
    location: RunLocation
    fix: str  # how to get tensorboard into that python


@contextmanager
def place(
    settings: Settings,
    run: str | None = None,
    *,
    hosts: list[str] | None = None,
    cluster: str | None = None,
) -> Iterator[Place]:
    """The run (the newest unless named) and the node with its files: a multi-node run's
    master; on a cluster, the login node (the files are on the shared filesystem)."""
    from vmrun.backends.select import open_backend

    with open_backend(settings, hosts=hosts, cluster=cluster) as backend:
        ref = backend.find(run)
        at = backend.files_at(ref)
        fix = f"`vmrun setup --pip tensorboard {at.selector}`"
        record = ref.records[at.node].record if at.node in ref.records else ref.record
        yield Place(at.conn, ref.run_id, at.python, record, at.location, _fix(fix, ref.run_id))


def _fix(setup: str, run_id: str) -> str:
    return (
        f"install it with {setup}, or view the run from here: `vmrun tensorboard {run_id} --local`"
    )


class Serving:
    """TensorBoard for a placed run, served at http://127.0.0.1:`port`/ here: `start` it,
    `wait` (until Ctrl-C, or a failure raises), `stop` it (what happened, in words), and
    `close` it whatever happened."""

    port = 0
    moved = ""  # the port asked for was taken: which one it is instead, in words
    what = ""  # what is served, where

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None: ...

    def wait(self) -> None: ...

    def stop(self) -> str:
        return ""

    def close(self) -> None: ...


def serving(
    settings: Settings,
    place: Place,
    logdirs: Sequence[str] = (),
    *,
    port: int = DEFAULT_PORT,
    local: bool = False,
    every: float = 10.0,
    out: Reporter = QUIET,
) -> Serving:
    """TensorBoard where the files are (forwarded here), or with `local` here over event
    files fetched every `every` seconds; over the run's output folder, runs/ and
    lightning_logs/ of its work directory, and `logdirs` (on the host)."""
    from vmrun.runs.tensorboard import log_dirs

    dirs = log_dirs(place.record, place.location.out_dir, list(logdirs))
    if local:
        return _Here(settings, place, dirs, port, every, out)
    return _OnHost(place, dirs, port)


class _OnHost(Serving):
    """On the place's node with the run's python, forwarded over vmrun's connection."""

    def __init__(self, place: Place, dirs: list[LogDir], port: int) -> None:
        from vmrun.runs.tensorboard import HostBoard

        self.place, self.wanted = place, port
        self.board = HostBoard(place.conn, place.python, dirs, fix=place.fix)
        self.fwd: Forward | None = None

    def start(self) -> None:
        from vmrun.ssh.forward import Forward, moved_line

        remote_port = self.board.start()
        self.fwd = Forward(self.place.conn, "127.0.0.1", remote_port, local_port=self.wanted)
        self.fwd.start()
        self.port = self.fwd.port
        self.moved = moved_line(self.wanted, self.port) or ""
        served = ", ".join(folder for _, folder in self.board.served)
        self.what = f"TensorBoard for run {self.place.run_id} on {self.place.conn.label} ({served})"

    def wait(self) -> None:
        from vmrun.errors import ConnectionLostError

        assert self.fwd is not None
        while True:
            self.board.check()
            try:
                self.fwd.wait(0.5)
            except ConnectionLostError:
                self.board.ended(2.0)  # the same loss in TensorBoard's words, if it sees it too
                self.board.check()
                raise

    def stop(self) -> str:
        label = self.place.conn.label
        if self.board.stop():
            return f"stopped TensorBoard on {label}"
        return f"closed TensorBoard's channel; {label} stops it when it notices"

    def close(self) -> None:
        self.board.stop()
        if self.fwd is not None:
            self.fwd.stop()


class _Here(Serving):
    """Here, over the run's event files fetched round after round into results/<run>/."""

    def __init__(
        self,
        settings: Settings,
        place: Place,
        dirs: list[LogDir],
        port: int,
        every: float,
        out: Reporter,
    ) -> None:
        from pathlib import Path

        from vmrun.runs.outputs import local_run_dir
        from vmrun.runs.tensorboard_local import LocalBoard, fetch_specs

        dest = settings.project_dir or Path.cwd()
        self.logdir = dest / local_run_dir(place.run_id, None)
        specs = fetch_specs(place.location, dirs)
        self.board = LocalBoard(place.conn, specs, dest, self.logdir, every=every, out=out)
        self.place, self.wanted, self.every = place, port, every

    def start(self) -> None:
        from vmrun.ssh.forward import moved_line

        self.port = self.board.start(self.wanted)
        self.moved = moved_line(self.wanted, self.port) or ""
        self.what = (
            f"TensorBoard here for run {self.place.run_id} ({self.logdir},"
            f" {self.board.fetched} file(s) fetched; again every {self.every:g} s)"
        )

    def wait(self) -> None:
        while True:
            self.board.check()
            self.board.wait(0.5)

    def stop(self) -> str:
        self.board.stop()
        return "stopped TensorBoard here"

    def close(self) -> None:
        self.board.stop()
