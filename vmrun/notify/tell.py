"""A followed run's end, told from this machine: the run's record (on its master host, or a
cluster's shared filesystem through the login node) renders the message and claims the event
in one round trip (vmrun/hostside/notify_send.py `render`), so the run's own sender, which
tells the end where the run ends, and this follower never both send. This machine sends what
that sender did not: everything when it claimed first, else the services a host cannot reach
by webhook (mail and the like); and it adds why a run failed, which only the follower knows
(a node's failure stops the others)."""

from __future__ import annotations

import json

from vmrun import hostside
from vmrun.errors import VmrunError
from vmrun.notify.send import Notify, message, report, send
from vmrun.reporting import Reporter
from vmrun.ssh.connection import Connection
from vmrun.ssh.quoting import plain_command


def tell_end(
    conn: Connection | None,
    record: str,
    notify: Notify,
    out: Reporter,
    *,
    run_id: str,
    where: str,
    failure: VmrunError | None = None,
    event: str = "",
) -> None:
    """Tell run `run_id`'s end (`failure`: why it failed, as the follower saw it), or
    another `event` it saw (`requeue`); `record`: its record folder on `conn`'s host."""
    if not notify:
        return
    code = "0" if failure is None else str(getattr(failure, "exit_status", None) or "?")
    if event:
        code = "-"
    event = event or ("fail" if failure is not None else "end")
    answer = _render(conn, record, event, code) if conn is not None else {}
    if not answer:  # the host could not say (no python3 there): it told nothing either
        if event not in notify.on:
            return
        title, body = message(
            event, run=run_id, exit=code, where=where, fetch=f"vmrun fetch results --run {run_id}"
        )
        answer = {"send": "all", "title": title, "body": body, "event": event}
    how = answer.get("send", "none")
    if how == "none":
        return
    targets = notify.targets if how == "all" else notify.local_only
    body = answer.get("body", "")
    if failure is not None:
        body += f"\nwhy: {failure.one_line()}"
    what = answer.get("event", "end")
    report(send(targets, answer.get("title", ""), body, what), out, what)


def _render(conn: Connection, record: str, event: str, code: str) -> dict[str, str]:
    argv = hostside.command("notify_send.py", record, "render", event, code)
    try:
        _, text, _ = conn.capture(plain_command(argv), what="the run's notification")
        answer = json.loads(text.decode(errors="replace").strip().splitlines()[-1])
    except (VmrunError, ValueError, IndexError):
        return {}
    return answer if isinstance(answer, dict) else {}
