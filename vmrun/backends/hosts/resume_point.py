"""Where a resumed run goes on from when its checkpoints are sharded: the newest
torch.distributed.checkpoint (DCP) folder that every node can hold whole, and what each
node gets of it.

A DCP checkpoint is scattered: each node holds the shards its own ranks wrote, rank 0's node
the `.metadata` that names them all, the run's bucket (with --store) every node's shards,
the metadata last. A resumed attempt may place its ranks on other nodes than the one before
(a spare, two new hosts), and a rank may read any shard (FSDP reshards on load), so every
node needs the whole folder. Each node says what it holds (`checkpoint_layout.py scan`,
every folder with the files its .metadata names and their sizes there); the bucket is
listed here, its .metadata read here (vmrun.hostside.checkpoint_layout's reader: nothing in
it runs). A folder can be made whole when its .metadata is somewhere and every file it names
is somewhere (a node or the bucket) at the size it needs: the same rule as
checkpoint_layout's, over every place at once. The newest such folder is chosen; each newer
one is named with what it lacks everywhere. A node keeps what it holds; what it lacks comes
from the bucket (rclone on the node, straight from it), else from a peer that holds it
(through this machine, as vmrun.backends.hosts.resume copies a snapshot).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vmrun import hostside
from vmrun.errors import RemoteError, VmrunError
from vmrun.hostside.checkpoint_layout import (
    METADATA,
    READ_FAILED,
    SHARD_SUFFIX,
    Layout,
    epoch_of,
    is_temporary,
    read_needs,
)
from vmrun.reporting import Reporter
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.inventory import HostEntry

if TYPE_CHECKING:
    from pathlib import Path

    from vmrun.store_url import StoreURL
    from vmrun.stores.access import Access
    from vmrun.stores.bucket import Object
    from vmrun.transfer.types import Progress

BUCKET = "the bucket"  # a source that is no node
NAMED = 4  # files named per skipped checkpoint, and checkpoints skipped; the rest counted


@dataclass(frozen=True)
class Get:
    """One file a node lacks of the chosen checkpoint, and where it comes from (BUCKET or
    a peer node's label)."""

    node: str
    name: str
    source: str


@dataclass(frozen=True)
class Skipped:
    """A newer checkpoint that no place holds whole, and why."""

    path: str
    why: str


@dataclass(frozen=True)
class Point:
    """What was decided: the checkpoint (its path under the run's output folder; None when
    none can be made whole), its epoch and shard count, the newer ones skipped, and what
    each node gets."""

    path: str | None
    epoch: int | None = None
    shards: int = 0
    skipped: tuple[Skipped, ...] = ()
    gets: tuple[Get, ...] = ()

    def lines(self, rid: str) -> list[str]:
        """What the resume says: each skipped checkpoint, then the one it goes on from."""
        said = [
            f"run {rid}: skipped {s.path}, newer but not whole anywhere: {s.why}"
            for s in self.skipped[:NAMED]
        ]
        if len(self.skipped) > NAMED:
            said.append(f"run {rid}: skipped {len(self.skipped) - NAMED} older ones too")
        if self.path is None:
            return [*said, f"run {rid}: no sharded checkpoint is whole anywhere: from the start"]
        shards = f"{self.shards} shard" if self.shards == 1 else f"{self.shards} shards"
        got: dict[str, set[str]] = {}
        for get in self.gets:
            got.setdefault(get.source, set()).add(get.node)
        where = "; ".join(
            f"to {', '.join(sorted(nodes))} from {source}" for source, nodes in sorted(got.items())
        )
        held = f" ({where})" if where else " (every node holds it)"
        return [*said, f"run {rid}: resumes from {self.path}, complete: {shards}{held}"]


@dataclass(frozen=True)
class Held:
    """One place's files of one checkpoint folder: name -> size; `needs` (name -> least
    size, .metadata included) where this place's .metadata was read, else None."""

    files: Mapping[str, int]
    needs: Mapping[str, int] | None
    mtime: float = 0.0


def node_holdings(layout: Layout) -> dict[str, Held]:
    """A node's DCP folders as `checkpoint_layout.py scan` found them."""
    found: dict[str, Held] = {}
    for point in layout.checkpoints:
        if point.kind != "dcp" or _aside(point.path):
            continue
        files = {f.name: f.size for f in point.files if f.size is not None}
        readable = point.metadata and point.metadata != READ_FAILED
        needs = {f.name: f.min_size for f in point.files} if readable else None
        found[posixpath.normpath(point.path)] = Held(files, needs, point.mtime)
    return found


def bucket_folders(objects: Sequence[Object]) -> dict[str, dict[str, int]]:
    """The DCP folders among a run's objects (a folder holding a shard or a .metadata):
    path -> {name: size}; the record's own objects are never one."""
    from vmrun.stores.sync import RECORD

    folders: dict[str, dict[str, int]] = {}
    for obj in objects:
        folder, _, name = obj.key.rpartition("/")
        if _aside(folder) or folder == RECORD or folder.startswith(RECORD + "/"):
            continue
        folders.setdefault(folder or ".", {})[name] = obj.size
    return {
        path: files
        for path, files in folders.items()
        if METADATA in files or any(n.endswith(SHARD_SUFFIX) and not is_temporary(n) for n in files)
    }


def _aside(path: str) -> bool:
    """vmrun's own folders (`.vmrun/`, what `--fresh` moved aside into `.vmrun-stale-*/`):
    no checkpoint there is the run's."""
    return any(part.startswith(".vmrun") for part in path.split("/"))


def bucket_holdings(
    folders: Mapping[str, Mapping[str, int]],
    modified: Mapping[str, float],
    read: Callable[[str], bytes],
) -> dict[str, Callable[[], Held]]:
    """Each bucket folder as a Held made on demand (its .metadata read only when asked:
    `read(path)` gives its bytes)."""

    def held(path: str) -> Callable[[], Held]:
        def make() -> Held:
            files = dict(folders[path])
            needs = None
            if METADATA in files:
                named, how = read_needs(read(path))
                if how != READ_FAILED:
                    needs = {**named, METADATA: 1}
            return Held(files, needs, modified.get(path, 0.0))

        return make

    return {path: held(path) for path in folders}


def choose(
    labels: Sequence[str],
    nodes: Mapping[str, Mapping[str, Held]],
    bucket: Mapping[str, Callable[[], Held]] | None = None,
    modified: Mapping[str, float] | None = None,
) -> Point:
    """The newest checkpoint every node of `labels` (master first) can hold whole, from what
    each node holds (`nodes`: label -> path -> Held) and the bucket's (path -> Held, made
    on demand; `modified`: each bucket folder's newest object time, for the order)."""
    bucket = bucket or {}
    times: dict[str, float] = {path: 0.0 for path in bucket}
    times.update(modified or {})
    for held in nodes.values():
        for path, h in held.items():
            times[path] = max(times.get(path, 0.0), h.mtime)
    order = sorted(times, key=lambda p: (_epoch(p), times[p]), reverse=True)
    skipped: list[Skipped] = []
    for path in order:
        here = {n: nodes.get(n, {}).get(path) for n in labels}
        stored = bucket[path]() if path in bucket else None
        needs = next((h.needs for h in here.values() if h and h.needs), None)
        needs = needs or (stored.needs if stored else None)
        if not needs:
            skipped.append(Skipped(path, f"no {METADATA} anywhere (still being written)"))
            continue
        sources = {n: h.files for n, h in here.items() if h}
        if stored:
            sources[BUCKET] = stored.files
        lacking = [
            name for name, least in sorted(needs.items()) if not _somewhere(sources, name, least)
        ]
        if lacking:
            skipped.append(Skipped(path, "missing " + _named(lacking)))
            continue
        gets = tuple(
            Get(node, name, _source(sources, node, name, least))
            for node in labels
            for name, least in sorted(needs.items())
            if not _holds(sources.get(node, {}), name, least)
        )
        shards = sum(1 for n in needs if n.endswith(SHARD_SUFFIX))
        return Point(path, epoch_of(posixpath.basename(path)), shards, tuple(skipped), gets)
    return Point(None, skipped=tuple(skipped))


def _epoch(path: str) -> int:
    found = epoch_of(posixpath.basename(path))
    return -1 if found is None else found


def _holds(files: Mapping[str, int], name: str, least: int) -> bool:
    return name in files and files[name] >= least


def _somewhere(sources: Mapping[str, Mapping[str, int]], name: str, least: int) -> bool:
    return any(_holds(files, name, least) for files in sources.values())


def _source(sources: Mapping[str, Mapping[str, int]], node: str, name: str, least: int) -> str:
    """The bucket where it holds the file (straight to the node), else the first peer."""
    if _holds(sources.get(BUCKET, {}), name, least):
        return BUCKET
    return next(s for s, files in sources.items() if s != node and _holds(files, name, least))


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED])
    more = len(names) - NAMED
    return f"{shown} and {more} more" if more > 0 else shown


