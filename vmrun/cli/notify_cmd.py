"""`vmrun notify [--test] [URL...]`: the notification targets, and a test message to each."""

from __future__ import annotations

from typing import Annotated

import typer

from vmrun.cli.output import say


def register(app: typer.Typer) -> None:
    @app.command(
        "notify",
        help="List where runs' ends are told (the `notify` setting, or the URLs given), which"
        " of them a host can tell by itself (webhooks: ntfy, Slack, Discord, JSON) and which"
        " only this machine (mail...); --test sends a test message to each and says whether"
        " it arrived.",
    )
    def notify_command(
        urls: Annotated[
            list[str] | None,
            typer.Argument(metavar="[URL]...", help="Apprise URLs [default: the notify setting]."),
        ] = None,
        test: Annotated[bool, typer.Option("--test", help="Send a test message to each.")] = False,
    ) -> int:
        from vmrun.cli.options import settings_from
        from vmrun.cli.terminal import TERMINAL
        from vmrun.errors import UsageError, VmrunError
        from vmrun.operations import notify

        found = notify.targets(settings_from(), urls or [])
        if not found:
            raise UsageError(
                'no notification target: set `notify = ["ntfy://TOPIC"]` in vmrun.toml or'
                " ~/.config/vmrun/config.toml, or give a URL",
                code="notify-url-bad",
            )
        if not test:
            for target in found:
                where = "from the hosts and here" if target.webhook else "from this machine only"
                say(f"{target.shown}  ({where})")
            return 0
        sent = notify.test(found)
        for shown in sent.ok:
            say(f"sent: {shown}")
        for shown, why in sent.failed:
            TERMINAL.warn(f"not sent: {shown}: {why}")
        if sent.failed:
            raise VmrunError(
                f"{len(sent.failed)} of {len(found)} target(s) did not take the test message",
                code="notify-failed",
            )
        return 0
