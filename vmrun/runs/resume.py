"""`vmrun train --resume RUN`: another attempt of a run, on its nodes, from its last snapshot.

Multi-node runs have no shared filesystem: a snapshot exists only on the host whose rank 0
wrote it. Before the new attempt starts, vmrun makes every node hold the newest copy of each
checkpoint file (`fetch_what.CHECKPOINTS` names, in the run's output folder): it lists the
folder on every node in one round trip each, and copies the newest version of each file
(by mtime; it passes through this machine, verified on both legs) to the nodes that lack it
or hold an older one. So a script that loads `snapshot.pt` on every rank resumes everywhere
from the same state, and vmrun's template (which loads on rank 0 and broadcasts) resumes
wherever c10d puts rank 0. Leftover processes of the run (a node that was cut off and came
back) are stopped first; a run still alive on every node is not touched.
"""

from __future__ import annotations

import fnmatch
import posixpath
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vmrun.config import Settings
from vmrun.errors import RemoteError, UsageError
from vmrun.runs import records as runs
from vmrun.runs.outputs import CHECKPOINTS
from vmrun.runs.plan import Plan
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry, select_hosts
from vmrun.transfer.manifest import PART_SUFFIX, list_remote

Note = Any  # Callable[[str], None]


def load(
    settings: Settings, hosts: Sequence[str] | None, rid: str, env: dict[str, str]
) -> tuple[Plan, list[HostEntry], dict[str, Any]]:
    """The recorded plan of run `rid` and its nodes (the hosts it ran on, master first)."""
    from vmrun.config import find_project_dir
    from vmrun.trainer import TEMPLATE_PATH

    runs.check_run_id(rid)
    entries = select_hosts(hosts, settings)
    with Group(entries, settings) as group:
        _, found = runs.find_run(group, rid)
    meta = max((rec for _, rec in found), key=lambda r: r.started).meta
    if not meta.get("launcher") or "args" not in meta:
        raise UsageError(
            f"run {rid} was started by an older vmrun and cannot be resumed",
            hint="start it again with `vmrun train`",
        )
    labels = [str(x) for x in meta.get("nodes") or [meta.get("host")]]
    nodes = select_hosts(labels, settings) if not hosts else entries
    project = find_project_dir() or Path.cwd()
    if meta.get("template"):
        script = TEMPLATE_PATH
    else:
        script = project / str(meta.get("script", ""))
        if not script.is_file():
            raise UsageError(
                f"run {rid} ran {meta.get('script')}, which is not in this project ({project})",
                hint="resume from the project directory the run was started in",
            )
    plan = Plan(
        script=script,
        is_template=bool(meta.get("template")),
        name=str(meta.get("name") or "run"),
        args=[str(a) for a in meta.get("args", [])],
        launcher=str(meta["launcher"]),
        nproc=meta.get("nproc_requested"),
        max_restarts=int(meta.get("max_restarts") or 0),
        env=env,
        project=project,
    )
    missing = sorted(set(meta.get("env_keys") or []) - set(env))
    if missing:
        raise UsageError(
            f"run {rid} was started with --env {', '.join(missing)}; values are never stored",
            hint="pass them again with --env KEY=VALUE",
        )
    return plan, nodes, meta


def prepare(group: Group, labels: Sequence[str], rid: str, note: Note) -> None:
    """Stop the run's leftovers; give every node the newest checkpoints."""
    outcomes = group.map(lambda entry, conn: runs.list_runs(conn, [rid]), only=set(labels))
    records = {o.host: (o.value or [None])[0] for o in outcomes if o.ok}  # type: ignore[list-item]
    alive = [h for h, r in records.items() if r is not None and r.state == "running"]
    if alive and len(alive) == len(labels):
        raise UsageError(
            f"run {rid} is still running on every node; nothing to resume",
            hint=f"watch it with `vmrun logs -f {rid}`, or `vmrun stop {rid}` first",
        )
    for host in alive:
        res = runs.stop(group.connections[host], rid)
        note(f"{host}: stopped {len(res.signalled)} leftover process(es) of run {rid}")
    out_dirs = {
        h: str(r.meta.get("out_dir") or "") for h, r in records.items() if r is not None
    }
    _spread_checkpoints(group, labels, out_dirs, note)


def _is_checkpoint(rel: str) -> bool:
    name = posixpath.basename(rel)
    return not name.endswith(PART_SUFFIX) and any(fnmatch.fnmatch(name, p) for p in CHECKPOINTS)


def _spread_checkpoints(
    group: Group, labels: Sequence[str], out_dirs: dict[str, str], note: Note
) -> None:
    base = next((d for d in out_dirs.values() if d), "")
    if not base:
        return

    def listing(entry: HostEntry, conn: Connection) -> dict[str, tuple[int, int]]:
        root = list_remote(conn, [out_dirs.get(entry.label) or base]).roots[0]
        return {
            e.rel: (e.size, e.mtime_ns)
            for e in root.entries
            if e.kind == "f" and _is_checkpoint(e.rel)
        }

    outcomes = group.map(listing, only=set(labels))
    have = {o.host: o.value or {} for o in outcomes if o.ok}
    for o in outcomes:
        if not o.ok:
            raise RemoteError(f"cannot list the run's checkpoints: {o.error}", host=o.host)
    newest: dict[str, tuple[str, tuple[int, int]]] = {}
    for host, files in have.items():
        for rel, stat in files.items():
            if rel not in newest or stat[1] > newest[rel][1][1]:
                newest[rel] = (host, stat)
    with tempfile.TemporaryDirectory(prefix="vmrun-resume-") as tmp:
        for rel, (src, stat) in sorted(newest.items()):
            dests = [h for h in labels if have.get(h, {}).get(rel) != stat]
            if dests:
                _copy(group, src, dests, out_dirs, base, rel, Path(tmp))
                note(f"copied {rel} from {src} to {', '.join(dests)} (the newest copy)")


def _copy(
    group: Group,
    src: str,
    dests: Sequence[str],
    out_dirs: dict[str, str],
    base: str,
    rel: str,
    tmp: Path,
) -> None:
    from vmrun.transfer.download import download
    from vmrun.transfer.types import FetchSpec
    from vmrun.transfer.upload import upload

    remote = posixpath.join(out_dirs.get(src) or base, rel)
    got = download(group.connections[src], [FetchSpec(remote=remote, local=rel)], tmp)
    if not got.ok:
        raise RemoteError(f"could not fetch {rel} to copy it to the other nodes", host=src)
    for host in dests:
        target = posixpath.join(out_dirs.get(host) or base, rel)
        sent = upload(group.connections[host], tmp / rel, target)
        if not sent.ok:
            raise RemoteError(f"could not copy {rel} to the host", host=host)
