"""`vmrun tensorboard [RUN] [-H HOST | -C CLUSTER] [--logdir DIR]... [--port N] [--local]`: a run's
TensorBoard in this machine's browser.

By default TensorBoard runs where the files are (vmrun.runs.tensorboard: the run's master
node, or a cluster's login node) and is forwarded here over vmrun's connection
(vmrun.ssh.forward); with --local the event files are fetched here round after round and a
local TensorBoard serves them (vmrun.runs.tensorboard_local).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vmrun.cli.options import (
    AcceptNewHostKey,
    ClusterName,
    ConnectTimeout,
    Hosts,
    refuse_with_cluster,
    settings_from,
)

if TYPE_CHECKING:
    from vmrun.config import Settings
    from vmrun.runs.outputs import RunLocation
    from vmrun.runs.tensorboard import LogDir
    from vmrun.ssh.connection import Connection

DEFAULT_PORT = 6006  # TensorBoard's own


@dataclass(frozen=True)
class Place:
    """The node that has a run's files, and what TensorBoard needs to know there."""

    conn: Connection
    run_id: str
    python: str
    meta: Any
    location: RunLocation
    fix: str  # how to get tensorboard into that python


def register(app: typer.Typer) -> None:
    @app.command(
        "tensorboard",
        help="Serve a run's TensorBoard (default: the newest run) at http://127.0.0.1:PORT/"
        " here: TensorBoard runs on the host with the run's python and is forwarded over"
        " vmrun's SSH connection; it is stopped there on Ctrl-C or when the connection"
        " goes. Logs: the run's output folder, runs/ and lightning_logs/ of its work"
        " directory, and every --logdir. --local fetches the event files and serves"
        " them from this machine instead.",
    )
    def tensorboard_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        logdir: Annotated[
            list[str] | None,
            typer.Option(
                "--logdir",
                metavar="DIR",
                help="Also this folder on the host (relative to the run's work directory,"
                " ~/DIR or absolute); repeatable.",
            ),
        ] = None,
        port: Annotated[
            int,
            typer.Option(
                "--port",
                metavar="N",
                min=0,
                max=65535,
                help="The port here (the next free one if it is taken).",
            ),
        ] = DEFAULT_PORT,
        local: Annotated[
            bool,
            typer.Option("--local", help="Fetch the event files and run TensorBoard here."),
        ] = False,
        every: Annotated[
            float,
            typer.Option(
                "--every",
                metavar="SECONDS",
                min=0.5,
                help="With --local: fetch new events this often.",
            ),
        ] = 10.0,
        host: Hosts = None,
        cluster: ClusterName = None,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.errors import VmrunError
        from vmrun.runs.tensorboard import host_path, log_dirs

        refuse_with_cluster(cluster, host)
        extra = list(logdir or [])
        for item in extra:
            host_path(item, "")  # a bad --logdir fails before any connection
        if local:
            from vmrun.runs.tensorboard_local import tensorboard_here

            if not tensorboard_here():
                raise VmrunError(
                    "tensorboard is not installed here",
                    hint="`pip install tensorboard`, or run it on the host: drop --local",
                    code="tensorboard-missing",
                )
        settings = settings_from(connect_timeout, accept_new_host_key)
        with _place(settings, run, host, cluster) as place:
            dirs = log_dirs(place.meta, place.location.out_dir, extra)
            if local:
                return _serve_local(settings, place, dirs, port, every)
            return _serve_remote(place, dirs, port)


@contextmanager
def _place(
    settings: Settings, run: str | None, host: list[str] | None, cluster: str | None
) -> Iterator[Place]:
    """The run (the newest unless named) and the node with its files: a multi-node run's
    master; on a cluster, the login node (the files are on the shared filesystem)."""
    if cluster:
        from vmrun.backends.slurm.session import cluster_backend

        with cluster_backend(settings, cluster) as slurm:
            ref = slurm.find(run)
            fix = f"`vmrun setup -C {cluster} --pip tensorboard`"
            yield Place(slurm.conn, ref.run_id, slurm.python(), ref.meta,
                        slurm.outputs(ref)[cluster], _fix(fix, ref.run_id))  # fmt: skip
        return
    from vmrun.backends.hosts.backend import HostsBackend
    from vmrun.ssh.group import Group
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(host, settings)
    with Group(entries, settings) as group:
        backend = HostsBackend(group)
        ref = backend.find(run)
        node = str(ref.meta.get("master") or ref.nodes[0])
        if node not in ref.records:
            node = ref.nodes[0]
        meta = ref.records[node].meta
        fix = f"`vmrun setup --pip tensorboard -H {node}`"
        yield Place(backend.conn(node), ref.run_id, str(meta.get("python") or "python3"),
                    meta, backend.outputs(ref)[node], _fix(fix, ref.run_id))  # fmt: skip


def _fix(setup: str, run_id: str) -> str:
    return (
        f"install it with {setup}, or view the run from here: `vmrun tensorboard {run_id} --local`"
    )


def _serve_remote(place: Place, dirs: list[LogDir], port: int) -> int:
    from vmrun.cli.output import info_line
    from vmrun.errors import ConnectionLostError
    from vmrun.runs.tensorboard import HostBoard
    from vmrun.ssh.forward import Forward, moved_line

    label = place.conn.label
    board = HostBoard(place.conn, place.python, dirs, fix=place.fix)
    fwd: Forward | None = None
    try:
        remote_port = board.start()
        fwd = Forward(place.conn, "127.0.0.1", remote_port, local_port=port).start()
        moved = moved_line(port, fwd.port)
        if moved:
            info_line(moved)
        served = ", ".join(folder for _, folder in board.served)
        info_line(f"TensorBoard for run {place.run_id} on {label} ({served}); Ctrl-C to stop")
        print(f"http://127.0.0.1:{fwd.port}/", flush=True)
        while True:
            board.check()
            try:
                fwd.wait(0.5)
            except ConnectionLostError:
                board.ended(2.0)  # the same loss in TensorBoard's words, if it sees it too
                board.check()
                raise
    except KeyboardInterrupt:
        gone = board.stop()
        info_line(
            f"stopped TensorBoard on {label}"
            if gone
            else f"closed TensorBoard's channel; {label} stops it when it notices"
        )
        return 0
    finally:
        board.stop()
        if fwd is not None:
            fwd.stop()


def _serve_local(
    settings: Settings, place: Place, dirs: list[LogDir], port: int, every: float
) -> int:
    from pathlib import Path

    from vmrun.cli.output import TERMINAL, info_line
    from vmrun.runs.outputs import local_run_dir
    from vmrun.runs.tensorboard_local import LocalBoard, fetch_specs
    from vmrun.ssh.forward import moved_line

    dest = settings.project_dir or Path.cwd()
    logdir = dest / local_run_dir(place.run_id, None)
    specs = fetch_specs(place.location, dirs)
    board = LocalBoard(place.conn, specs, dest, logdir, every=every, out=TERMINAL)
    try:
        local_port = board.start(port)
        moved = moved_line(port, local_port)
        if moved:
            info_line(moved)
        info_line(
            f"TensorBoard here for run {place.run_id} ({logdir}, {board.fetched} file(s)"
            f" fetched; again every {every:g} s); Ctrl-C to stop"
        )
        print(f"http://127.0.0.1:{local_port}/", flush=True)
        while True:
            board.check()
            board.wait(0.5)
    except KeyboardInterrupt:
        board.stop()
        info_line("stopped TensorBoard here")
        return 0
    finally:
        board.stop()
