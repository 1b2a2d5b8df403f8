"""What `vmrun fetch results|checkpoints|logs|metrics` means: remote paths of a run.

A thin map from names to `FetchSpec`s over a `RunLocation`. The runs code owns where a run
lives; it only has to produce a RunLocation (`locate_run` below reads the layout
`~/.vmrun/runs/<run-id>/run.json` + `<workdir>/results/<run-id>/` and is the one function
to replace if that changes). Locally, a run mirrors to `results/<run-id>/`: its nodes'
outputs merged there, each node's record but the master's in a subfolder of its own (with
--all-hosts or explicit paths, a subfolder per host).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError
from vmrun.remote_paths import RUNS_DIR
from vmrun.results.record import RunRecord
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.transfer.manifest import normalize_remote
from vmrun.transfer.streams import capture
from vmrun.transfer.types import FetchSpec

# what made the run (vmrun.runs.provenance, hostside/run_provenance.py): with its logs, so
# `fetch results` and `report`'s fetch keep it here after the VM is gone
PROVENANCE = (
    "provenance*.json",
    "environment.txt",
    "versions.json",
    "code.patch*",
    "batch.sh",
    "allocation",
)
WHATS = ("results", "checkpoints", "logs", "metrics")
CHECKPOINTS = ("*.pt", "*.pth", "*.ckpt", "*.safetensors", "ckpt*.tar", "checkpoint*")
# what `fetch checkpoints` brings: those, and a sharded (torch.distributed.checkpoint) one's
# files, each rank's shards and the .metadata that names them
FETCHED_CHECKPOINTS = (*CHECKPOINTS, "*.distcp", ".metadata")
METRICS = ("*.jsonl", "*.csv", "metrics*", "events.out.tfevents.*")
# a Slurm run's record also keeps `starts` and `exit` (attempt, code, time): its times
# `recoveries`: what a run's supervisor did (train --recover), kept with the run's logs; a
# hang's record and its stacks (stacks/hang-N/rank-R.json), NCCL's flight recorder dumps and
# the network it chose (nccl/: vmrun.backends.hosts.node_launch, hostside/hang_watch.py)
LOGS = (
    "log",
    "*.log",
    "run.json",
    "exit_code",
    "failure.json",
    "starts",
    "exit",
    "ended",
    "recoveries",
    "hang",
    "hang_stopped",
    "rank-*.json",
    "fr_rank_*",
    "transport",
    *PROVENANCE,
)

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"bad run id {run_id!r}: letters, digits, . _ - only")
    return run_id


@dataclass(frozen=True)
class RunLocation:
    """Where one run's files are on one host (remote paths relative to the home, or absolute)."""

    run_id: str
    host: str
    record_dir: str  # ~/.vmrun/runs/<run-id>: run.json, log, exit_code
    out_dir: str  # <workdir>/results/<run-id>: snapshot*.pt, finalmodel.pt, metrics.jsonl
    since_ns: int = 0  # a user script's out_dir is the work dir: only files newer than this
    logs: tuple[str, ...] = ()  # a batch script's output files in out_dir, as globs


def local_run_dir(run_id: str, host_dir: str | None) -> str:
    return posixpath.join("results", run_id, *([host_dir] if host_dir else []))


def resolve_what(
    what: str,
    run: RunLocation,
    *,
    host_dir: str | None = None,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    latest: int | None = None,
    node_dir: str | None = None,
) -> list[FetchSpec]:
    """The FetchSpecs for a WHAT name, or for a path relative to the run's output folder.

    `latest` keeps the newest N checkpoints; with `results` the other files all come too.
    `node_dir`: the node's record goes into this folder of the run's (a merged fetch of
    several nodes' outputs, where each node's log and run.json are its own).
    """
    local = local_run_dir(run.run_id, host_dir)
    label = f"{what} of run {run.run_id}"

    def spec(
        remote: str, select: tuple[str, ...], *, drop: tuple[str, ...] = (), newest: bool = False
    ) -> FetchSpec:
        own = node_dir if remote == run.record_dir else None
        return FetchSpec(
            remote=remote,
            local=posixpath.join(local, own) if own else local,
            select=select,
            include=include,
            exclude=exclude + drop,
            latest=latest if newest else None,
            label=label,
            newer_than_ns=run.since_ns if remote == run.out_dir else 0,
        )

    if what == "checkpoints":
        return [spec(run.out_dir, FETCHED_CHECKPOINTS, newest=True)]
    if what == "metrics":
        return [spec(run.out_dir, METRICS)]
    if what == "logs":
        return [spec(run.record_dir, LOGS), *([spec(run.out_dir, run.logs)] if run.logs else [])]
    if what == "results":
        return [
            spec(run.out_dir, FETCHED_CHECKPOINTS, newest=True),
            spec(run.out_dir, (), drop=FETCHED_CHECKPOINTS),
            spec(run.record_dir, LOGS),
        ]
    remote = normalize_remote(what, base=run.out_dir)
    if what.startswith(("/", "~")):  # not under the run: named by its last part
        target = posixpath.join(local, posixpath.basename(remote))
    else:
        rel = posixpath.relpath(remote, run.out_dir)
        target = local if rel == "." else posixpath.join(local, rel)
    return [
        FetchSpec(
            remote=remote, local=target, include=include, exclude=exclude, latest=latest, label=what
        )
    ]


