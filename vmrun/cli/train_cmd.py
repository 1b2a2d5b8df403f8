"""`vmrun train [SCRIPT] [-- SCRIPT_ARGS...]`: launch DDP training on a host or this machine.

Without SCRIPT it runs vmrun's template trainer (`vmrun/trainer/template.py`). The CLI
process never imports torch: torch is checked for, and runs, only in child processes.

Where things go (the project dir is the nearest directory holding vmrun.toml, else the
current directory):
- `results/<run-id>/` in the project dir, with `run.json` (the run record, rewritten
  atomically at start and end) and `train.log` (the run's stdout and stderr, merged, as also
  streamed to this terminal). The run id is `<name or script stem>-<YYYYmmdd-HHMMSS>-<4 hex>`.
- The template writes snapshot.pt, finalmodel.pt and metrics.jsonl there too (its
  `--out-dir`). A user SCRIPT runs with the project dir as its working directory, exactly as
  `torchrun script.py` typed there would, so its files land where it puts them; it also gets
  VMRUN_RUN_ID and VMRUN_RUN_DIR to write into the run directory if it wants to.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from vmrun.cli.options import AcceptNewHostKey, ConnectTimeout, Hosts, settings_from
from vmrun.errors import UsageError

_SCRIPT_ARGS = "vmrun.train.script_args"


class _DashDashCommand(TyperCommand):
    """Keeps the words after `--` for the script, so `train -- 5 2` is not read as SCRIPT=5."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_SCRIPT_ARGS] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- SCRIPT_ARGS...]"]


def register(app: typer.Typer) -> None:
    @app.command(
        "train",
        cls=_DashDashCommand,
        help="Launch torchrun DDP training on the host (or --local: this machine), detached"
        " so it survives disconnects, and stream its output; Ctrl-C detaches."
        " SCRIPT (default: vmrun's template trainer) gets `EPOCHS SAVE_EVERY`, or the words"
        " after `--` as-is. Files go to results/<run-id>/: train.log, run.json and the"
        " template's snapshot.pt, finalmodel.pt, metrics.jsonl; a SCRIPT runs in the project"
        " directory and writes where it always does.",
    )
    def train_command(
        ctx: typer.Context,
        script: Annotated[
            str | None,
            typer.Argument(metavar="[SCRIPT]", show_default=False, help="Default: the template."),
        ] = None,
        local: Annotated[
            bool, typer.Option("--local", help="Train on this machine (no SSH).")
        ] = False,
        epochs: Annotated[
            int | None,
            typer.Option("--epochs", metavar="N", help="Total epochs [default: 10]."),
        ] = None,
        save_every: Annotated[
            int | None,
            typer.Option("--save-every", metavar="K", help="Snapshot every K epochs [default: 5]."),
        ] = None,
        nproc_per_node: Annotated[
            str | None,
            typer.Option(
                "--nproc-per-node",
                metavar="gpu|cpu|auto|N",
                help="Worker processes (torchrun's meaning for gpu/cpu/auto). Default: one per"
                " CUDA GPU, else 2 CPU processes (gloo).",
            ),
        ] = None,
        max_restarts: Annotated[
            int,
            typer.Option("--max-restarts", metavar="R", help="torchrun restarts after a failure."),
        ] = 0,
        env: Annotated[
            list[str] | None,
            typer.Option("--env", "-e", metavar="KEY[=VAL]", help="Set a variable; repeatable."),
        ] = None,
        name: Annotated[
            str | None,
            typer.Option("--name", metavar="NAME", help="Run-id prefix [default: script stem]."),
        ] = None,
        batch_size: Annotated[
            int | None,
            typer.Option("--batch-size", metavar="B", help="Passed on as --batch-size B."),
        ] = None,
        lr: Annotated[
            float | None, typer.Option("--lr", metavar="LR", help="Passed on as --lr LR.")
        ] = None,
        launcher: Annotated[
            str,
            typer.Option(
                "--launcher",
                metavar="torchrun|python|env",
                help="torchrun; python (the script spawns its own workers); env (one process"
                " with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set).",
            ),
        ] = "torchrun",
        host: Hosts = None,
        detach: Annotated[
            bool, typer.Option("--detach", help="Start the run and return at once.")
        ] = False,
        allow_concurrent: Annotated[
            bool,
            typer.Option("--allow-concurrent", help="Start even if the host is running a run."),
        ] = False,
        connect_timeout: ConnectTimeout = None,
        accept_new_host_key: AcceptNewHostKey = None,
    ) -> int:
        from vmrun.train import make_plan

        plan = make_plan(
            script=script,
            user_args=ctx.meta.get(_SCRIPT_ARGS),
            epochs=epochs,
            save_every=save_every,
            nproc_per_node=nproc_per_node,
            max_restarts=max_restarts,
            env=env,
            name=name,
            batch_size=batch_size,
            lr=lr,
            launcher=launcher,
        )
        if local:
            if host:
                raise UsageError("--local trains on this machine; drop -H or --local")
            from vmrun.localrun import run_local

            return run_local(plan)
        from vmrun.inventory import select_hosts
        from vmrun.remote_train import run_remote

        settings = settings_from(connect_timeout, accept_new_host_key)
        entries = select_hosts(host, settings)

        def show(line: bytes) -> None:
            sys.stdout.write(line.decode("utf-8", "replace"))
            sys.stdout.flush()

        def note(text: str) -> None:
            sys.stderr.write(f"vmrun: {text}\n")
            sys.stderr.flush()

        return run_remote(
            plan,
            entries,
            settings,
            detach=detach,
            allow_concurrent=allow_concurrent,
            on_line=show,
            note=note,
        )
