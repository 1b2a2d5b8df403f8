"""`vmrun tensorboard [RUN] [-H HOST | -C CLUSTER] [--logdir DIR]... [--port N] [--local]`: a run's
TensorBoard in this machine's browser.

By default TensorBoard runs where the files are (vmrun.operations.tensorboard finds that
place: the run's master node, or a cluster's login node; vmrun.runs.tensorboard runs it
there) and is forwarded here over vmrun's connection (vmrun.ssh.forward); with --local the
event files are fetched here round after round and a local TensorBoard serves them
(vmrun.runs.tensorboard_local).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    ClusterName,
    Hosts,
    Reach,
    reaching,
    refuse_with_cluster,
)
from vmrun.cli.output import say
from vmrun.operations.tensorboard import DEFAULT_PORT

if TYPE_CHECKING:
    from vmrun.operations.tensorboard import Serving


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
    @reaching(parallel=False)
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
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.tensorboard import check, serving
        from vmrun.operations.tensorboard import place as find_place

        refuse_with_cluster(cluster, host)
        extra = list(logdir or [])
        check(extra, local=local)
        settings = reach.settings()
        with find_place(settings, run, hosts=host, cluster=cluster) as place:
            board = serving(
                settings, place, extra, port=port, local=local, every=every, out=TERMINAL
            )
            return _serve(board)


def _serve(board: Serving) -> int:
    """Start it, say where, print its URL on stdout; serve until Ctrl-C."""
    from vmrun.cli.terminal import TERMINAL

    try:
        board.start()
        if board.moved:
            TERMINAL.info(board.moved)
        TERMINAL.info(f"{board.what}; Ctrl-C to stop")
        say(board.url)
        board.wait()
    except KeyboardInterrupt:
        TERMINAL.info(board.stop())
    finally:
        board.close()
    return 0
