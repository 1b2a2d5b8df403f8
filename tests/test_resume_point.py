"""Which sharded checkpoint a resumed run goes on from, and what each node gets of it
(vmrun.backends.hosts.resume_point): each node's holdings from a real scan of a real 2-rank
DCP checkpoint (tests/fixtures/dcp) copied and spoilt the ways a lost node, a half-written
save or a cut copy spoil it; the bucket as a listing and the .metadata bytes it would
give. `give` on stand-in hosts: what is copied where, from the bucket or a peer."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT
from fake_group import FakeGroup

from vmrun.backends.hosts import resume_point as rp
from vmrun.hostside import checkpoint_layout as layout
from vmrun.reporting import Recorder

FIXTURE = ROOT / "tests" / "fixtures" / "dcp" / "two-ranks"
S0, S1, META = "__0_0.distcp", "__1_0.distcp", ".metadata"
WHOLE = (S0, S1, META)


def node(tmp_path: Path, label: str, folders: dict[str, tuple[str, ...]]) -> Path:
    """A node's output folder holding these files of the fixture in each folder."""
    root = tmp_path / label
    root.mkdir()
    for folder, names in folders.items():
        (root / folder).mkdir(parents=True)
        for name in names:
            shutil.copy(FIXTURE / name, root / folder / name)
    return root


def held(root: Path) -> dict[str, rp.Held]:
    return rp.node_holdings(layout.scan(str(root)))


class Bucket:
    """A run's bucket place: key -> bytes (the fixture's files); which .metadata were read."""

    def __init__(self, folders: dict[str, tuple[str, ...]], times: dict[str, float] | None = None):
        self.data = {
            f"{folder}/{name}": (FIXTURE / name).read_bytes()
            for folder, names in folders.items()
            for name in names
        }
        self.data[".vmrun/run.json"] = b"{}"
        self.data["metrics.jsonl"] = b"{}\n"
        self.times = times or {}
        self.read: list[str] = []

    def folders(self) -> dict[str, dict[str, int]]:
        objects = [rp_object(k, len(v)) for k, v in self.data.items()]
        return rp.bucket_folders(objects)

    def holdings(self) -> dict[str, Callable[[], rp.Held]]:
        def read(path: str) -> bytes:
            self.read.append(path)
            return self.data[f"{path}/{META}"]

        return rp.bucket_holdings(self.folders(), self.times, read)


def rp_object(key: str, size: int) -> object:
    from vmrun.stores.bucket import Object

    return Object(key, size, "", 0.0)


def test_new_hosts_get_the_newest_checkpoint_whole_in_the_bucket_and_newer_ones_are_named() -> None:
    bucket = Bucket(
        {
            "checkpoints/epoch-2": WHOLE,
            "checkpoints/epoch-4": WHOLE,
            "checkpoints/epoch-6": (S0, S1),  # its .metadata not sent yet
        }
    )
    point = rp.choose(["c", "d"], {"c": {}, "d": {}}, bucket.holdings())
    assert point.path == "checkpoints/epoch-4" and point.epoch == 4 and point.shards == 2
    assert point.skipped == (
        rp.Skipped("checkpoints/epoch-6", "no .metadata anywhere (still being written)"),
    )
    assert sorted((g.node, g.name, g.source) for g in point.gets) == [
        (n, f, rp.BUCKET) for n in ("c", "d") for f in sorted(WHOLE)
    ]
    assert bucket.read == ["checkpoints/epoch-4"]  # epoch-2's never read: not needed
    lines = point.lines("r1")
    assert lines[-1] == (
        "run r1: resumes from checkpoints/epoch-4, complete: 2 shards (to c, d from the bucket)"
    )
    assert lines[0].startswith("run r1: skipped checkpoints/epoch-6, newer but not whole")


