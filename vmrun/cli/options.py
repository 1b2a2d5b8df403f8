"""Options shared by every command that talks to hosts, and how they become Settings."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand

from vmrun.config import Settings, load_settings

if TYPE_CHECKING:
    from vmrun.backends.slurm.options import SlurmOptions

Hosts = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        "-H",
        metavar="HOST",
        help="user@host[:port], an ~/.ssh/config alias, a vmrun.toml name or @group;"
        " repeatable. Default: $VMRUN_HOSTS, else the hosts in vmrun.toml.",
    ),
]
StoreFrom = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="s3://BUCKET/PREFIX",
        help="Where runs that are not here are also looked for (those trained with --store),"
        " after the hosts [default: vmrun.toml's store].",
    ),
]
ConnectTimeout = Annotated[
    float | None,
    typer.Option(
        "--connect-timeout",
        metavar="SECONDS",
        help="Give up connecting after this long [default: 10].",
    ),
]
Parallel = Annotated[
    int | None,
    typer.Option(
        "--parallel",
        metavar="N",
        min=1,
        help="Work on at most N hosts at once; the rest wait their turn [default: 64].",
    ),
]
AcceptNewHostKey = Annotated[
    bool | None,
    typer.Option(
        "--accept-new-host-key/--strict-host-key",
        show_default=False,
        help="Trust an unknown host key on first use and remember it (a changed key"
        " is always refused). Default: strict.",
    ),
]


def settings_from(
    connect_timeout: float | None = None,
    accept_new_host_key: bool | None = None,
    sets: list[str] | None = None,
    **extra: Any,
) -> Settings:
    from vmrun.config import parse_sets

    flags: dict[str, Any] = {
        "connect_timeout": connect_timeout,
        "accept_new_host_key": accept_new_host_key,
        **extra,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    return load_settings(given, sets=parse_sets(sets or []))


Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="A setting for this command, by its vmrun.toml key (hang_timeout=1h,"
        " store=s3://b/p): over vmrun.toml and VMRUN_*, under the command's own flags;"
        " repeatable.",
    ),
]


F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Reach:
    """How a command reaches its hosts, from its connection flags (None: not given)."""

    connect_timeout: float | None = None
    accept_new_host_key: bool | None = None
    parallel: int | None = None
    sets: list[str] | None = None  # --set KEY=VALUE

    def settings(self, **extra: Any) -> Settings:
        return settings_from(
            self.connect_timeout,
            self.accept_new_host_key,
            self.sets,
            parallel=self.parallel,
            **extra,
        )


NO_FLAGS = Reach()  # a command function's default (`reaching` always passes its own)


def reaching(*, parallel: bool = True) -> Callable[[F], F]:
    """Give a command the connection flags (--connect-timeout, --parallel unless `parallel`
    is False, --accept-new-host-key/--strict-host-key) and `--set KEY=VALUE`, declared here
    once, as one `reach: Reach` parameter of its function. Put it under @app.command(...)."""
    flags: dict[str, Any] = {"connect_timeout": ConnectTimeout}
    if parallel:
        flags["parallel"] = Parallel
    flags["accept_new_host_key"] = AcceptNewHostKey
    flags["sets"] = Sets

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)  # Typer reads the objects, not strings
        kept = [p for name, p in sig.parameters.items() if name != "reach"]
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
            for name, kind in flags.items()
        ]

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name, None) for name in flags}
            return fn(*args, reach=Reach(**given), **kwargs)

        command.__signature__ = sig.replace(parameters=[*kept, *added])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in [*kept, *added]}
        return command  # type: ignore[return-value]

    return decorate


ClusterName = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        "-C",
        metavar="NAME",
        help="A Slurm cluster named in vmrun.toml ([[clusters]]): work through its login node.",
    ),
]


def refuse_with_cluster(cluster: str | None, host: list[str] | None) -> None:
    """-C and -H name different places to work; one command works in one."""
    from vmrun.backends.select import one_place

    one_place(host, cluster)


Runs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[RUN]...",
        show_default=False,
        help="Run ids (results/<id>/ of the project, fetched first if not here) or paths to"
        " results folders. Default: every run under results/, oldest first.",
    ),
]


# The Slurm option group: one flag per field of vmrun.backends.slurm.options.SlurmOptions (a
# test holds them equal), added to `train` and `sweep` by `with_group`: a new sbatch option is
# a field there and a line here, whatever the commands that take it.
SLURM_GROUP: dict[str, Any] = {
    "nodes": Annotated[
        int | None,
        typer.Option("--nodes", metavar="N", help="-C: nodes to allocate [default: 1]."),
    ],
    "gpus_per_node": Annotated[
        int | None,
        typer.Option("--gpus-per-node", metavar="G", help="-C: GPUs per node [default: none]."),
    ],
    "time": Annotated[
        str | None,
        typer.Option(
            "--time", metavar="D-HH:MM:SS", help="-C: the job's time limit (sbatch --time)."
        ),
    ],
    "cpus_per_task": Annotated[
        int | None,
        typer.Option("--cpus-per-task", metavar="C", help="-C: sbatch --cpus-per-task."),
    ],
    "mem": Annotated[str | None, typer.Option("--mem", metavar="SIZE", help="-C: sbatch --mem.")],
    "constraint": Annotated[
        str | None,
        typer.Option("--constraint", metavar="FEATURES", help="-C: sbatch --constraint."),
    ],
    "qos": Annotated[str | None, typer.Option("--qos", metavar="QOS", help="-C: sbatch --qos.")],
    "partition": Annotated[
        str | None,
        typer.Option(
            "--partition", "-p", metavar="P", help="-C: the partition [default: the cluster's]."
        ),
    ],
    "account": Annotated[
        str | None,
        typer.Option("--account", metavar="A", help="-C: the account [default: the cluster's]."),
    ],
    "sbatch_args": Annotated[
        list[str] | None,
        typer.Option(
            "--sbatch-arg", metavar="OPTION", help="-C: any other sbatch option; repeatable."
        ),
    ],
    "max_requeues": Annotated[
        int | None,
        typer.Option(
            "--max-requeues",
            metavar="N",
            help="-C: requeues after a time-limit warning or preemption that saved a snapshot"
            " [default: 3].",
        ),
    ],
}


def slurm_options(flags: dict[str, Any]) -> SlurmOptions:
    """The group's flags (by field name; those left out: not given) as SlurmOptions."""
    from vmrun.backends.slurm.options import SlurmOptions

    values = {k: v for k, v in flags.items() if v is not None}
    if "sbatch_args" in values:
        values["sbatch_args"] = tuple(values["sbatch_args"])
    return SlurmOptions(**values)


