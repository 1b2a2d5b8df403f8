"""What differs between two runs: code, packages, environment, hardware and launch.

A run that trains slower or worse than the last is usually a run that changed: another
commit, a torch upgrade, another GPU, one node fewer. This says what changed, from the
files each run recorded (vmrun.results.provenance), and nothing of what is equal. What one
run did not record (an older run) is said once per section, not as every key changed.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vmrun.results.layout import layout_of
from vmrun.results.provenance import NodeProvenance, RunProvenance, version_text
from vmrun.results.record import Job, RunRecord

PATCH_DIFF_LINES = 200
NO_PROVENANCE = "no provenance recorded"
NOT_RECORDED = "(not recorded)"  # a variable's value given with --env, never written down
_HASH = re.compile(r"[0-9a-f]{40,64}")
_SHOWN = 10  # names a text line lists before `and N more`


@dataclass(frozen=True)
class Change:
    """One fact that differs: `a` in the first run, `b` in the second."""

    what: str
    a: Any = None
    b: Any = None
    change: str = ""  # "added" or "removed" when one run alone has it
    note: str = ""  # said instead of `a -> b` (a side unknown, the same code synced)
    node: tuple[int, str, str] | None = None  # (position from 1, its name in a, in b)
    unset: str = field(default="(none)", compare=False)  # how the text shows None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"what": self.what, "a": self.a, "b": self.b}
        if self.change:
            out["change"] = self.change
        if self.note:
            out["note"] = self.note
        if self.node:
            index, a, b = self.node
            out["node"] = {"index": index, "a": a, "b": b}
        return out


@dataclass(frozen=True)
class PackageChanges:
    """The first node's packages of each run; `notes`: a side unknown, or the nodes of one
    run that disagree."""

    added: dict[str, str | None] = field(default_factory=dict)
    removed: dict[str, str | None] = field(default_factory=dict)
    changed: dict[str, list[str | None]] = field(default_factory=dict)
    notes: tuple[Change, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "notes": [n.to_json() for n in self.notes],
        }


@dataclass(frozen=True)
class RunDiff:
    """Run `a` against run `b`, section by section; an empty section: nothing differs."""

    a: str
    b: str
    code: tuple[Change, ...]
    packages: PackageChanges
    environment: tuple[Change, ...]
    hardware: tuple[Change, ...]
    launch: tuple[Change, ...]
    patch_diff: str | None  # a unified diff of the two code.patch files, when both are here

    @property
    def same(self) -> bool:
        return not any((self.code, self.packages, self.environment, self.hardware, self.launch))

    def to_json(self) -> dict[str, Any]:
        def listed(changes: tuple[Change, ...]) -> list[dict[str, Any]]:
            return [c.to_json() for c in changes]

        return {
            "a": self.a,
            "b": self.b,
            "same": self.same,
            "code": listed(self.code),
            "packages": self.packages.to_json(),
            "environment": listed(self.environment),
            "hardware": listed(self.hardware),
            "launch": listed(self.launch),
            "patch_diff": self.patch_diff,
        }


def diff_runs(a: RunProvenance, b: RunProvenance) -> RunDiff:
    """What differs from run `a` to run `b`."""
    return RunDiff(
        a=a.run_id,
        b=b.run_id,
        code=tuple(code_changes(a, b)),
        packages=package_changes(a, b),
        environment=tuple(environment_changes(a, b)),
        hardware=tuple(hardware_changes(a, b)),
        launch=tuple(launch_changes(a, b)),
        patch_diff=patch_diff(a, b),
    )


# -- code ---------------------------------------------------------------------------------

CODE_KEYS = ("git", "commit", "branch", "dirty", "remote", "path", "files")


def code_changes(a: RunProvenance, b: RunProvenance) -> list[Change]:
    unknown = _unknown(a, b, _lacks(a.code, "no code recorded"), _lacks(b.code, "no code recorded"))
    if unknown:
        return unknown
    ca, cb = a.code, b.code
    changes = _compared((k, ca.get(k), cb.get(k)) for k in CODE_KEYS)
    tree_a, tree_b = ca.get("tree_sha256"), cb.get("tree_sha256")
    if tree_a != tree_b:
        changes.append(Change("tree_sha256", tree_a, tree_b))
    changes += _patch_change(ca, cb) + _untracked(ca, cb) + _batch_change(a, b)
    changes += _earlier_change(a, b)
    if changes and tree_a and tree_a == tree_b:
        said = f"same code synced (tree_sha256 {_shown(tree_a)})"
        changes.append(Change("tree_sha256", tree_a, tree_b, note=said))
    return changes


def _patch_change(ca: Mapping[str, Any], cb: Mapping[str, Any]) -> list[Change]:
    def facts(code: Mapping[str, Any]) -> dict[str, Any] | None:
        if not code.get("patch_sha256") and not code.get("patch_bytes"):
            return None
        keys = ("patch_bytes", "patch_sha256", "patch_truncated")
        return {k.removeprefix("patch_"): code.get(k) for k in keys}

    def said(found: dict[str, Any] | None) -> str:
        if found is None:
            return "(none)"
        cut = " truncated" if found["truncated"] else ""
        return f"{_shown(found['bytes'])} bytes{cut} ({_shown(found['sha256'])})"

    if ca.get("patch_sha256") == cb.get("patch_sha256"):
        return []
    pa, pb = facts(ca), facts(cb)
    return [Change("patch", pa, pb, note=f"patch: {said(pa)} -> {said(pb)}")]


def _earlier_change(a: RunProvenance, b: RunProvenance) -> list[Change]:
    """A resumed run whose earlier attempts ran other code (run.json's `code_earlier`)."""

    def other(run: RunProvenance) -> list[str] | None:
        now = run.code.get("tree_sha256")
        found = [
            f"attempt {c.get('attempt')}: {_shown(c.get('commit'))}"
            for c in run.record.code_earlier
            if c.get("tree_sha256") != now
        ]
        return found or None

    ea, eb = other(a), other(b)
    return [] if ea == eb else [Change("earlier attempts' code", ea, eb)]


def _batch_change(a: RunProvenance, b: RunProvenance) -> list[Change]:
    """A user's own batch script (`vmrun submit`), as each job ran it."""
    if a.batch == b.batch:
        return []

    def said(text: str | None) -> str | None:
        if text is None:
            return None
        return f"{len(text.splitlines())} lines ({hashlib.sha256(text.encode()).hexdigest()[:12]})"

    return [Change("batch script", said(a.batch), said(b.batch))]


def _untracked(ca: Mapping[str, Any], cb: Mapping[str, Any]) -> list[Change]:
    def names(code: Mapping[str, Any]) -> set[str]:
        listed = code.get("untracked")
        return {str(n) for n in listed} if isinstance(listed, list) else set()

    ua, ub = names(ca), names(cb)
    changes = []
    if ub - ua:
        changes.append(Change("untracked", None, sorted(ub - ua), change="added"))
    if ua - ub:
        changes.append(Change("untracked", sorted(ua - ub), None, change="removed"))
    count_a, count_b = ca.get("untracked_count"), cb.get("untracked_count")
    beyond = any(isinstance(n, int) and n > len(s) for n, s in ((count_a, ua), (count_b, ub)))
    if count_a != count_b and beyond:  # more than the lists hold: the counts tell the rest
        changes.append(Change("untracked_count", count_a, count_b))
    return changes


def patch_diff(a: RunProvenance, b: RunProvenance) -> str | None:
    """The unified diff of the two runs' code.patch, its first PATCH_DIFF_LINES lines."""
    if a.patch is None or b.patch is None or a.patch == b.patch:
        return None
    lines = list(
        difflib.unified_diff(
            a.patch.splitlines(),
            b.patch.splitlines(),
            fromfile=f"{a.run_id}/code.patch",
            tofile=f"{b.run_id}/code.patch",
            lineterm="",
        )
    )
    if len(lines) > PATCH_DIFF_LINES:
        more = len(lines) - PATCH_DIFF_LINES
        lines = [*lines[:PATCH_DIFF_LINES], f"... {more} more line{'s' if more > 1 else ''}"]
    return "\n".join(lines)


# -- packages -----------------------------------------------------------------------------


def package_changes(a: RunProvenance, b: RunProvenance) -> PackageChanges:
    pa, pb = _first_packages(a), _first_packages(b)
    unknown = _unknown(a, b, _why_packages(a, pa), _why_packages(b, pb))
    if pa is None or pb is None:
        return PackageChanges(notes=tuple(unknown))
    return PackageChanges(
        added={k: pb[k] for k in sorted(pb.keys() - pa.keys())},
        removed={k: pa[k] for k in sorted(pa.keys() - pb.keys())},
        changed={k: [pa[k], pb[k]] for k in sorted(pa.keys() & pb.keys()) if pa[k] != pb[k]},
        notes=tuple(_disagreeing(a) + _disagreeing(b)),
    )


def packages_of(node: NodeProvenance) -> dict[str, str | None] | None:
    found = node.environment.get("packages")
    if not node.recorded or not isinstance(found, dict):
        return None
    return {str(k): version_text(v) for k, v in found.items()}


def _first_packages(run: RunProvenance) -> dict[str, str | None] | None:
    found = (packages_of(n) for n in run.nodes)
    return next((p for p in found if p is not None), None)


def _why_packages(run: RunProvenance, found: object) -> str | None:
    if found is not None:
        return None
    return "no packages recorded" if run.recorded else NO_PROVENANCE


def _disagreeing(run: RunProvenance) -> list[Change]:
    """A note per node of the run whose packages are not its first node's."""
    nodes = [(n, p) for n in run.nodes if (p := packages_of(n)) is not None]
    if len(nodes) < 2:
        return []
    (first, base), notes = nodes[0], []
    for node, other in nodes[1:]:
        names = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
        if names:
            said = f"{run.run_id}: node {node.name} differs from {first.name} in {_some(names)}"
            notes.append(Change("node packages", first.name, node.name, note=said))
    return notes


# -- environment --------------------------------------------------------------------------

ENVIRONMENT_KEYS = (
    ("python", "python", "version"),
    ("python implementation", "python", "implementation"),
    ("python executable", "python", "executable"),
    ("virtualenv", "python", "virtualenv"),
    ("torch", "torch", "version"),
    ("cuda", "torch", "cuda"),
    ("hip", "torch", "hip"),
    ("nccl", "torch", "nccl"),
    ("cudnn", "torch", "cudnn"),
)


def environment_changes(a: RunProvenance, b: RunProvenance) -> list[Change]:
    na, nb = _first_recorded(a), _first_recorded(b)
    changes = _unknown(a, b, _lacks(na, NO_PROVENANCE), _lacks(nb, NO_PROVENANCE))
    if na and nb:
        facts_a, facts_b = _environment_facts(na), _environment_facts(nb)
        changes += _compared((k, facts_a[k], facts_b[k]) for k in facts_a)
    return changes + _variables(a, b)


def _environment_facts(node: NodeProvenance) -> dict[str, Any]:
    env = node.environment
    facts: dict[str, Any] = {"manager": env.get("manager")}
    for what, part, key in ENVIRONMENT_KEYS:
        value = _dict(env.get(part)).get(key)
        facts[what] = version_text(value) if isinstance(value, list) else value
    return facts


def _variables(a: RunProvenance, b: RunProvenance) -> list[Change]:
    va, vb = a.variables, b.variables
    why = "no variables recorded"
    unknown = _unknown(a, b, None if va is not None else why, None if vb is not None else why)
    if va is None or vb is None:
        return unknown
    changes = []
    for name in sorted(va.keys() | vb.keys()):
        what = f"variable {name}"
        if name not in va:
            changes.append(Change(what, None, vb[name], change="added", unset=NOT_RECORDED))
        elif name not in vb:
            changes.append(Change(what, va[name], None, change="removed", unset=NOT_RECORDED))
        elif va[name] != vb[name]:
            changes.append(Change(what, va[name], vb[name], unset=NOT_RECORDED))
    return changes


# -- hardware -----------------------------------------------------------------------------

SLURM_KEYS = ("partition", "num_nodes", "nodes", "node_list", "alloc_tres")


def hardware_changes(a: RunProvenance, b: RunProvenance) -> list[Change]:
    """Per node (by position), then the Slurm job's allocation: from its nodes' files, or
    for a user's own batch script (no vmrun code on its nodes) from `scontrol`'s record."""
    changes = _unknown(a, b, _lacks(a.recorded, NO_PROVENANCE), _lacks(b.recorded, NO_PROVENANCE))
    if not changes:
        changes = _compared([("nodes", len(a.nodes), len(b.nodes))])
        for index, (na, nb) in enumerate(zip(a.nodes, b.nodes, strict=False), 1):
            changes += _node_changes(index, na, nb)
    sa, sb = _first_slurm(a), _first_slurm(b)
    if sa is not None or sb is not None:
        sa, sb = sa or {}, sb or {}
        changes += _compared((f"slurm {k}", sa.get(k), sb.get(k)) for k in SLURM_KEYS)
    return changes


def _node_changes(index: int, na: NodeProvenance, nb: NodeProvenance) -> list[Change]:
    where = (index, na.name, nb.name)
    if not (na.recorded and nb.recorded):
        lacking = " and ".join(n.name for n in (na, nb) if not n.recorded)
        return [Change("provenance", na.recorded, nb.recorded, note=f"{lacking}: {NO_PROVENANCE}")]
    fa, fb = hardware_facts(na), hardware_facts(nb)
    return _compared(((k, fa[k], fb[k]) for k in fa), node=where)


def hardware_facts(node: NodeProvenance) -> dict[str, Any]:
    """A node's hardware as the diff compares it (memory in GiB, GPUs counted by name)."""
    hw = node.hardware
    cpu = _dict(hw.get("cpu"))
    gpus = hw.get("gpus")
    listed = [_dict(g) for g in gpus] if isinstance(gpus, list) else None
    return {
        "cpu": cpu.get("model"),
        "cpus": cpu.get("count"),
        "usable cpus": cpu.get("usable"),
        "memory": _gib(hw.get("memory_bytes")),
        "gpus": _counted(g.get("name") for g in listed) if listed is not None else None,
        "gpu memory": _gpu_memory(listed) if listed else None,
        "driver": hw.get("driver"),
        "os": hw.get("os"),
        "kernel": hw.get("kernel"),
        "arch": hw.get("arch"),
    }


def _first_slurm(run: RunProvenance) -> Mapping[str, Any] | None:
    return next((n.slurm for n in run.nodes if n.slurm is not None), run.allocation)


def _counted(values: Iterable[Any]) -> str:
    """`2x NVIDIA A100, 1x NVIDIA H100`, in the order first met; `none` for no values."""
    counts = Counter(str(v) if v is not None else "?" for v in values)
    return ", ".join(f"{n}x {v}" for v, n in counts.items()) or "none"


def _gpu_memory(gpus: list[dict[str, Any]]) -> str:
    """Each size the GPUs have, once: `81559 MiB`."""
    sizes = (g.get("memory_mib") for g in gpus)
    return ", ".join(dict.fromkeys(f"{v} MiB" if _number(v) else "?" for v in sizes))


def _gib(value: Any) -> str | None:
    return f"{value / 2**30:.1f} GiB" if _number(value) else None


# -- launch -------------------------------------------------------------------------------


def launch_changes(a: RunProvenance, b: RunProvenance) -> list[Change]:
    unknown = _unknown(a, b, _lacks(a.record, "no run.json"), _lacks(b.record, "no run.json"))
    if unknown:
        return unknown
    fa, fb = launch_facts(a.record), launch_facts(b.record)
    return _compared((k, fa[k], fb[k]) for k in fa)


def launch_facts(record: RunRecord) -> dict[str, Any]:
    """How the run was started, from its record, whichever of the three forms it has."""
    layout = layout_of(record)
    launch, job, image = record.launch, record.job or Job(), record.launch.image
    return {
        "where": layout.where,
        "launcher": layout.launcher,
        "script": launch.script or None,
        "args": list(launch.args) if launch.args is not None else None,
        "nodes": layout.nodes,
        "procs per node": layout.procs_per_node,
        "world size": layout.world_size,
        "nproc": launch.nproc,
        "hosts": list(layout.hosts) or None,
        "cluster": layout.cluster,
        "max_restarts": launch.max_restarts,
        "max_requeues": job.max_requeues,
        "gpus_per_node": job.gpus_per_node,
        "partition": job.partition,
        "time": job.time,
        "image": image.image if image else None,
        "image_digest": image.digest if image else None,
        "container_runtime": image.runtime if image else None,
        "env_keys": sorted(launch.env_keys) if launch.env_keys is not None else None,
    }


# -- text ---------------------------------------------------------------------------------


def render_text(diff: RunDiff) -> str:
    """Each section that has changes, under its header; one line when there is none."""
    if diff.same:
        return (
            f"runs {diff.a} and {diff.b}: no difference in code, packages, environment,"
            " hardware or launch\n"
        )
    said: set[str] = set()  # a note said in one section is not said again in the next
    lines = [f"runs {diff.a} -> {diff.b}:"]
    sections = (
        ("code", _lines(diff.code, said) + _patch_lines(diff.patch_diff)),
        ("packages", _package_lines(diff.packages, said)),
        ("environment", _lines(diff.environment, said)),
        ("hardware", _lines(diff.hardware, said)),
        ("launch", _lines(diff.launch, said)),
    )
    for title, body in sections:
        if body:
            lines += [f"{title}:", *body]
    return "\n".join(lines) + "\n"


def _lines(changes: Iterable[Change], said: set[str]) -> list[str]:
    lines: list[str] = []
    node = None
    for change in changes:
        if change.note in said:
            continue
        if change.note:
            said.add(change.note)
        if change.node != node and change.node is not None:
            index, a, b = change.node
            lines.append(f"  node {index} ({a if a == b else f'{a} / {b}'}):")
        node = change.node
        lines.append(("    " if node else "  ") + _line(change))
    return lines


def _line(c: Change) -> str:
    if c.note:
        return c.note
    if c.change == "added":
        return f"+ {c.what}: {_shown(c.b, c.unset)}"
    if c.change == "removed":
        return f"- {c.what}: {_shown(c.a, c.unset)}"
    return f"{c.what}: {_shown(c.a, c.unset)} -> {_shown(c.b, c.unset)}"


def _package_lines(packages: PackageChanges, said: set[str]) -> list[str]:
    return [
        *_lines(packages.notes, said),
        *(f"  + {k} {_shown(v)}" for k, v in packages.added.items()),
        *(f"  - {k} {_shown(v)}" for k, v in packages.removed.items()),
        *(f"  ~ {k} {_shown(a)} -> {_shown(b)}" for k, (a, b) in packages.changed.items()),
    ]


def _patch_lines(text: str | None) -> list[str]:
    return ["  patch diff:", *(f"    {ln}" for ln in text.splitlines())] if text else []


def _shown(value: Any, unset: str = "(none)") -> str:
    """A value as the text shows it: hashes cut to 12, lists joined, None as `unset`."""
    if value is None:
        return unset
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value[:12] if _HASH.fullmatch(value) else value
    if isinstance(value, list):
        return _some([_shown(v) for v in value]) if value else "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_shown(v)}" for k, v in value.items())
    return str(value)


# -- helpers ------------------------------------------------------------------------------


def _compared(
    facts: Iterable[tuple[str, Any, Any]], node: tuple[int, str, str] | None = None
) -> list[Change]:
    return [Change(what, a, b, node=node) for what, a, b in facts if a != b]


def _unknown(
    a: RunProvenance, b: RunProvenance, why_a: str | None, why_b: str | None
) -> list[Change]:
    """A note for each run whose facts of a section are unknown (`why`: what it lacks);
    one for both when they lack the same."""
    if why_a and why_a == why_b:
        both = a.run_id if a.run_id == b.run_id else f"{a.run_id} and {b.run_id}"
        return [Change("unknown", why_a, why_b, note=f"{both}: {why_a}")]
    return [
        Change("unknown", why_a, why_b, note=f"{run.run_id}: {why}")
        for run, why in ((a, why_a), (b, why_b))
        if why
    ]


def _lacks(found: object, why: str) -> str | None:
    return None if found else why


def _first_recorded(run: RunProvenance) -> NodeProvenance | None:
    return next((n for n in run.nodes if n.recorded), None)


def _some(names: list[str]) -> str:
    """The first few names, then how many more."""
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
