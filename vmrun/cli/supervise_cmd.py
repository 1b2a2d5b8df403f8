"""`vmrun supervise RUN --state DIR`: a run's supervisor, as `train --recover` starts it on
its host (vmrun.recovery.supervisor); not for typing by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        "supervise",
        help="The supervisor of a run, as `train --recover` starts it on its host: follows the"
        " run and brings it back when a rank crashes or a node is lost. Not typed by hand.",
    )
    def supervise_command(
        run: Annotated[str, typer.Argument(metavar="RUN", help="The run.")],
        state: Annotated[
            Path, typer.Option("--state", metavar="DIR", help="The supervisor's folder.")
        ],
    ) -> int:
        from vmrun.cli.options import settings_from
        from vmrun.cli.terminal import Terminal
        from vmrun.operations.supervise import supervise

        return supervise(state, settings_from(), Terminal(live=False), run_id=run)
