"""The Typer application: one module per command, registered here.

Building every command costs more than importing typer itself (11 modules, each with many
options), so a run builds only the command it names; the root `--help` lists the commands
from the table below without importing them.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from vmrun import __version__
from vmrun.cli.output import say, warn_line

# Every command: its name, its module, and the line `vmrun --help` shows for it, in the
# order listed there (tests check that each module registers exactly this name).
COMMANDS = (
    ("up", "up_cmd", "Make cloud VMs (AWS), SSH-ready, recorded as hosts @NAME."),
    ("down", "down_cmd", "Terminate a cloud cluster: nothing of it left billing."),
    ("setup", "setup_cmd", "Provision hosts: NVIDIA driver, Python env, PyTorch."),
    ("train", "train_cmd", "Sync the code and run torchrun DDP on the hosts (or --local)."),
    ("submit", "submit_cmd", "Submit your own sbatch script, synced; follow it like a run."),
    ("logs", "logs_cmd", "Show a run's log; -f follows it live."),
    ("status", "status_cmd", "List the runs on the hosts: state, progress, duration, exit."),
    ("stop", "stop_cmd", "Stop a run on every host; verifies nothing of it remains."),
    ("stacks", "stacks_cmd", "Show where every rank of a live run is: stacks, grouped."),
    ("push", "push_cmd", "Send data to every host: only what changed, verified, atomic."),
    ("fetch", "fetch_cmd", "Bring back results: only what is new, verified, atomic."),
    ("report", "report_cmd", "Compare runs: time, samples/s, speed-up, efficiency, loss."),
    ("diff", "diff_cmd", "Show what differs between runs: code, packages, hardware, launch"),
    ("plot", "plot_cmd", "Plot a metric of runs by epoch or time: terminal, PNG or SVG."),
    ("sweep", "sweep_cmd", "Train at several sizes in turn; a scaling report and plot."),
    ("watch-gpus", "watch_gpus_cmd", "Show every host's GPUs live: use, memory, processes."),
    ("dashboard", "dashboard_cmd", "Every run, its live log, loss and stop on a page here."),
    ("tensorboard", "tensorboard_cmd", "Serve a run's TensorBoard here, from the host."),
    ("forward", "forward_cmd", "Forward a port of a host to 127.0.0.1 here."),
    ("notify", "notify_cmd", "Where runs' ends are told (ntfy, Slack, mail); --test tries it."),
    ("autostop", "autostop_cmd", "Power idle hosts off by themselves: a watchdog on each."),
    ("cloud", "cloud_cmd", "List what vmrun made in the cloud: state, age, $/h, forgotten."),
    ("doctor", "doctor_cmd", "Check the hosts before a multi-node run."),
    ("exec", "exec_cmd", "Run a command on one or all hosts in parallel."),
    ("hosts", "hosts_cmd", "List the selected hosts; --check connects to each."),
    ("config", "config_cmd", "Show the resolved settings and where each came from."),
    ("supervise", "supervise_cmd", "A run's supervisor on its host (started by train --recover)."),
)
# Commands that vmrun starts itself (on a host), not a user: they run when named, and
# `vmrun --help` and the command reference leave them out.
HIDDEN = frozenset({"supervise"})
# Old spellings that still work, each with a one-line notice of the new one: a command word,
# and a command's option (`--image` is a container in `train`, an OS image in `up`).
RENAMED = {"clusters": "cloud"}
RENAMED_OPTIONS = {("up", "--image"): "--os-image"}
_ROOT_FLAGS = {"--debug", "--version", "-V", "--help", "-h"}


def _version(value: bool) -> None:
    if value:
        say(f"vmrun {__version__}")
        raise typer.Exit()


def current_spelling(args: list[str]) -> list[str]:
    """`args` with each old spelling replaced by its new one, the new one named once."""
    args = list(args)
    at = next((i for i, w in enumerate(args) if w not in _ROOT_FLAGS), None)
    if at is None:
        return args
    if args[at] in RENAMED:
        new = RENAMED[args[at]]
        warn_line(f"`vmrun {args[at]}` is now `vmrun {new}`; the old name will go")
        args[at] = new
    for i, word in enumerate(args[at + 1 :], start=at + 1):
        if word == "--":
            break
        flag, eq, value = word.partition("=")
        renamed = RENAMED_OPTIONS.get((args[at], flag))
        if renamed:
            warn_line(f"`vmrun {args[at]} {flag}` is now `{renamed}`; the old spelling will go")
            args[i] = renamed + eq + value
    return args


def command_named(args: list[str]) -> str | None:
    """The command the arguments name: the first word after the root's own flags."""
    for word in args:
        if word not in _ROOT_FLAGS:
            return word if any(word == name for name, _, _ in COMMANDS) else None
    return None


def build(args: list[str] | None = None) -> Any:
    """The click command for `args`: the named command only, or every command (all when
    `args` is None; the root's listing otherwise, with stand-ins that only carry help)."""
    app = typer.Typer(
        name="vmrun",
        help="Take SSH-reachable GPU machines from bare to trained-and-fetched.",
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
        version: Annotated[
            bool,
            typer.Option(
                "--version", "-V", callback=_version, is_eager=True, help="Print the version."
            ),
        ] = False,
    ) -> None:
        """vmrun: setup, train, fetch and watch GPU hosts over plain SSH."""

    wanted = None if args is None else command_named(args)
    for name, module, short in COMMANDS:
        if args is None or name == wanted:
            importlib.import_module(f"vmrun.cli.{module}").register(app)
        elif wanted is None:
            _listing_only(app, name, short)
    command = typer.main.get_command(app)
    for name, _, short in COMMANDS:
        sub = command.commands.get(name)  # type: ignore[attr-defined]
        if sub is not None:
            sub.short_help = short
            sub.hidden = name in HIDDEN
    return command


def _listing_only(app: typer.Typer, name: str, short: str) -> None:
    """A command that only appears in the root's help: no command word was given, so
    none of them can run (click shows the help or 'No such command' first)."""

    @app.command(name, help=short, add_help_option=False)
    def _listed() -> None:
        raise AssertionError(f"the listing stand-in for {name} was run")