def locate_run(conn: Connection, run_id: str | None) -> RunLocation:
    """Find a run on the host (the newest when `run_id` is None), in one round trip."""
    if run_id is not None:
        check_run_id(run_id)
    argv = [*hostside.command("run_locate.sh"), RUNS_DIR, run_id or ""]
    status, out, _err = capture(conn, quoting.plain_command(argv), what="the run lookup")
    if status in (3, 4):
        which = f"run {run_id}" if run_id else "any run"
        raise RemoteError(
            f"no record of {which} in ~/{RUNS_DIR}",
            host=conn.label,
            hint="`vmrun status` lists the runs; or fetch an explicit path",
        )
    found, _, rest = out.decode("utf-8", "replace").partition("\n")
    first, _, text = rest.partition("\n")
    try:
        meta = json.loads(text) if text.strip() else {}
    except ValueError:
        meta = {}
    started = float(first) if first.strip().isdigit() else None
    return location_of(found, conn.label, RunRecord.from_json(meta), started)


def location_of(
    run_id: str, host: str, record: RunRecord, first_started: float | None
) -> RunLocation:
    """Where a run's files are, from its run.json and the host-clock time it first started
    (a template's outputs are its own folder; a script's, what it wrote in the work dir)."""
    launch = record.launch
    out_dir = launch.out_dir or posixpath.join(launch.workdir or ".", "results", run_id)
    template = record.template
    since = int(first_started * 10**9) if first_started and not template else 0
    return RunLocation(
        run_id=run_id,
        host=host,
        record_dir=f"{RUNS_DIR}/{run_id}",
        out_dir=posixpath.normpath(str(out_dir)),
        since_ns=since,
    )


def check_paths(items: list[str], run: str | None) -> None:
    """Refuse `..` escapes before connecting anywhere (the same rule applies per host)."""
    for item in items:
        if item in WHATS:
            continue
        if run:
            normalize_remote(item, base="run-dir")
        else:
            normalize_remote(item, base="work-dir", where="the work directory")


def path_spec(
    item: str,
    host_dir: str | None,
    workdir: str,
    *,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    latest: int | None,
) -> FetchSpec:
    """An explicit remote path: relative to the project's work directory on the host (where
    scripts run) and mirrored here as in the project; `~/x` from the home, mirrored as `x`;
    absolute ones land under their last name."""
    remote = normalize_remote(item, base=workdir, where="the work directory")
    if remote.startswith("/"):
        local = posixpath.basename(remote) or "root"
    elif remote == workdir or remote.startswith(workdir + "/"):
        local = posixpath.relpath(remote, workdir)
    else:
        local = remote
    local = "" if local == "." else local
    if host_dir:
        local = posixpath.join(host_dir, local) if local else host_dir
    return FetchSpec(
        remote=remote, local=local, include=include, exclude=exclude, latest=latest, label=item
    )


def specs_for(
    conn: Connection,
    items: list[str],
    *,
    run: str | None,
    location: RunLocation | None = None,
    workdir: str,
    host_dir: str | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    latest: int | None,
    node_dir: str | None = None,
) -> list[FetchSpec]:
    specs: list[FetchSpec] = []
    for item in items:
        if item in WHATS or run is not None:
            location = location or locate_run(conn, run)
            specs += resolve_what(
                item,
                location,
                host_dir=host_dir,
                include=include,
                exclude=exclude,
                latest=latest,
                node_dir=node_dir,
            )
        else:
            specs.append(
                path_spec(item, host_dir, workdir, include=include, exclude=exclude, latest=latest)
            )
    return specs
