"""Checkpoints an earlier run left where a new multi-node run will look for them.

A script that loads `snapshot.pt` when it exists resumes on every node that has one: a file
left on one host by an earlier single-host run makes that node start at epoch 40 while the
others start at 0, and the run crashes in its first collective. So before a new multi-node
run (not --resume, which gives every node the same newest copy), preflight lists the
checkpoint files (`vmrun.runs.outputs.CHECKPOINTS` names) in the run's working directory on
every node, in its own round trip, and refuses the run when they differ across the nodes.
The same files everywhere (a shared filesystem, a deliberate copy) are fine. `--fresh`
moves them aside (a rename into `.vmrun-stale-<time>/` in the same folder), never deletes.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import datetime

from vmrun import hostside
from vmrun.errors import UsageError
from vmrun.reporting import Reporter
from vmrun.runs.outputs import CHECKPOINTS
from vmrun.runs.plan import Plan
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry
from vmrun.transfer.manifest import PART_SUFFIX, remote_hashes

ASIDE_PREFIX = ".vmrun-stale-"
# vmrun.runs.launch.run_id's `<name>-<YYYYmmdd-HHMMSS>-<4 hex>`: results/<run-id>/ holds the
# template's files of that run, which no new run loads
RUN_ID_GLOB = "*-" + "[0-9]" * 8 + "-" + "[0-9]" * 6 + "-" + "[0-9a-f]" * 4
NAMED = 6  # files named in the refusal; the rest are counted


@dataclass(frozen=True)
class Found:
    """The checkpoint files in one node's run directory: relative path -> (size, mtime)."""

    where: str  # relative to the home, or absolute
    files: dict[str, tuple[int, str]] = field(default_factory=dict)


def look_in(plan: Plan, workdir: str) -> str | None:
    """Where a new run would load checkpoints from: a SCRIPT's working directory (the
    project's work dir); the template's --out-dir if given (else results/<new id>/: empty)."""
    if not plan.is_template:
        return workdir
    args = plan.args
    for i, arg in enumerate(args):
        if arg == "--out-dir" and i + 1 < len(args):
            return _under(workdir, args[i + 1])
        if arg.startswith("--out-dir="):
            return _under(workdir, arg.split("=", 1)[1])
    return None


def _under(workdir: str, path: str) -> str:
    """A path as the run (cwd: the work dir) sees it, relative to the home or absolute."""
    if path == "~" or path.startswith("~/"):
        return posixpath.normpath(path[2:] or ".")
    return posixpath.normpath(posixpath.join(workdir, path))


def listing_args(where: str) -> list[str]:
    """The arguments that make hostside/run_preflight.sh list `where`'s checkpoints."""
    return [where, RUN_ID_GLOB, *CHECKPOINTS]


def parse(where: str, data: bytes) -> Found:
    """run_preflight.sh's `SIZE MTIME RELPATH\\0` records (partial downloads left out)."""
    files: dict[str, tuple[int, str]] = {}
    for record in data.split(b"\0"):
        size, _, rest = record.partition(b" ")
        mtime, _, rel = rest.partition(b" ")
        name = rel.decode("utf-8", "surrogateescape")
        if size.isdigit() and name and not name.endswith(PART_SUFFIX):
            files[name] = (int(size), mtime.decode("ascii", "replace"))
    return Found(where, files)


def check_same(group: Group, found: dict[str, Found]) -> None:
    """Refuse the run when a checkpoint file is on some nodes only, or differs between them
    (size; then content, hashed only where sizes match but mtimes do not)."""
    hosts = list(found)
    problems: list[str] = []
    to_hash: dict[str, list[str]] = {}
    for rel in sorted({rel for f in found.values() for rel in f.files}):
        stats = {h: found[h].files.get(rel) for h in hosts}
        have = [h for h, s in stats.items() if s is not None]
        if len(have) < len(hosts):
            lack = [h for h in hosts if h not in have]
            problems.append(f"{rel} on {', '.join(have)}, not on {', '.join(lack)}")
        elif len({s[0] for s in stats.values() if s}) > 1:
            problems.append(f"{rel} differs between {', '.join(hosts)} (size)")
        elif len({s[1] for s in stats.values() if s}) > 1:
            for h in hosts:
                to_hash.setdefault(h, []).append(rel)
    if to_hash:
        problems += _different_content(group, found, to_hash)
    if not problems:
        return
    where = next(iter(found.values())).where
    more = f"; and {len(problems) - NAMED} more" if len(problems) > NAMED else ""
    raise UsageError(
        f"checkpoint files in {_shown(where)}/ differ across the nodes, which would start"
        f" from different states: {'; '.join(problems[:NAMED])}{more}; nothing was started",
        hint="`--resume RUN` to continue a run, or `--fresh` to move them aside",
        code="checkpoints-differ",
    )


def _different_content(
    group: Group, found: dict[str, Found], to_hash: dict[str, list[str]]
) -> list[str]:
    def digests(entry: HostEntry, conn: Connection) -> dict[str, str]:
        where = found[entry.label].where
        paths = {posixpath.join(where, rel): rel for rel in to_hash[entry.label]}
        return {paths[p]: d for p, d in remote_hashes(conn, list(paths)).items()}

    outcomes = group.map(digests, only=set(to_hash))
    raise_for_failures(outcomes, one_as_itself=True)
    got = {o.host: o.value or {} for o in outcomes}
    rels = sorted({rel for names in to_hash.values() for rel in names})
    return [
        f"{rel} differs between {', '.join(to_hash)} (content)"
        for rel in rels
        if len({got[h].get(rel) for h in to_hash}) > 1
    ]


def move_aside(group: Group, found: dict[str, Found], out: Reporter) -> None:
    """--fresh: each node's checkpoint files into `.vmrun-stale-<time>/` beside them."""
    aside = ASIDE_PREFIX + datetime.now().strftime("%Y%m%d-%H%M%S")

    def move(entry: HostEntry, conn: Connection) -> int:
        f = found[entry.label]
        argv = [*hostside.command("run_checkpoints_aside.sh"), f.where, aside]
        said = conn.run([*argv, *sorted(f.files)], check=True).stdout_tail.split()
        return int(said[-1]) if said and said[-1].isdigit() else 0

    busy = {h for h, f in found.items() if f.files}
    outcomes = group.map(move, only=busy)
    raise_for_failures(outcomes, one_as_itself=True)
    where = _shown(next(iter(found.values())).where)
    for o in outcomes:
        names = ", ".join(sorted(found[o.host].files)[:NAMED])
        moved = f"moved {o.value} checkpoint file(s) ({names})"
        out.info(f"{o.host}: {moved} aside to {where}/{aside}/")
    if not busy:
        out.info(f"--fresh: no checkpoint files in {where}/ to move aside")


def _shown(where: str) -> str:
    return where if where.startswith("/") else f"~/{where}"
