"""What a run was made of, as its folder here records it: code, variables, and per node the
Python environment, hardware and Slurm allocation.

A run's record (run.json) carries its `code` and `variables`; each host leaves a
`provenance.json` in its folder (`results/<id>/` or `results/<id>/<host>/`), and a Slurm
run one `provenance-<node>.json` per node in its one folder; `versions.json` (one line per
node) and `code.patch` come with them. Runs older than these files, or a file that is not
JSON, read as unknown: nothing here raises on what a file lacks, so `vmrun diff` and
`report --json` work over any run that has a record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun.results.history import (
    RECORD,
    RunDataError,
    json_object,
    read_record,
    run_places,
    subdirs,
)
from vmrun.results.layout import LOCAL
from vmrun.results.record import RunRecord

PROVENANCE = "provenance.json"
VERSIONS = "versions.json"
PATCH = "code.patch"
BATCH = "batch.sh"  # a user's own batch script, as its job ran it (`vmrun submit`)
ALLOCATION = "allocation"  # `scontrol show job -o` of a Slurm run's job, once it had nodes
SUMMARY_KEYS = ("commit", "dirty", "python", "torch", "cuda", "nccl", "gpu", "driver")
VERSION_KEYS = SUMMARY_KEYS[2:]
_NODE_FILE = re.compile(r"provenance-(.+)\.json")


@dataclass(frozen=True)
class NodeProvenance:
    """One node of a run; empty mappings where its files do not say."""

    name: str
    environment: Mapping[str, Any] = field(default_factory=dict)
    hardware: Mapping[str, Any] = field(default_factory=dict)
    slurm: Mapping[str, Any] | None = None
    versions: Mapping[str, Any] = field(default_factory=dict)  # versions.json
    recorded: bool = False  # a provenance file was read for it


@dataclass(frozen=True)
class RunProvenance:
    """A run's code, variables and nodes; `record` is its run.json (falsy without one)."""

    run_id: str
    path: Path
    record: RunRecord
    code: Mapping[str, Any]
    variables: Mapping[str, Any] | None  # None: not recorded (an older run)
    nodes: tuple[NodeProvenance, ...]
    patch: str | None  # code.patch, the uncommitted diff as synced
    batch: str | None = None  # batch.sh: the user's own batch script (`vmrun submit`)
    allocation: Mapping[str, Any] | None = None  # the Slurm job's, as `scontrol` told it

    @property
    def recorded(self) -> bool:
        """Some node left a provenance file (else packages and hardware are unknown)."""
        return any(n.recorded for n in self.nodes)

    def summary(self) -> dict[str, Any]:
        """The few facts a report row carries: commit, dirty, and the first node's versions
        (its provenance, else its versions.json); None where unknown."""
        node = next((n for n in self.nodes if n.recorded or n.versions), NodeProvenance(""))
        found = {**_versions_file(node.versions), **_drop_none(_versions_of(node))}
        commit = self.code.get("commit")
        dirty = self.code.get("dirty")
        return {
            "commit": commit if isinstance(commit, str) else None,
            "dirty": dirty if isinstance(dirty, bool) else None,
            **{k: found.get(k) for k in VERSION_KEYS},
        }


def load_provenance(path: Path, *, with_patch: bool = True) -> RunProvenance:
    """The run in this folder; RunDataError if it has neither a run.json nor a provenance
    file. `with_patch=False` leaves code.patch unread (a report needs only the summary)."""
    name = path.name or str(path)
    if not path.is_dir():
        raise RunDataError(name, f"no results folder {path}")
    records = [read_record(d) for d in run_places(path)]
    record = next((r for r in records if r), RunRecord.from_json({}))
    homes = _homes(path)
    nodes = tuple(n for home in homes for n in _nodes_in(home, path, record))
    if not record and not any(n.recorded for n in nodes):
        raise RunDataError(
            name, f"no {RECORD} or provenance in {path}", hint="it has nothing to compare"
        )
    return RunProvenance(
        run_id=record.run_id or name,
        path=path,
        record=record,
        code=dict(record.code or {}),
        variables=record.launch.variables,
        nodes=tuple(_ordered(nodes, record)),
        patch=_text(homes, PATCH) if with_patch else None,
        batch=_text(homes, BATCH),
        allocation=_allocation(_text(homes, ALLOCATION)),
    )


def summary_of(path: Path) -> dict[str, Any]:
    """`RunProvenance.summary()` of the folder, all None when it cannot be read."""
    try:
        return load_provenance(path, with_patch=False).summary()
    except RunDataError:
        return dict.fromkeys(SUMMARY_KEYS)


def has_record(path: Path) -> bool:
    """The folder has what `load_provenance` reads: a run.json or a provenance file, here
    or in a folder per host (a fetch brings them with the run's logs)."""
    return any((d / RECORD).is_file() or _node_files(d) for d in (path, *subdirs(path)))


def _homes(path: Path) -> list[Path]:
    """The folders holding the run's nodes' files: the run's own, or one per host."""
    places = run_places(path)
    if path in places or _node_files(path) or (path / VERSIONS).is_file():
        return [path]
    return [d for d in subdirs(path) if d in places or _node_files(d)]