def test_a_lost_workers_shards_come_from_the_bucket_and_the_master_keeps_its_own(
    tmp_path: Path,
) -> None:
    """The master h1 holds its shard and .metadata of epoch-2 and epoch-4, and epoch-6 whose
    worker shard never reached the bucket; the spare holds nothing."""
    h1 = node(
        tmp_path,
        "h1",
        {f"checkpoints/epoch-{n}": (S0, META) for n in (2, 4, 6)},
    )
    spare = node(tmp_path, "spare", {})
    bucket = Bucket(
        {
            "checkpoints/epoch-2": WHOLE,
            "checkpoints/epoch-4": WHOLE,
            "checkpoints/epoch-6": (S0,),
        }
    )
    point = rp.choose(["h1", "spare"], {"h1": held(h1), "spare": held(spare)}, bucket.holdings())
    assert point.path == "checkpoints/epoch-4"
    assert point.skipped == (rp.Skipped("checkpoints/epoch-6", f"missing {S1}"),)
    assert sorted((g.node, g.name, g.source) for g in point.gets) == sorted(
        [
            ("h1", S1, rp.BUCKET),
            ("spare", S0, rp.BUCKET),
            ("spare", S1, rp.BUCKET),
            ("spare", META, rp.BUCKET),
        ]
    )


def test_without_a_bucket_a_file_comes_from_the_peer_that_holds_it(tmp_path: Path) -> None:
    h1 = node(tmp_path, "h1", {"checkpoints/epoch-4": (S0, META)})
    h2 = node(tmp_path, "h2", {"checkpoints/epoch-4": (S1,)})
    point = rp.choose(["h1", "h2"], {"h1": held(h1), "h2": held(h2)})
    assert point.path == "checkpoints/epoch-4"
    assert sorted((g.node, g.name, g.source) for g in point.gets) == sorted(
        [("h1", S1, "h2"), ("h2", S0, "h1"), ("h2", META, "h1")]
    )


def test_a_shard_cut_short_everywhere_is_not_whole_and_an_older_one_is_chosen(
    tmp_path: Path,
) -> None:
    h1 = node(tmp_path, "h1", {"checkpoints/epoch-2": WHOLE, "checkpoints/epoch-4": WHOLE})
    shard = h1 / "checkpoints/epoch-4" / S1
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(size - 1)
    bucket = Bucket({"checkpoints/epoch-2": WHOLE, "checkpoints/epoch-4": (S0, META)})
    point = rp.choose(["h1"], {"h1": held(h1)}, bucket.holdings())
    assert point.path == "checkpoints/epoch-2" and point.gets == ()
    assert point.skipped == (rp.Skipped("checkpoints/epoch-4", f"missing {S1}"),)
    assert point.lines("r")[-1].endswith("complete: 2 shards (every node holds it)")


def test_a_short_copy_on_a_node_is_replaced_from_the_bucket(tmp_path: Path) -> None:
    h1 = node(tmp_path, "h1", {"checkpoints/epoch-4": WHOLE})
    with open(h1 / "checkpoints/epoch-4" / S0, "r+b") as fh:
        fh.truncate(10)
    bucket = Bucket({"checkpoints/epoch-4": WHOLE})
    point = rp.choose(["h1"], {"h1": held(h1)}, bucket.holdings())
    assert [(g.node, g.name, g.source) for g in point.gets] == [("h1", S0, rp.BUCKET)]


def test_nothing_whole_anywhere_is_said_as_a_start_from_scratch(tmp_path: Path) -> None:
    h1 = node(tmp_path, "h1", {"checkpoints/epoch-2": (S0, META)})
    point = rp.choose(["h1", "h2"], {"h1": held(h1), "h2": {}}, Bucket({}).holdings())
    assert point.path is None
    assert point.skipped == (rp.Skipped("checkpoints/epoch-2", f"missing {S1}"),)
    assert point.lines("r")[-1] == "run r: no sharded checkpoint is whole anywhere: from the start"


def test_the_bucket_listing_knows_checkpoint_folders_from_the_rest() -> None:
    bucket = Bucket({"checkpoints/epoch-2": WHOLE, "checkpoints/epoch-4": (S0,)})
    bucket.data["logs/.hidden"] = b"x"
    bucket.data[".vmrun/attempts/__0_0.distcp"] = b"x"  # the record is never a checkpoint
    assert sorted(bucket.folders()) == ["checkpoints/epoch-2", "checkpoints/epoch-4"]
    assert bucket.folders()["checkpoints/epoch-2"][S1] == (FIXTURE / S1).stat().st_size