# -- on the nodes ------------------------------------------------------------------------


def scan(conn: Connection, root: str, python: str = "python3") -> Layout:
    """What a node holds under its run's output folder (`checkpoint_layout.py scan`); an
    empty Layout where the folder is not there yet (a spare, a new host)."""
    from vmrun.transfer.streams import capture

    argv = hostside.command("checkpoint_layout.py", "scan", root, python=python)
    command = quoting.plain_command(argv, activity=False)
    status, out, err = capture(conn, command, what="the checkpoint scan")
    if status == 2 and "no such folder" in err:
        return Layout(root)
    if status != 0:
        raise RemoteError(f"the checkpoint scan failed: {err.strip()[-300:]}", host=conn.label)
    import json

    try:
        return Layout.from_json(json.loads(out.decode("utf-8", "replace")))
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteError(f"the checkpoint scan said no layout: {exc}", host=conn.label) from None


def exclude_glob(paths: Sequence[str], tail: str = "") -> str:
    """One rclone filter rule matching each of `paths` (from the copy's root), `tail`
    after it (`/**`: everything under each); "" for no paths."""
    if not paths:
        return ""
    escaped = [_glob_escape(p) for p in paths]
    return "/{" + ",".join(escaped) + "}" + tail


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "\\*?[]{}," else c for c in text)


