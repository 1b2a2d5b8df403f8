"""Which checkpoints a folder tree holds, and whether each is complete, without torch.

    python3 checkpoint_layout.py scan ROOT    # every checkpoint under ROOT, newest first
    python3 checkpoint_layout.py needs DIR    # the files one DCP checkpoint folder needs
    python3 checkpoint_layout.py lacks DIR < LSJSON   # what a copy of DIR still lacks

`scan` and `needs` print one JSON document (`version` SCHEMA_VERSION) and exits 0; a bad argument is
one line on stderr, exit 2. Run on the hosts by their python3 (stdlib only, Python 3.8) and
imported here as `vmrun.hostside.checkpoint_layout`, whose frozen dataclasses read the
document back (`Layout.from_json`), so the two sides cannot disagree on its shape.

A torch.distributed.checkpoint (DCP) checkpoint is a folder: each rank writes its shard
files (`__<rank>_<n>.distcp`, under their final names: one may be half written), then rank 0
writes `.metadata` (as `.metadata.tmp`, renamed into place once every rank is done), which
names every file and where in it each piece lies. So it is complete when `.metadata` is
there and every file it names is there and at least as long as its last piece ends
(offset + length). `.metadata` is a pickle: it is read by an Unpickler whose every class is
an inert stand-in (`Stub`), never the class named, so a crafted file runs nothing; its
`_StorageInfo` objects give each file's pieces. A pickle that cannot be walked so (another
torch's layout) still names its files: its strings ending `.distcp`, read opcode by opcode
(no sizes then). A folder of shards without `.metadata` is one being written (or left
half-written): incomplete. The template trainer's `snapshot.pt` (written whole and renamed
into place) is a checkpoint of its own kind, complete when present.

A temporary name (`*.tmp`, `*.tmp-PID`, `*.partial`, a dot-file but `.metadata`: DCP's own
is `.metadata.tmp`) is a file still being written and never counts as a checkpoint's file.
Newest first: by the number in the name (`epoch-N`, `step-N`, else its last digits), then by
modification time.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
METADATA = ".metadata"
SHARD_SUFFIX = ".distcp"
SNAPSHOT = "snapshot.pt"
KINDS = ("dcp", "snapshot")
# how .metadata was read: its pieces walked (sizes known), its file names only, or not at all
READ_WALKED, READ_NAMES, READ_FAILED = "walked", "names", "unreadable"
_NUMBERED = re.compile(r"(?:epoch|step)[-_]?(\d+)", re.IGNORECASE)
_DIGITS = re.compile(r"(\d+)(?!.*\d)")


def is_temporary(name: str) -> bool:
    """A name a writer uses before renaming the file into place (DCP's `.metadata.tmp`, the
    template's `.snapshot.pt.tmp-PID`, a bucket copier's `*.partial`, rsync's dot-files)."""
    if name == METADATA:
        return False
    return (
        name.startswith(".")
        or name.endswith((".tmp", ".partial"))
        or ".tmp-" in name
        or ".tmp." in name
    )


def epoch_of(name: str) -> int | None:
    """The number a checkpoint's name carries (`epoch-12` -> 12, `step_300`, `ckpt7`)."""
    found = _NUMBERED.search(name) or _DIGITS.search(name)
    return int(found.group(1)) if found else None


# -- .metadata, read without torch and without running anything ---------------------------


class Stub:
    """What every class named in a .metadata pickle becomes: it keeps the arguments it was
    made with and the state it was given, and does nothing else."""

    qualname = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Stub:
        made = object.__new__(cls)
        made.args, made.state = args, None
        return made

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def fields(self) -> dict[str, Any]:
        """The object's attributes as pickled (a dataclass's __dict__; slots too)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slot state)
            merged: dict[str, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        return state if isinstance(state, dict) else {}


class _StubUnpickler(pickle.Unpickler):
    """find_class hands out a Stub subclass per name: nothing of the named module is
    imported or called. Persistent ids are refused (the base class's default)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        key = (str(module), str(name))
        if key not in self.classes:
            stub = "Stub_" + re.sub(r"\W", "_", key[1])[:60]
            self.classes[key] = type(stub, (Stub,), {"qualname": f"{key[0]}.{key[1]}"})
        return self.classes[key]


def _plain_name(name: Any) -> bool:
    """A file name inside the checkpoint folder: one component, nothing that climbs out."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def _whole(value: Any) -> int | None:
    """A size or an offset: an int >= 0 (None: anything else)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else None


def _walk_pieces(root: Any) -> dict[str, int] | None:
    """file -> the least size it must have, from every `_StorageInfo` in the graph; None
    when there is none, or one is malformed."""
    need: dict[str, int] = {}
    seen = set()
    todo = [root]
    found = False
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
        elif isinstance(item, Stub):
            attrs = item.fields()
            if item.qualname.endswith("._StorageInfo"):
                name = attrs.get("relative_path")
                offset, length = _whole(attrs.get("offset")), _whole(attrs.get("length"))
                if not _plain_name(name) or offset is None or length is None:
                    return None
                name = str(name)
                need[name] = max(need.get(name, 0), offset + length)
                found = True
            todo.extend(attrs.values())
            todo.extend(item.args)
    return need if found else None


def _names_in_opcodes(data: bytes) -> dict[str, int]:
    """The `.distcp` names among the pickle's strings (sizes unknown: 0), read opcode by
    opcode; a pickle broken part-way gives the names before the break."""
    names: dict[str, int] = {}
    try:
        for _op, arg, _pos in pickletools.genops(data):
            if isinstance(arg, str) and arg.endswith(SHARD_SUFFIX) and _plain_name(arg):
                names[arg] = 0
    except Exception:  # whatever the bytes are, the names so far stand
        pass
    return names


def read_needs(metadata: bytes) -> tuple[dict[str, int], str]:
    """(file -> least size, how it was read) from a .metadata's bytes; nothing in them runs."""
    try:
        root = _StubUnpickler(metadata).load()
    except Exception:  # any malformed pickle: fall back to its strings
        root = None
    walked = _walk_pieces(root) if root is not None else None
    if walked:
        return walked, READ_WALKED
    names = _names_in_opcodes(metadata)
    return names, (READ_NAMES if names else READ_FAILED)


# -- what a folder tree holds --------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointFile:
    """One file a checkpoint needs: at least `min_size` bytes (0: unknown); `size` as found
    (None: not there)."""

    name: str
    min_size: int
    size: int | None

    @property
    def missing(self) -> bool:
        return self.size is None

    @property
    def short(self) -> bool:
        return self.size is not None and self.size < self.min_size


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint: `path` relative to the scanned root (`.` for the root itself)."""

    kind: str  # dcp | snapshot
    path: str
    epoch: int | None
    mtime: float
    complete: bool
    files: tuple[CheckpointFile, ...]
    problem: str = ""  # why it is not complete, one line ("" when it is)
    metadata: str = ""  # dcp: READ_WALKED, READ_NAMES or READ_FAILED; "" without .metadata

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files if f.missing)

    @property
    def short(self) -> tuple[CheckpointFile, ...]:
        return tuple(f for f in self.files if f.short)

    @property
    def shards(self) -> int:
        return sum(1 for f in self.files if f.name.endswith(SHARD_SUFFIX))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["missing"] = list(self.missing)
        data["short"] = [asdict(f) for f in self.short]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoint:
        files = tuple(
            CheckpointFile(str(f["name"]), int(f["min_size"]), f.get("size")) for f in data["files"]
        )
        return cls(
            kind=str(data["kind"]),
            path=str(data["path"]),
            epoch=data.get("epoch"),
            mtime=float(data["mtime"]),
            complete=bool(data["complete"]),
            files=files,
            problem=str(data.get("problem", "")),
            metadata=str(data.get("metadata", "")),
        )


@dataclass(frozen=True)
class Layout:
    """Every checkpoint under `root`, newest first."""

    root: str
    checkpoints: tuple[Checkpoint, ...] = field(default_factory=tuple)
    version: int = SCHEMA_VERSION

    def newest_complete(self) -> Checkpoint | None:
        return next((c for c in self.checkpoints if c.complete), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "root": self.root,
            "checkpoints": [c.to_json() for c in self.checkpoints],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        if data.get("version") != SCHEMA_VERSION:
            raise ValueError(
                f"checkpoint layout version {data.get('version')!r} is not {SCHEMA_VERSION}"
            )
        return cls(
            root=str(data["root"]),
            checkpoints=tuple(Checkpoint.from_json(c) for c in data["checkpoints"]),
        )


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _problem(files: list[CheckpointFile], how: str) -> str:
    parts = []
    missing = [f.name for f in files if f.missing]
    short = [f for f in files if f.short]
    if how == READ_FAILED:
        parts.append(f"{METADATA} names no file")
    if missing:
        parts.append("missing " + ", ".join(missing))
    if short:
        parts.append(
            "short " + ", ".join(f"{f.name} ({f.size} of {f.min_size} bytes)" for f in short)
        )
    return "; ".join(parts)


def dcp_checkpoint(folder: str, rel: str = ".") -> Checkpoint:
    """The DCP checkpoint in `folder` (with or without its .metadata)."""
    meta_path = os.path.join(folder, METADATA)
    name = os.path.basename(os.path.abspath(folder))
    try:
        with open(meta_path, "rb") as fh:
            metadata: bytes | None = fh.read()
    except OSError:
        metadata = None
    if metadata is None:  # being written, or left half-written: the shards there so far
        shards = sorted(
            n for n in _listdir(folder) if n.endswith(SHARD_SUFFIX) and not is_temporary(n)
        )
        files = [CheckpointFile(n, 0, _size(os.path.join(folder, n))) for n in shards]
        files.append(CheckpointFile(METADATA, 1, None))
        newest = max([_mtime(os.path.join(folder, n)) for n in shards] or [_mtime(folder)])
        return Checkpoint(
            "dcp", rel, epoch_of(name), newest, False, tuple(files), f"missing {METADATA}", ""
        )
    needs, how = read_needs(metadata)
    files = [CheckpointFile(n, needs[n], _size(os.path.join(folder, n))) for n in sorted(needs)]
    files.append(CheckpointFile(METADATA, 1, len(metadata)))
    problem = _problem(files, how)
    return Checkpoint(
        "dcp", rel, epoch_of(name), _mtime(meta_path), not problem, tuple(files), problem, how
    )


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def scan(root: str) -> Layout:
    """Every checkpoint under `root` (symlinked folders are not followed; a DCP folder's
    own subfolders are not searched), newest first."""
    found: list[Checkpoint] = []
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        here = set(names)
        if METADATA in here or any(n.endswith(SHARD_SUFFIX) and not is_temporary(n) for n in here):
            found.append(dcp_checkpoint(folder, rel))
            dirs[:] = []
            continue
        if SNAPSHOT in here:
            path = os.path.join(folder, SNAPSHOT)
            size = _size(path)
            found.append(
                Checkpoint(
                    "snapshot",
                    SNAPSHOT if rel == "." else os.path.join(rel, SNAPSHOT),
                    None,
                    _mtime(path),
                    size is not None,
                    (CheckpointFile(SNAPSHOT, 1, size),),
                )
            )
        dirs.sort()
    found.sort(key=lambda c: (c.epoch if c.epoch is not None else -1, c.mtime), reverse=True)
    return Layout(root, tuple(found))


def lacks(folder: str, listed: Any) -> list[str]:
    """What a copy of the DCP folder lacks before its .metadata may join it: each file the
    local .metadata names that the copy (`listed`: rclone lsjson's list of the copy's
    folder, {"Path", "Size"} each) does not hold at the size it needs, as `NAME` or
    `NAME (SIZE of NEED bytes)`. A bucket copier sends .metadata only when this is empty,
    so a bucket never holds a .metadata that points at missing shards."""
    held: dict[str, int] = {}
    for item in listed if isinstance(listed, list) else []:
        if isinstance(item, dict) and isinstance(item.get("Path"), str):
            size = _whole(item.get("Size"))
            held[item["Path"]] = size if size is not None else 0
    try:
        with open(os.path.join(folder, METADATA), "rb") as fh:
            needs, how = read_needs(fh.read())
    except OSError:
        return [METADATA]  # nothing to compare with: it has not been written here
    if how == READ_FAILED:
        return [f"{METADATA} names no file"]
    out = []
    for name in sorted(needs):
        if name not in held:
            out.append(name)
        elif held[name] < needs[name]:
            out.append(f"{name} ({held[name]} of {needs[name]} bytes)")
    return out


def main(argv: list[str]) -> int:
    usage = "usage: checkpoint_layout.py scan ROOT | needs DIR | lacks DIR < LSJSON"
    if len(argv) != 2 or argv[0] not in ("scan", "needs", "lacks"):
        print(usage, file=sys.stderr)
        return 2
    what, where = argv
    if not os.path.isdir(where):
        print(f"checkpoint_layout.py: {where}: no such folder", file=sys.stderr)
        return 2
    if what == "lacks":
        try:
            listed = json.load(sys.stdin)
        except ValueError:
            print("checkpoint_layout.py: lacks: stdin is no JSON list", file=sys.stderr)
            return 2
        for line in lacks(where, listed):
            print(line)
        return 0
    if what == "scan":
        document = scan(where).to_json()
    else:
        document = {"version": SCHEMA_VERSION, **dcp_checkpoint(where).to_json()}
    json.dump(document, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