def with_group(
    group: dict[str, Any], into: str, *, skip: tuple[str, ...] = (), **own: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a group's flags on a Typer command (less `skip`; `own`: the command's own
    declaration of one of them), after its `cluster` parameter, and hand them to it as one
    dict parameter, `into`."""
    import functools
    import inspect

    declared = {**{k: v for k, v in group.items() if k not in skip}, **own}

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        kept = [p for p in sig.parameters.values() if p.name != into]
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        added = [
            inspect.Parameter(name, kind, annotation=alias, default=None)
            for name, alias in declared.items()
        ]
        at = next((i + 1 for i, p in enumerate(kept) if p.name == "cluster"), len(kept))

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name, None) for name in declared}
            return fn(*args, **kwargs, **{into: values})

        params = [*kept[:at], *added, *kept[at:]]
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


SCRIPT_ARGS = "vmrun.runs.plan.script_args"


class DashDashCommand(TyperCommand):
    """Keeps the words after `--` for the script, so `train -- 5 2` is not read as SCRIPT=5."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[SCRIPT_ARGS] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- SCRIPT_ARGS...]"]


HELP_ALL = "help_all"  # ctx.meta: show every option (`--help-all`, the command reference)


class SectionedCommand(DashDashCommand):
    """`--help` under headings, showing only the options most runs need (`brief`); every
    option under its heading with `--help-all`. A subclass names its `sections` (heading,
    parameter names in order) and `brief`; an option in no section goes under "Other"."""

    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()
    brief: frozenset[str] = frozenset()

    def get_params(self, ctx: Any) -> list[Any]:
        from typer.core import TyperOption

        def show_all(ctx: Any, param: Any, value: bool) -> None:
            if value and not ctx.resilient_parsing:
                ctx.meta[HELP_ALL] = True
                from vmrun.cli.output import say

                say(ctx.get_help())
                ctx.exit()

        every = TyperOption(
            param_decls=["--help-all"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=show_all,
            help="Show every option, under its heading, and exit.",
        )
        return [*super().get_params(ctx), every]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        everything = bool(ctx.meta.get(HELP_ALL))
        params = {p.name: p for p in self.get_params(ctx)}
        arguments = tuple(n for n, p in params.items() if p.param_type_name == "argument")
        placed = {name for _, names in self.sections for name in names} | set(arguments)
        groups = [
            ("Arguments", arguments),
            *self.sections,
            ("Other", tuple(n for n in params if n not in placed)),
        ]
        shown = self.brief | set(arguments) | {"help", "help_all"}
        left = 0
        for heading, names in groups:
            rows = []
            for name in names:
                param = params.get(name)
                record = param.get_help_record(ctx) if param is not None else None
                if record is None:
                    continue
                if everything or name in shown:
                    rows.append(record)
                else:
                    left += 1
            if rows:
                with formatter.section(heading):
                    formatter.write_dl(rows)
        if left:
            with formatter.section("More"):
                formatter.write_text(
                    f"{left} more options (every heading's): `vmrun {ctx.info_name} --help-all`."
                )