@dataclass(frozen=True)
class Store:
    """The run's place in its bucket and who may read it (this machine and each node)."""

    place: StoreURL
    access: Access


def give(
    group: Group,
    labels: Sequence[str],
    out_dirs: Mapping[str, str],
    rid: str,
    out: Reporter,
    *,
    store: Store | None = None,
    pythons: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    must_read_bucket: bool = False,
) -> Point | None:
    """Every node of `labels` holds the newest checkpoint that can be made whole, said;
    None when no node and no bucket holds a sharded checkpoint at all (the run's own
    snapshot, if any, is vmrun.backends.hosts.resume's). `out_dirs`: each node's output
    folder. The bucket is read only where a node holds a sharded checkpoint, or with
    `must_read_bucket` (the nodes are new); where it cannot be read then, the nodes' own
    copies are used, said."""
    from vmrun.ssh.group import raise_for_failures

    pythons = pythons or {}
    outcomes = group.map(
        lambda entry, conn: scan(conn, out_dirs[entry.label], pythons.get(entry.label, "python3")),
        only=set(labels),
    )
    raise_for_failures(outcomes, one_as_itself=True)
    held = {o.host: node_holdings(o.value) for o in outcomes if o.value is not None}
    bucket: dict[str, Callable[[], Held]] = {}
    modified: dict[str, float] = {}
    folders: dict[str, dict[str, int]] = {}
    if store is not None and (must_read_bucket or any(held.values())):
        try:
            bucket, modified, folders = _read_bucket(store)
        except VmrunError as exc:
            if must_read_bucket:
                raise
            out.warn(f"run {rid}: the bucket's checkpoints cannot be read here: {exc.one_line()}")
    if not bucket and not any(held.values()):
        return None
    point = choose(labels, held, bucket, modified)
    for line in point.lines(rid):
        out.info(line)
    if point.path is not None and point.gets:
        _fetch(group, point, out_dirs, store, list(folders.get(point.path, {})), progress)
    return point


