"""`vmrun forward [LOCAL:]PORT [-H HOST | -C CLUSTER [--node NODE]] [--local-port N]`: a port
of a host (or of a cluster's compute node, through the login node) on this machine's
127.0.0.1, over vmrun's own SSH connection (vmrun.operations.forward), until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

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
from vmrun.errors import UsageError

PortArg = Annotated[str, typer.Argument(metavar="[LOCAL:]PORT", show_default=False)]


def register(app: typer.Typer) -> None:
    @app.command(
        "forward",
        help="Forward 127.0.0.1:PORT here (LOCAL:PORT: 127.0.0.1:LOCAL, as ssh -L takes it)"
        " to the host's 127.0.0.1:PORT (a notebook, a dashboard) over vmrun's SSH"
        " connection: nothing is opened on the host's firewall."
        " With -C CLUSTER --node NODE, to NODE:PORT through the login node (Jupyter in a"
        " job). Prints the URL; runs until Ctrl-C.",
    )
    @reaching(parallel=False)
    def forward_command(
        ports: PortArg,
        host: Hosts = None,
        cluster: ClusterName = None,
        node: Annotated[
            str | None,
            typer.Option(
                "--node",
                metavar="NODE",
                help="Forward to NODE:PORT as the host (or the login node) reaches it"
                " [default: the host itself].",
            ),
        ] = None,
        local_port: Annotated[
            int | None,
            typer.Option(
                "--local-port",
                metavar="N",
                min=0,
                max=65535,
                help="The port here [default: PORT; the next free one if it is taken].",
            ),
        ] = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.operations.forward import forwarding
        from vmrun.ssh.forward import moved_line, parse_ports

        refuse_with_cluster(cluster, host)
        local, port = parse_ports(ports)
        if local is not None and local_port is not None:
            raise UsageError(f"{ports} names the local port already; drop --local-port")
        if node is not None and (not node.strip() or any(c.isspace() for c in node)):
            raise UsageError(f"--node {node!r}: expected a host name or address")
        settings = reach.settings()
        wanted = local if local is not None else port if local_port is None else local_port
        with forwarding(
            settings,
            port,
            hosts=host,
            cluster=cluster,
            node=node,
            local_port=wanted,
            exact=local is not None,
            out=TERMINAL,
        ) as fwd:
            try:
                moved = moved_line(wanted, fwd.port)
                if moved:
                    TERMINAL.info(moved)
                if not fwd.probe():
                    TERMINAL.info(f"nothing answers at {fwd.where} yet; forwarding anyway")
                say(f"http://127.0.0.1:{fwd.port}/")
                TERMINAL.info(f"forwarding to {fwd.where}; Ctrl-C to stop")
                fwd.wait()
            except KeyboardInterrupt:
                fwd.stop()
                TERMINAL.info(f"stopped forwarding port {fwd.port}")
        return 0