@pytest.mark.parametrize(
    ("paths", "tail", "rule"),
    [
        ([], "/**", ""),
        ([".vmrun", "checkpoints/epoch-2"], "/**", "/{.vmrun,checkpoints/epoch-2}/**"),
        (["a,b", "c*{d}[e]"], "", r"/{a\,b,c\*\{d\}\[e\]}"),
    ],
)
def test_an_exclude_rule_names_each_path_literally(paths: list[str], tail: str, rule: str) -> None:
    assert rp.exclude_glob(paths, tail) == rule


def test_give_copies_from_the_bucket_what_each_node_lacks_leaving_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in hosts whose output folders are local folders: the scan is the real one,
    each bucket copy is recorded with the rule that leaves the rest out."""
    roots = {
        "h1": node(tmp_path, "h1", {"checkpoints/epoch-4": (S0, META)}),
        "spare": tmp_path / "spare",  # not there yet
    }
    bucket = Bucket({"checkpoints/epoch-4": WHOLE})
    bucket.data["checkpoints/epoch-4/__1_0.distcp.partial"] = b"x"
    copies: list[tuple[str, str, str, tuple[str, ...]]] = []
    monkeypatch.setattr(
        rp,
        "scan",
        lambda conn, root, python="": (
            layout.scan(root) if Path(root).is_dir() else layout.Layout(root)
        ),
    )
    monkeypatch.setattr(
        rp,
        "_read_bucket",
        lambda store: (bucket.holdings(), {}, bucket.folders()),
    )
    monkeypatch.setattr(
        rp,
        "_from_bucket",
        lambda conn, entry, store, source, dest, others, shown: copies.append(
            (entry.label, str(source), dest, tuple(others))
        ),
    )
    from vmrun.store_url import parse_store
    from vmrun.stores.access import Access

    store = rp.Store(parse_store("s3://bkt/runs/r1"), Access.__new__(Access))
    group = FakeGroup(["h1", "spare"], tmp_path)
    out = Recorder()
    dirs = {label: str(root) for label, root in roots.items()}
    point = rp.give(group, ["h1", "spare"], dirs, "r1", out, store=store)  # type: ignore[arg-type]
    assert point is not None and point.path == "checkpoints/epoch-4"
    partial = S1 + ".partial"
    assert sorted(copies) == [
        (
            "h1",
            "s3://bkt/runs/r1/checkpoints/epoch-4",
            f"{roots['h1']}/checkpoints/epoch-4",
            (META, S0, partial),
        ),
        (
            "spare",
            "s3://bkt/runs/r1/checkpoints/epoch-4",
            f"{roots['spare']}/checkpoints/epoch-4",
            (partial,),
        ),
    ]
    said = [text for kind, text in out.said if kind == "info"]
    assert said == [
        "run r1: resumes from checkpoints/epoch-4, complete: 2 shards"
        " (to h1, spare from the bucket)"
    ]


def test_give_reads_no_bucket_where_no_node_holds_a_sharded_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot run resumed on its own nodes: one scan each, the bucket never asked."""
    root = tmp_path / "h1"
    root.mkdir()
    (root / "snapshot.pt").write_bytes(b"x")
    monkeypatch.setattr(rp, "scan", lambda conn, r, python="": layout.scan(r))

    def never(store: object) -> None:
        raise AssertionError("the bucket was read")

    monkeypatch.setattr(rp, "_read_bucket", never)
    group = FakeGroup(["h1"], tmp_path)
    store = rp.Store(None, None)  # type: ignore[arg-type]
    assert rp.give(group, ["h1"], {"h1": str(root)}, "r1", Recorder(), store=store) is None  # type: ignore[arg-type]


