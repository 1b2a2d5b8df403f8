"""The options that say what a run trains, shared by `train` and `sweep` (which trains the
same thing at several sizes): declared once, so their names and help cannot drift apart."""

from __future__ import annotations

from typing import Annotated

import typer

Script = Annotated[
    str | None,
    typer.Argument(metavar="[SCRIPT]", show_default=False, help="Default: the template."),
]
Epochs = Annotated[
    int | None, typer.Option("--epochs", metavar="N", help="Total epochs [default: 10].")
]
SaveEvery = Annotated[
    int | None,
    typer.Option("--save-every", metavar="K", help="Snapshot every K epochs [default: 5]."),
]
EnvVars = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", metavar="KEY[=VAL]", help="Set a variable; repeatable."),
]
RunName = Annotated[
    str | None,
    typer.Option("--name", metavar="NAME", help="Run-id prefix [default: script stem]."),
]
BatchSize = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        metavar="B",
        help="The template's per-process batch size (a SCRIPT takes its own after --).",
    ),
]
Lr = Annotated[
    float | None,
    typer.Option("--lr", metavar="LR", help="The template's learning rate (a SCRIPT: after --)."),
]
Task = Annotated[
    str | None,
    typer.Option(
        "--task",
        metavar="regress|classify",
        help="The template's task: regression, or 4-class classification (its metrics add"
        " accuracy) [default: regress].",
    ),
]
Fsdp = Annotated[
    bool,
    typer.Option(
        "--fsdp",
        help="The template shards its model with FSDP2 and writes sharded checkpoints"
        " (torch.distributed.checkpoint) to checkpoints/epoch-N/ in place of snapshot.pt.",
    ),
]
Verbose = Annotated[
    bool,
    typer.Option("--verbose", help="Also torchrun's banner and c10d's host name warnings."),
]
ImageOption = Annotated[
    str | None,
    typer.Option(
        "--image",
        metavar="IMAGE",
        help="Train inside this container image (e.g. nvcr.io/nvidia/pytorch:24.05-py3), pulled"
        " once per host [default: vmrun.toml's image, else none].",
    ),
]
PullOption = Annotated[
    str | None,
    typer.Option(
        "--pull",
        metavar="newer|missing|always|never",
        help="When the image is pulled: newer (the registry's when it answers, else the"
        " host's own copy), missing (only when the host has none), always, never"
        " [default: vmrun.toml's pull, else newer].",
    ),
]
DataOption = Annotated[
    list[str] | None,
    typer.Option(
        "--data",
        metavar="PATH[:DIR]",
        help="Push this file or folder to every node before the run (as `vmrun push`: only"
        " what changed, verified; with -C once, onto the cluster's shared filesystem) into"
        " DIR/<its name> [default DIR: the project's work directory there]; recorded in"
        " run.json; repeatable.",
    ),
]
StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="s3://BUCKET/PREFIX",
        help="Copy the run's outputs to PREFIX/<run id>/ in the bucket from the host as they"
        " are written (each snapshot once complete; logs, metrics, provenance at the end);"
        " with --resume, where to find a run whose hosts are gone [default: vmrun.toml's"
        " store].",
    ),
]
Mounts = Annotated[
    list[str] | None,
    typer.Option(
        "--mount",
        metavar="SRC:DST[:ro]",
        help="With --image: a host path the container sees at DST; repeatable.",
    ),
]

MaxRecoveries = Annotated[
    int | None,
    typer.Option(
        "--max-recoveries", metavar="N", help="--recover: give up after N recoveries [default: 5]."
    ),
]

MaxCost = Annotated[
    str | None,
    typer.Option(
        "--max-cost",
        metavar="AMOUNT",
        help="Snapshot and stop the run once it has cost this much at its machines' prices"
        " (each host's `price` in vmrun.toml, in its currency; `vmrun up` records them), with"
        " vmrun attached or not; off: no cap [default: the max_cost setting, off].",
    ),
]

NotifyUrls = Annotated[
    list[str] | None,
    typer.Option(
        "--notify",
        metavar="URL",
        help="Tell the run's end here: an Apprise URL (ntfy://TOPIC, slack://A/B/C,"
        " json://HOST/PATH, mailto://...); repeatable; over the `notify` setting. The"
        " host tells the end itself when vmrun is not attached.",
    ),
]
NotifyOn = Annotated[
    str | None,
    typer.Option(
        "--notify-on",
        metavar="end|fail|all",
        help="Which events are told, comma-separated [default: end,fail]; all: requeues and"
        " stops too.",
    ),
]
