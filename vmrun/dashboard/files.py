"""A run's files as its page lists them: each file's kind (as `vmrun fetch`'s categories
select them), their order, and the command that fetches them here."""

from __future__ import annotations

import fnmatch
import shlex
from typing import Any

# a run's files by kind, in the order the files to fetch are listed
KINDS = ("final model", "checkpoint", "metrics", "output", "log", "provenance")


def file_kind(path: str) -> str:
    """What a run's file is, by its name, as `vmrun fetch`'s categories select them."""
    from vmrun.runs.outputs import FETCHED_CHECKPOINTS, LOGS, METRICS, PROVENANCE

    name = path.rsplit("/", 1)[-1]
    if name == "finalmodel.pt":
        return "final model"
    if "/checkpoints/" in path:
        return "checkpoint"
    for kind, patterns in (
        ("checkpoint", FETCHED_CHECKPOINTS),
        ("metrics", METRICS),
        ("provenance", PROVENANCE),
        ("log", LOGS),
    ):
        if any(fnmatch.fnmatch(name, p) for p in patterns):
            return kind
    return "output"


def fetch_command(run_id: str, place: dict[str, Any], *, given: bool) -> str:
    """The command that fetches the run's files here: its cluster's, or its hosts' when
    the dashboard was given them (-H), else the project's hosts (vmrun.toml) find it."""
    argv = ["vmrun", "fetch", "results", "--run", run_id]
    if place.get("cluster"):
        argv += ["-C", place["cluster"]]
    elif given:
        for host in place.get("hosts") or []:
            argv += ["-H", host]
    return shlex.join(argv)
