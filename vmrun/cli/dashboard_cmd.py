"""`vmrun dashboard [--port N] [--open] [--bind ADDR]`: every run, its live log, metrics,
stacks and stop on one page in a browser, served from here (vmrun.dashboard.server)."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.options import NO_FLAGS, ClusterName, Hosts, Reach, reaching, refuse_with_cluster
from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command(
        "dashboard",
        help="Serve a page of every run (as `status` lists them), each run's live log,"
        " charts, events, files to fetch, stacks and a stop button, each sweep's report and"
        " every GPU, from this machine over the same SSH connections (one per host)."
        " Prints its address with a one-time token; Ctrl-C ends it."
        " Needs `pip install 'vmrun[dashboard]'`.",
    )
    @reaching()
    def dashboard_command(
        port: Annotated[
            int | None,
            typer.Option(
                "--port", metavar="N", help="Listen on this port (default: 8777, else any free)."
            ),
        ] = None,
        open_browser: Annotated[
            bool, typer.Option("--open", help="Open the page in the default browser.")
        ] = False,
        bind: Annotated[
            str,
            typer.Option(
                "--bind",
                metavar="ADDR",
                help="The address to listen on (default 127.0.0.1: this machine only; the"
                " token still guards any other).",
            ),
        ] = "127.0.0.1",
        host: Hosts = None,
        cluster: ClusterName = None,
        store: Annotated[
            str | None,
            typer.Option(
                "--store",
                metavar="s3://BUCKET/PREFIX",
                help="List the runs kept in this bucket place too (default: vmrun.toml's"
                " `store`, where it has one), as `status --store` does.",
            ),
        ] = None,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.cli.terminal import TERMINAL
        from vmrun.dashboard.server import check_extra, serve

        check_extra(imported=False)  # imported once the address is printed
        refuse_with_cluster(cluster, host)
        settings = reach.settings()
        if store is not None:
            from vmrun.store_url import parse_store

            parse_store(store)  # a bad place refused now, not on the page

        def opened(url: str) -> None:
            say(url)
            TERMINAL.info("the dashboard is served at the address above; Ctrl-C to stop")
            if open_browser:
                import webbrowser

                webbrowser.open(url)

        serve(
            settings, hosts=host, cluster=cluster, port=port, bind=bind, opened=opened, store=store
        )
        return 0