def test_new_hosts_holding_nothing_yet_read_the_bucket_when_told_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume from the bucket: the nodes hold no checkpoint before the copy, so the
    bucket decides; without must_read_bucket nothing would be asked or copied."""
    roots = {label: tmp_path / label for label in ("c", "d")}
    bucket = Bucket({"checkpoints/epoch-2": WHOLE})
    reads: list[object] = []
    copies: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(rp, "scan", lambda conn, root, python="": layout.Layout(root))

    def read(store: object) -> tuple[object, ...]:
        reads.append(store)
        return bucket.holdings(), {}, bucket.folders()

    monkeypatch.setattr(rp, "_read_bucket", read)
    monkeypatch.setattr(
        rp,
        "_from_bucket",
        lambda conn, entry, store, source, dest, others, shown: copies.append(
            (entry.label, tuple(others))
        ),
    )
    from vmrun.store_url import parse_store

    store = rp.Store(parse_store("s3://bkt/runs/r1"), None)  # type: ignore[arg-type]
    group = FakeGroup(["c", "d"], tmp_path)
    dirs = {label: str(root) for label, root in roots.items()}
    args = (group, ["c", "d"], dirs, "r1", Recorder())
    assert rp.give(*args, store=store) is None and not reads  # type: ignore[arg-type]
    point = rp.give(*args, store=store, must_read_bucket=True)  # type: ignore[arg-type]
    assert point is not None and point.path == "checkpoints/epoch-2" and len(reads) == 1
    assert sorted(copies) == [("c", ()), ("d", ())]  # the whole folder to each


def test_a_bucket_that_cannot_be_read_leaves_the_nodes_own_copies_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the same nodes, the bucket out of reach (no boto3 here, say): a warning, and the
    peers give what they hold."""
    from vmrun.errors import UsageError

    roots = {
        "h1": node(tmp_path, "h1", {"checkpoints/epoch-2": (S0, META)}),
        "h2": node(tmp_path, "h2", {"checkpoints/epoch-2": (S1,)}),
    }
    monkeypatch.setattr(rp, "scan", lambda conn, root, python="": layout.scan(root))

    def refused(store: object) -> None:
        raise UsageError("reading a bucket from here needs boto3", code="bad-store")

    copied: list[tuple[str, str, str]] = []
    monkeypatch.setattr(rp, "_read_bucket", refused)
    monkeypatch.setattr(
        rp,
        "copy_between",
        lambda group, src, dests, dirs, base, rel, tmp: copied.extend((src, d, rel) for d in dests),
    )
    out = Recorder()
    group = FakeGroup(["h1", "h2"], tmp_path)
    dirs = {label: str(root) for label, root in roots.items()}
    store = rp.Store(None, None)  # type: ignore[arg-type]
    point = rp.give(group, ["h1", "h2"], dirs, "r1", out, store=store)  # type: ignore[arg-type]
    assert point is not None and point.path == "checkpoints/epoch-2"
    assert sorted(copied) == sorted(
        [
            ("h1", "h2", f"checkpoints/epoch-2/{S0}"),
            ("h1", "h2", f"checkpoints/epoch-2/{META}"),
            ("h2", "h1", f"checkpoints/epoch-2/{S1}"),
        ]
    )
    assert out.said[0] == (
        "warn",
        "run r1: the bucket's checkpoints cannot be read here:"
        " reading a bucket from here needs boto3",
    )


def test_many_skipped_checkpoints_are_named_up_to_a_few_and_counted() -> None:
    skipped = tuple(rp.Skipped(f"checkpoints/epoch-{n}", "missing x") for n in range(9, 0, -1))
    lines = rp.Point(None, skipped=skipped).lines("r")
    assert len(lines) == rp.NAMED + 2
    assert lines[rp.NAMED] == f"run r: skipped {9 - rp.NAMED} older ones too"


def test_checkpoints_moved_aside_by_fresh_are_never_the_runs(tmp_path: Path) -> None:
    aside = ".vmrun-stale-20260101-000000/checkpoints/epoch-9"
    h1 = node(tmp_path, "h1", {aside: WHOLE, "checkpoints/epoch-2": WHOLE})
    bucket = Bucket({aside: WHOLE, "checkpoints/epoch-2": WHOLE})
    assert sorted(bucket.folders()) == ["checkpoints/epoch-2"]
    point = rp.choose(["h1"], {"h1": held(h1)}, bucket.holdings())
    assert point.path == "checkpoints/epoch-2" and point.skipped == ()