def _node_files(place: Path) -> list[Path]:
    """provenance.json, then provenance-<node>.json in the order of their nodes' names."""
    own = [place / PROVENANCE] if (place / PROVENANCE).is_file() else []
    try:
        per_node = [p for p in place.iterdir() if _NODE_FILE.fullmatch(p.name) and p.is_file()]
    except OSError:
        per_node = []
    return own + sorted(per_node, key=lambda p: _natural(p.name))


def _nodes_in(home: Path, run: Path, record: RunRecord) -> list[NodeProvenance]:
    """A node per provenance file of the folder (a file that is not JSON: none); a folder
    per host is its one node even without one, named by the folder."""
    versions = json_object(home / VERSIONS)
    per_host = home != run
    nodes = []
    for file in _node_files(home):
        data = json_object(file)
        if not data:
            continue
        matched = _NODE_FILE.fullmatch(file.name)
        label = home.name if per_host else _node_name(data, matched.group(1) if matched else "")
        nodes.append(_node(label or _default_name(record), data, versions))
    nodes = _last_attempt(nodes)
    if not nodes and (per_host or versions):
        label = home.name if per_host else _default_name(record)
        nodes.append(NodeProvenance(label, versions=versions))
    return nodes


def _last_attempt(nodes: list[NodeProvenance]) -> list[NodeProvenance]:
    """A requeued Slurm job's nodes of its last attempt (a fetch here keeps the files of
    every attempt's nodes: it never deletes)."""

    def attempt(node: NodeProvenance) -> int:
        count = (node.slurm or {}).get("restart_count")
        return int(count) if isinstance(count, str) and count.isdigit() else 0

    last = max(map(attempt, nodes), default=0)
    return [n for n in nodes if attempt(n) == last]


def _node(name: str, data: Mapping[str, Any], versions: Mapping[str, Any]) -> NodeProvenance:
    slurm = data.get("slurm")
    return NodeProvenance(
        name=name,
        environment=_dict(data.get("environment")),
        hardware=_dict(data.get("hardware")),
        slurm=slurm if isinstance(slurm, dict) else None,
        versions=versions,
        recorded=True,
    )


def _node_name(data: Mapping[str, Any], from_file: str) -> str:
    for value in (data.get("node"), _dict(data.get("hardware")).get("hostname"), from_file):
        if isinstance(value, str) and value:
            return value
    return ""


def _default_name(record: RunRecord) -> str:
    """A node whose files do not name it: the record's host, else `local` or `node`."""
    if record.host:
        return record.host
    return LOCAL if record.where == LOCAL else "node"


def _ordered(nodes: tuple[NodeProvenance, ...], record: RunRecord) -> list[NodeProvenance]:
    """In the record's host order (rank 0's first) where it lists them, else as found."""
    order = list(record.hosts)
    return sorted(nodes, key=lambda n: order.index(n.name) if n.name in order else len(order))


def _text(homes: list[Path], name: str) -> str | None:
    for home in homes:
        try:
            return (home / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
    return None


_ALLOCATED = {
    "job_id": "JobId",
    "partition": "Partition",
    "node_list": "NodeList",
    "num_nodes": "NumNodes",
    "alloc_tres": "TRES",
    "account": "Account",
    "qos": "QOS",
}


def _allocation(text: str | None) -> dict[str, Any] | None:
    """The slurm facts (as a node's provenance names them) of `scontrol show job -o`'s first
    line: KEY=VALUE words; None for no file or an empty one (a job Slurm had forgotten)."""
    line = (text or "").strip().split("\n")[0]
    if not line:
        return None
    said = dict(w.split("=", 1) for w in line.split() if "=" in w)
    said.setdefault("TRES", said.get("AllocTRES", ""))
    return {key: said.get(name) or None for key, name in _ALLOCATED.items()}


def _versions_of(node: NodeProvenance) -> dict[str, Any]:
    """python, torch, cuda, nccl, gpu, driver from a node's provenance."""
    env, hw = node.environment, node.hardware
    torch = _dict(env.get("torch"))
    gpus = hw.get("gpus") if isinstance(hw.get("gpus"), list) else []
    first = _dict(gpus[0]) if gpus else {}
    return {
        "python": version_text(_dict(env.get("python")).get("version")),
        "torch": version_text(torch.get("version")),
        "cuda": version_text(torch.get("cuda")),
        "nccl": version_text(torch.get("nccl")),
        "gpu": version_text(first.get("name")),
        "driver": version_text(hw.get("driver")) or version_text(first.get("driver")),
    }


def _versions_file(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: version_text(data.get(k)) for k in VERSION_KEYS}


def version_text(value: Any) -> str | None:
    """A version as text: `2.4.1`, `(2, 21, 5)` as `2.21.5`; None for what is not one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int, float)):
        return str(value) if str(value) else None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return ".".join(str(v) for v in value)
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _natural(name: str) -> list[Any]:
    """n2 before n10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
