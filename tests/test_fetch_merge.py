"""`vmrun fetch` of a run on several nodes: every node's outputs into one folder, a file
that several nodes hold with the same bytes fetched once, the same path with different
bytes said and never written over the master's, a node that does not answer said while
the others' files still come (fake hosts, in process: the decisions, no sshd)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_group import FakeGroup, run_on_two_nodes_one_down

from vmrun.errors import CODES, ExitCode
from vmrun.transfer.download import Listed
from vmrun.transfer.merge import Conflict, in_doubt, merge

ORDER = ["accA", "accB"]  # the master first


def test_each_path_comes_once_the_masters_kept_where_bytes_differ() -> None:
    held = {
        "accA": {
            "ckpt/.metadata": Listed("a/.metadata", 10),
            "ckpt/__0_0.distcp": Listed("a/__0_0", 500),
            "same.txt": Listed("a/same", 7),
            "sized.txt": Listed("a/sized", 3),
            "hashed.txt": Listed("a/hashed", 4),
        },
        "accB": {
            "ckpt/__1_0.distcp": Listed("b/__1_0", 500),
            "same.txt": Listed("b/same", 7),
            "sized.txt": Listed("b/sized", 9),
            "hashed.txt": Listed("b/hashed", 4),
        },
    }
    doubt = in_doubt(ORDER, held)  # only what is held twice at one size is hashed
    assert doubt == {n: {"same.txt", "hashed.txt"} for n in ORDER}
    sums = {
        "accA": {"same.txt": "s1", "hashed.txt": "h1"},
        "accB": {"same.txt": "s1", "hashed.txt": "h2"},
    }
    decided = merge(ORDER, held, sums)
    assert decided.share("accA") == {
        "ckpt/.metadata",
        "ckpt/__0_0.distcp",
        "same.txt",
        "sized.txt",
        "hashed.txt",
    }
    assert decided.share("accB") == {"ckpt/__1_0.distcp"}  # same.txt: the same bytes, once
    assert decided.conflicts == (
        Conflict("sized.txt", "accA", ("accB",)),
        Conflict("hashed.txt", "accA", ("accB",)),
    )
    line = decided.conflicts[0].line()
    assert (
        line == "sized.txt: accB holds other bytes than accA; accA's is fetched, accB's left there"
    )


def test_a_checksum_that_did_not_come_is_a_difference_and_links_compare_by_target() -> None:
    held = {
        "n1": {"x": Listed("1/x", 5), "l": Listed("", -1, "x")},
        "n2": {"x": Listed("2/x", 5), "l": Listed("", -1, "x")},
        "n3": {"x": Listed("3/x", 5), "l": Listed("", -1, "y")},
    }
    decided = merge(["n1", "n2", "n3"], held, {"n1": {"x": "d"}, "n2": {"x": "d"}})
    assert decided.share("n1") == {"x", "l"} and not decided.share("n2")
    assert decided.conflicts == (Conflict("x", "n1", ("n3",)), Conflict("l", "n1", ("n3",)))
    lone = merge(["n2", "n1"], {"n1": {"x": Listed("1/x", 5)}}, {})
    assert lone.sources == {"x": "n1"} and not lone.conflicts  # a node's own file: no doubt


@pytest.fixture
def two_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGroup:
    group = run_on_two_nodes_one_down(tmp_path, monkeypatch)
    group.down.clear()
    return group


def _fake_hosts(
    monkeypatch: pytest.MonkeyPatch, held: dict[str, dict[str, Listed]], sums: dict[str, Any]
) -> dict[str, Any]:
    """Each node lists `held[node]`, hashes as `sums[node]` says (an exception: it fails),
    and its download writes its share here; what each call got is kept."""
    import vmrun.runs.outputs
    import vmrun.transfer.download
    import vmrun.transfer.manifest
    from vmrun.transfer.types import FetchSpec, Report

    seen: dict[str, Any] = {"specs": {}, "only": {}, "hashed": {}}

    def specs_for(conn: Any, items: Any, **kw: Any) -> list[FetchSpec]:
        seen["specs"][conn.label] = kw
        return [FetchSpec(remote="out", local="results/r1")]

    def listed(conn: Any, specs: Any, dest: Path, *a: Any) -> dict[str, Listed]:
        return held[conn.label]

    def remote_hashes(conn: Any, paths: list[str]) -> dict[str, str]:
        seen["hashed"][conn.label] = sorted(paths)
        got = sums[conn.label]
        if isinstance(got, Exception):
            raise got
        return got

    def download(conn: Any, specs: Any, dest: Path, *a: Any, only: Any = None) -> Report:
        seen["only"][conn.label] = set(only)
        for path in only:
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            (dest / path).write_text(conn.label)
        return Report(conn.label, fetched=sorted(only))

    monkeypatch.setattr(vmrun.runs.outputs, "specs_for", specs_for)
    monkeypatch.setattr(vmrun.transfer.download, "listed", listed)
    monkeypatch.setattr(vmrun.transfer.download, "download", download)
    monkeypatch.setattr(vmrun.transfer.manifest, "remote_hashes", remote_hashes)
    return seen


HELD = {
    "accA": {
        "results/r1/checkpoints/epoch-2/.metadata": Listed("o/c/.metadata", 10),
        "results/r1/checkpoints/epoch-2/__0_0.distcp": Listed("o/c/__0_0.distcp", 50),
        "results/r1/notes.txt": Listed("o/notes.txt", 4),
        "results/r1/log": Listed(".vmrun/runs/r1/log", 30),
    },
    "accB": {
        "results/r1/checkpoints/epoch-2/__1_0.distcp": Listed("o/c/__1_0.distcp", 50),
        "results/r1/notes.txt": Listed("o/notes.txt", 4),
        "results/r1/accB/log": Listed(".vmrun/runs/r1/log", 30),
    },
}


def test_a_runs_nodes_merge_into_one_folder_and_a_difference_is_said(
    two_up: FakeGroup,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vmrun.cli.main import run as cli

    sums = {"accA": {"o/notes.txt": "aaa"}, "accB": {"o/notes.txt": "bbb"}}
    seen = _fake_hosts(monkeypatch, HELD, sums)
    code = cli(["fetch", "results", "--run", "r1"])
    err = capsys.readouterr().err
    # one folder: no host_dir; the record of the node that is not the master in its own
    assert {n: (kw["host_dir"], kw["node_dir"]) for n, kw in seen["specs"].items()} == {
        "accA": (None, None),
        "accB": (None, "accB"),
    }
    assert seen["hashed"] == {"accA": ["o/notes.txt"], "accB": ["o/notes.txt"]}
    ckpt = tmp_path / "results" / "r1" / "checkpoints" / "epoch-2"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (ckpt / "__1_0.distcp").read_text() == "accB"
    assert seen["only"]["accB"] == {
        "results/r1/checkpoints/epoch-2/__1_0.distcp",
        "results/r1/accB/log",
    }
    assert (tmp_path / "results" / "r1" / "notes.txt").read_text() == "accA"  # the master's
    assert (
        "vmrun: error[node-files-differ]: results/r1/notes.txt: accB holds other bytes than"
        " accA; accA's is fetched, accB's left there"
    ) in err
    assert code == CODES["node-files-differ"].exit_code == ExitCode.FAILED


def test_the_same_bytes_come_once_and_exit_0(
    two_up: FakeGroup, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vmrun.config import load_settings
    from vmrun.operations.fetch import FetchJob, fetch

    sums = {"accA": {"o/notes.txt": "same"}, "accB": {"o/notes.txt": "same"}}
    seen = _fake_hosts(monkeypatch, HELD, sums)
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    fetched = fetch(FetchJob(["results"], settings, run="r1", to=str(tmp_path)))
    assert "results/r1/notes.txt" in seen["only"]["accA"]
    assert "results/r1/notes.txt" not in seen["only"]["accB"]
    assert fetched.conflicts == () and fetched.exit_code == 0
    assert [o.host for o in fetched.outcomes] == ORDER and fetched.several


def test_a_node_that_fails_is_said_and_the_others_files_still_come(
    two_up: FakeGroup, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vmrun.config import load_settings
    from vmrun.errors import ConnectionLostError
    from vmrun.operations.fetch import FetchJob, fetch

    lost = ConnectionLostError("the link dropped", host="accB")
    seen = _fake_hosts(monkeypatch, HELD, {"accA": {"o/notes.txt": "aaa"}, "accB": lost})
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    fetched = fetch(FetchJob(["results"], settings, run="r1", to=str(tmp_path)))
    assert "accB" not in seen["only"]  # nothing of a node whose checksums did not come
    assert "results/r1/notes.txt" in seen["only"]["accA"]
    assert [(o.host, o.error) for o in fetched.outcomes] == [("accA", None), ("accB", lost)]
    assert fetched.conflicts == ()  # the other node's copy is not compared: it did not answer
    assert fetched.exit_code == ExitCode.CONNECTION_LOST


def test_a_listing_names_each_file_once_with_its_nodes_and_moves_nothing(
    two_up: FakeGroup, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os
    from dataclasses import replace

    from vmrun.config import load_settings
    from vmrun.operations.fetch import FetchJob, Planned, listing

    held = {
        n: {p: replace(x, mtime_ns=7_000_000_000) for p, x in f.items()} for n, f in HELD.items()
    }
    seen = _fake_hosts(monkeypatch, held, {})
    kept = tmp_path / "results" / "r1" / "log"  # fetched before: the same size and time
    kept.parent.mkdir(parents=True)
    kept.write_text("x" * 30)
    os.utime(kept, ns=(7_000_000_000, 7_000_000_000))
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    found = listing(FetchJob(["results"], settings, run="r1", to=str(tmp_path)))
    by_path = {f.path: f for f in found.files}
    assert list(by_path) == sorted({p for f in HELD.values() for p in f})
    assert by_path["results/r1/notes.txt"] == Planned(
        "results/r1/notes.txt", 4, 7.0, ("accA", "accB"), False
    )  # held by both: the master's is the one a fetch starts from
    assert by_path["results/r1/log"].here and not by_path["results/r1/accB/log"].here
    assert seen["specs"]["accB"]["node_dir"] == "accB"  # the same specs as a fetch's
    assert seen["only"] == {} and seen["hashed"] == {}  # nothing sent, nothing hashed
    assert sorted(p.name for p in tmp_path.joinpath("results").rglob("*")) == ["log", "r1"]
    assert found.failed == {} and found.ref is not None and found.ref.run_id == "r1"


def test_from_the_bucket_every_nodes_shards_and_the_metadata_come(tmp_path: Path) -> None:
    """Each node's copier sends its own ranks' shards under the run's one prefix, so a fetch
    from the bucket has every node's: `results` and `checkpoints` both bring the whole
    folder, the hidden .metadata with it."""
    from test_store_runs import FakeS3

    from vmrun.runs.store_fetch import fetch_run
    from vmrun.store_url import parse_store
    from vmrun.transfer.types import Progress

    folder = "runs/r1/checkpoints/epoch-2"
    s3 = FakeS3(
        {
            f"{folder}/__0_0.distcp": b"0" * 300,  # from the master
            f"{folder}/__1_0.distcp": b"1" * 300,  # from the other node
            f"{folder}/.metadata": b"m" * 40,
            "runs/r1/.vmrun/log": b"epoch 2\n",
        }
    )
    place = parse_store("s3://bkt/runs/r1")
    names = [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for what, more in (("checkpoints", []), ("results", ["results/r1/log"])):
        dest = tmp_path / what
        got = fetch_run(s3, place, [what], dest, Progress())
        assert sorted(got.fetched) == sorted(
            [f"results/r1/checkpoints/epoch-2/{n}" for n in names] + more
        )
        ckpt = dest / "results" / "r1" / "checkpoints" / "epoch-2"
        assert sorted(p.name for p in ckpt.iterdir()) == names