def _read_bucket(
    store: Store,
) -> tuple[dict[str, Callable[[], Held]], dict[str, float], dict[str, dict[str, int]]]:
    """The bucket's DCP folders: each as a Held made on demand, each one's newest object
    time, and each one's files."""
    from vmrun.stores.bucket import calling, client, objects

    s3 = client(store.access)
    found = objects(s3, store.place)
    folders = bucket_folders(found)
    modified: dict[str, float] = {}
    for obj in found:
        folder = obj.key.rpartition("/")[0] or "."
        if folder in folders:
            modified[folder] = max(modified.get(folder, 0.0), obj.modified)

    def read(path: str) -> bytes:
        key = store.place.join(path, METADATA) if path != "." else store.place.join(METADATA)
        with calling(key):
            body: bytes = s3.get_object(Bucket=key.bucket, Key=key.prefix)["Body"].read()
        return body

    return bucket_holdings(folders, modified, read), modified, folders


def _fetch(
    group: Group,
    point: Point,
    out_dirs: Mapping[str, str],
    store: Store | None,
    stored: Sequence[str],
    progress: Progress | None,
) -> None:
    """Each node's gets: the bucket's in one copy per node (`stored`: the files of the
    bucket's folder; every other one left out), then each peer's through this machine."""
    import tempfile
    from pathlib import Path

    from vmrun.ssh.group import raise_for_failures
    from vmrun.transfer.types import Progress

    assert point.path is not None
    path = point.path
    shown = progress or Progress()
    from_bucket: dict[str, list[str]] = {}
    for get in point.gets:
        if get.source == BUCKET:
            from_bucket.setdefault(get.node, []).append(get.name)

    def one(entry: HostEntry, conn: Connection) -> None:
        assert store is not None
        others = sorted(set(stored) - set(from_bucket[entry.label]))
        source = store.place if path == "." else store.place.join(path)
        dest = posixpath.normpath(posixpath.join(out_dirs[entry.label], path))
        _from_bucket(conn, entry, store, source, dest, others, shown)

    if from_bucket:
        raise_for_failures(group.map(one, only=set(from_bucket)), one_as_itself=True)
    peers = [g for g in point.gets if g.source != BUCKET]
    if peers:
        with tempfile.TemporaryDirectory(prefix="vmrun-resume-") as tmp:
            for get in peers:
                rel = posixpath.normpath(posixpath.join(path, get.name))
                copy_between(group, get.source, [get.node], out_dirs, "", rel, Path(tmp))


def _from_bucket(
    conn: Connection,
    entry: HostEntry,
    store: Store,
    source: StoreURL,
    dest: str,
    others: Sequence[str],
    progress: Progress,
) -> None:
    """The bucket's folder `source` into the node's `dest`, its `others` left out (what
    the node holds stays as it is)."""
    from vmrun.stores.mover import copy_from_store

    got = copy_from_store(
        conn, source, dest, store.access.on(entry.vars), progress, exclude=exclude_glob(others)
    )
    if got.report.failed:
        raise RemoteError(
            f"{len(got.report.failed)} file(s) of {source} did not arrive intact",
            host=entry.label,
            code="store-copy-failed",
        )


def copy_between(
    group: Group,
    src: str,
    dests: Sequence[str],
    out_dirs: Mapping[str, str],
    base: str,
    rel: str,
    tmp: Path,
) -> None:
    """One file of the run's output folder from node `src` to each of `dests`, through
    this machine (verified on both legs); `base`: the folder of a node without its own."""
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
