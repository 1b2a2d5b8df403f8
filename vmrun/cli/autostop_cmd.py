"""`vmrun autostop [PERIOD]`: a watchdog on each host powers it off once it has been idle for
PERIOD; `--status` shows what each one is doing, `--cancel` removes it. The work is
vmrun.operations.autostop's; this module renders it (`vmrun setup` ends with `apply`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from vmrun.cli.options import (
    NO_FLAGS,
    Hosts,
    Reach,
    reaching,
)
from vmrun.cli.output import say
from vmrun.errors import UsageError

if TYPE_CHECKING:
    from vmrun.autostop.watchdog import Installed
    from vmrun.config import Settings
    from vmrun.operations.autostop import Applied
    from vmrun.ssh.inventory import HostEntry


def register(app: typer.Typer) -> None:
    @app.command(
        "autostop",
        help="Install on each host a watchdog that powers it off (sudo -n shutdown -h now, or"
        " autostop_command) once it has been idle for PERIOD: no vmrun run alive, every GPU"
        " under the threshold, no login session in use. It starts again at boot.",
    )
    @reaching()
    def autostop_command(
        period: Annotated[
            str | None,
            typer.Argument(
                metavar="[PERIOD]",
                help="30m, 2h, 1h30m, 90s. Default: autostop in vmrun.toml (per host, or for"
                " the project).",
                show_default=False,
            ),
        ] = None,
        host: Hosts = None,
        status: Annotated[
            bool,
            typer.Option(
                "--status",
                help="Per host: the period, idle for how long, what keeps it awake, when it"
                " powers off.",
            ),
        ] = False,
        cancel: Annotated[
            bool,
            typer.Option(
                "--cancel", help="Remove the watchdog completely (process, boot entry, files)."
            ),
        ] = False,
        reach: Reach = NO_FLAGS,
    ) -> int:
        from vmrun.ssh.inventory import select_hosts

        if status and cancel:
            raise UsageError("--status and --cancel: use one")
        if period is not None and (status or cancel):
            flag = "--status" if status else "--cancel"
            raise UsageError(f"{flag} takes no period; drop {period}")
        if period is not None:
            from vmrun.setting_types import period_seconds

            period_seconds(period, what="PERIOD")
        settings = reach.settings(autostop=period)
        entries = select_hosts(host, settings)
        if status:
            return _status(entries, settings)
        if cancel:
            return _cancel(entries, settings)
        return apply(entries, settings, required=True)


def apply(entries: Sequence[HostEntry], settings: Settings, *, required: bool) -> int:
    """Install (or update) the watchdog where autostop is on (vmrun.operations.autostop's
    `install`) and say what each host got; `vmrun setup` ends with it too."""
    from vmrun.operations.autostop import install

    return render_applied(install(settings, entries, required=required))


def render_applied(applied: Applied) -> int:
    """What each host got from an install (`vmrun autostop`, the end of `vmrun setup`)."""
    from vmrun.cli.output import error_line, report

    for label in applied.off:
        say(f'{label}: autostop is off for it (autostop = "off"); left as it is')
    if applied.refused:
        for failed in applied.checked:
            if failed.error is not None:
                report(failed.error)
        if len(applied.checked) > 1:
            error_line(
                "autostop was installed on no host; fix the one(s) above and retry",
                code="hosts-failed",
            )
        return applied.exit_code
    for outcome in applied.outcomes:
        if outcome.error is not None:
            report(outcome.error)
        elif outcome.value is not None:
            said = _installed(outcome.value)
            cfg = applied.configs[outcome.host]
            say(f"{outcome.host}: autostop {cfg.describe()}; {said}")
    return applied.exit_code


def _installed(done: Installed) -> str:
    boot = {"cron": "crontab @reboot", "systemd": "a systemd unit"}.get(done.boot.split()[0], "?")
    if not done.changed:
        return f"already so, nothing changed (watchdog pid {done.pid}; at boot: {boot})"
    if done.how == "running":
        return f"settings updated: watchdog pid {done.pid} reads them at its next check"
    return f"watchdog pid {done.pid} {done.how}; at boot: {boot}"


def _status(entries: Sequence[HostEntry], settings: Settings) -> int:
    from vmrun.autostop.status import clock_text
    from vmrun.cli.output import report
    from vmrun.operations.autostop import status
    from vmrun.setting_types import format_period

    found = status(settings, entries)
    rows = []
    for outcome in found.outcomes:
        st = outcome.value
        if st is None:
            continue
        idle = st.idle_for() if st.alive and not st.awake else None
        off = st.off_at() if st.alive and not st.awake and not st.block else None
        rows.append(
            (
                st.host,
                st.period_text(),
                "-" if idle is None else format_period(idle),
                st.keeping_awake(),
                "-" if off is None else clock_text(off),
            )
        )
    _table(("HOST", "PERIOD", "IDLE FOR", "KEEPING AWAKE", "POWERS OFF AT"), rows)
    for outcome in found.outcomes:
        if outcome.error is not None:
            report(outcome.error)
    return found.exit_code


def _cancel(entries: Sequence[HostEntry], settings: Settings) -> int:
    from vmrun.cli.output import report
    from vmrun.operations.autostop import cancel

    cancelled = cancel(settings, entries)
    for outcome in cancelled.outcomes:
        done = outcome.value
        if outcome.error is not None:
            report(outcome.error)
        elif done is not None and not (done.removed or done.killed):
            say(f"{done.host}: autostop was not installed; nothing to remove")
        elif done is not None:
            pids = ", ".join(map(str, done.killed))
            stopped = [f"watchdog pid {pids} stopped"] if done.killed else []
            said = ", ".join([*stopped, *(f"{what} removed" for what in done.removed)])
            say(f"{done.host}: autostop removed: {said}")
    return cancelled.exit_code


def _table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    if not rows:
        from vmrun.cli.terminal import TERMINAL

        TERMINAL.info("no host answered")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        say("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
