"""`vmrun logs [RUN] [-f] [-n N] [--node H]`: a run's output, once or followed to the end.

A run on several hosts shows every node's log, each line prefixed `[host rankN]` (node by
node, or merged live with -f, which also applies the failure rule of `vmrun train`: a node
that fails stops the run on the others).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from vmrun.cli.options import AcceptNewHostKey, ConnectTimeout, Hosts, settings_from
from vmrun.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command(
        "logs",
        help="Show a run's log (default: the newest run); -f follows it until"
        " the run ends and exits with the run's exit code. A multi-node run shows every"
        " node, lines prefixed [host rankN]; --node picks one.",
    )
    def logs_command(
        run: Annotated[str | None, typer.Argument(metavar="[RUN]", show_default=False)] = None,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", help="Follow until the run ends.")
        ] = False,
        lines: Annotated[
            int, typer.Option("--lines", "-n", metavar="N", help="Only the last N lines (0: all).")
        ] = 0,
        node: Annotated[
            list[str] | None,
            typer.Option("--node", metavar="HOST", help="Only this node's log; repeatable."),
        ] = None,
        host: Hosts = None,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.runs import records as runs
        from vmrun.runs.nodes import Prefixer
        from vmrun.ssh.group import Group
        from vmrun.ssh.inventory import select_hosts

        if lines < 0:
            raise UsageError(f"--lines must be >= 0, got {lines}")
        settings = settings_from(connect_timeout, accept_new_host_key)
        entries = select_hosts(host, settings)

        def show(data: bytes) -> None:
            sys.stdout.write(data.decode("utf-8", "replace"))
            sys.stdout.flush()

        def note(text: str) -> None:
            sys.stderr.write(f"vmrun: {text}\n")
            sys.stderr.flush()

        with Group(entries, settings) as group:
            run_id, found = runs.find_run(group, run)
            several = len(found) > 1 or len(found[0][1].meta.get("nodes") or []) > 1
            if node:
                chosen = [(e, r) for e, r in found if {e.label, e.name, e.spec.label} & set(node)]
                if not chosen:
                    names = ", ".join(e.label for e, _ in found)
                    raise UsageError(
                        f"run {run_id} has no node {', '.join(node)} (it ran on {names})"
                    )
                found = chosen
            conns = [group.connections[e.label] for e, _ in found]
            if not follow:
                for conn in conns:
                    out = Prefixer(conn.label, show) if several else None
                    runs.read_log(conn, run_id, out.feed if out else show, last=lines)
                    if out:
                        out.flush()
                return 0
            try:
                if len(conns) > 1:
                    from vmrun.runs.nodes import follow_nodes

                    follow_nodes(conns, run_id, show, note, last=lines)
                    return 0
                out = Prefixer(conns[0].label, show) if several else None
                runs.follow(conns[0], run_id, out.feed if out else show, last=lines)
                if out:
                    out.flush()
            except KeyboardInterrupt:
                from vmrun.errors import Interrupted

                raise Interrupted(f"stopped following {run_id}; the run goes on") from None
            (record,) = runs.list_runs(conns[0], [run_id])
        if record.state == "stopped":
            sys.stderr.write(f"vmrun: run {run_id} was stopped\n")
        code = record.exit_code
        return code if code is not None and 0 <= code < 256 else 1
