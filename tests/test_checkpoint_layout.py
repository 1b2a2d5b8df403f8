"""vmrun/hostside/checkpoint_layout.py on a real 2-rank DCP checkpoint (tests/fixtures/dcp:
torch 2.13's FSDP2 shards and .metadata) and on folders spoilt the ways a lost node, a cut
copy or a crafted file spoil them; as the hosts run it (python3 on the file) and as vmrun
imports it. No torch here: the module reads checkpoints without it."""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from vmrun.hostside import checkpoint_layout as layout

FIXTURE = ROOT / "tests" / "fixtures" / "dcp" / "two-ranks"
SCRIPT = ROOT / "vmrun" / "hostside" / "checkpoint_layout.py"
SHARDS = ("__0_0.distcp", "__1_0.distcp")


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A copy of the fixture as `run/checkpoints/epoch-2`."""
    folder = tmp_path / "run" / "checkpoints" / "epoch-2"
    shutil.copytree(FIXTURE, folder)
    return folder


def host_json(*args: str) -> dict:
    """The script's document, run as a host runs it: its python3, the file by path."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_a_complete_two_rank_checkpoint_names_its_shards_and_their_sizes(ckpt: Path) -> None:
    found = layout.dcp_checkpoint(str(ckpt))
    assert found.complete and found.problem == "" and found.metadata == layout.READ_WALKED
    assert [f.name for f in found.files] == [*SHARDS, ".metadata"]
    assert found.shards == 2 and found.epoch == 2
    for f in found.files[:2]:  # the last piece of each shard ends where the file does
        assert f.min_size == f.size == (ckpt / f.name).stat().st_size
    needs = host_json("needs", str(ckpt))
    assert needs["version"] == layout.SCHEMA_VERSION and needs["complete"] is True
    assert [f["name"] for f in needs["files"]] == [*SHARDS, ".metadata"]


def test_a_lost_shard_is_named_missing(ckpt: Path) -> None:
    (ckpt / SHARDS[1]).unlink()
    found = layout.dcp_checkpoint(str(ckpt))
    assert not found.complete and found.missing == (SHARDS[1],)
    assert found.problem == f"missing {SHARDS[1]}"


def test_a_shard_cut_short_is_named_with_its_sizes(ckpt: Path) -> None:
    shard = ckpt / SHARDS[0]
    whole = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(whole - 1)  # one byte is enough
    found = layout.dcp_checkpoint(str(ckpt))
    assert not found.complete and found.missing == ()
    assert [(f.name, f.size, f.min_size) for f in found.short] == [(SHARDS[0], whole - 1, whole)]
    assert found.problem == f"short {SHARDS[0]} ({whole - 1} of {whole} bytes)"


def test_shards_without_metadata_are_a_checkpoint_in_progress(ckpt: Path) -> None:
    (ckpt / ".metadata").rename(ckpt / ".metadata.tmp")  # DCP's own name before its rename
    (ckpt / "__2_0.distcp.partial").write_bytes(b"x")  # a copier's: never a file of it
    scanned = layout.scan(str(ckpt.parent.parent))
    (found,) = scanned.checkpoints
    assert found.kind == "dcp" and found.path == "checkpoints/epoch-2" and not found.complete
    assert [f.name for f in found.files] == [*SHARDS, ".metadata"]
    assert found.missing == (".metadata",) and found.problem == "missing .metadata"
    assert scanned.newest_complete() is None


class _System:
    """Unpickled by a plain pickle.load, this runs `touch MARKER`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_metadata_runs_nothing_and_names_nothing(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    crafted = pickle.dumps({"storage_data": _System(marker)}, protocol=4)
    (ckpt / ".metadata").write_bytes(crafted)
    found = layout.dcp_checkpoint(str(ckpt))
    needs = host_json("needs", str(ckpt))
    host_json("scan", str(tmp_path))
    assert not marker.exists()
    assert not found.complete and found.metadata == layout.READ_FAILED
    assert found.problem == ".metadata names no file" and needs["complete"] is False


def test_a_crafted_path_that_climbs_out_is_not_a_file_of_the_checkpoint() -> None:
    """A _StorageInfo naming ../x is refused whole, and the opcode scan takes plain names only."""
    crafted = (  # the opcodes by hand: pickling by reference would import the class
        b"ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n)\x81}("
        b"Vrelative_path\nV../../__0_0.distcp\nVoffset\nI0\nVlength\nI4\nub."
    )
    assert layout.read_needs(crafted) == ({}, layout.READ_FAILED)
    persistent = b"\x80\x04P0\n."  # a persistent id: the base Unpickler refuses it
    assert layout.read_needs(persistent) == ({}, layout.READ_FAILED)


def test_a_pickle_it_cannot_walk_still_names_its_files(tmp_path: Path) -> None:
    folder = tmp_path / "step-300"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps({"files": list(SHARDS)}, protocol=4))
    for name in SHARDS:
        (folder / name).write_bytes(b"data")
    found = layout.dcp_checkpoint(str(folder))
    assert found.metadata == layout.READ_NAMES and found.complete and found.epoch == 300
    assert [(f.name, f.min_size) for f in found.files[:2]] == [(SHARDS[0], 0), (SHARDS[1], 0)]


def test_newest_first_by_the_number_in_the_name_then_by_time(tmp_path: Path) -> None:
    root = tmp_path / "out"
    for n in (2, 10, 3):
        shutil.copytree(FIXTURE, root / "checkpoints" / f"epoch-{n}")
    (root / "snapshot.pt").write_bytes(b"whole")
    (root / ".snapshot.pt.tmp-123").write_bytes(b"half")
    for name, when in (("a", 200), ("b", 100)):  # no number: the newer file first
        shutil.copytree(FIXTURE, root / "other" / name)
        os.utime(root / "other" / name / ".metadata", (when, when))
    scanned = layout.scan(str(root))
    assert [c.path for c in scanned.checkpoints] == [
        "checkpoints/epoch-10",
        "checkpoints/epoch-3",
        "checkpoints/epoch-2",
        "snapshot.pt",
        "other/a",
        "other/b",
    ]
    snapshot = scanned.checkpoints[3]
    assert snapshot.kind == "snapshot" and snapshot.complete and snapshot.files[0].size == 5
    assert scanned.newest_complete() == scanned.checkpoints[0]


def test_only_temporary_names_are_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / ".snapshot.pt.tmp-99").write_bytes(b"x")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "__0_0.distcp.tmp").write_bytes(b"x")
    assert layout.scan(str(tmp_path)).checkpoints == ()
    for name in (".metadata.tmp", "__0.metadata.tmp", "a.partial", ".x.tmp-1", ".__0_0.distcp.X"):
        assert layout.is_temporary(name), name
    for name in (".metadata", "__0_0.distcp", "snapshot.pt"):
        assert not layout.is_temporary(name), name


def test_the_hosts_document_reads_back_into_the_same_layout(ckpt: Path) -> None:
    (ckpt.parent / "epoch-4").mkdir()
    shutil.copy(ckpt / SHARDS[0], ckpt.parent / "epoch-4" / SHARDS[0])
    root = str(ckpt.parent.parent)
    document = host_json("scan", root)
    assert document["version"] == layout.SCHEMA_VERSION
    assert layout.Layout.from_json(document) == layout.scan(root)
    assert [(c["path"], c["complete"]) for c in document["checkpoints"]] == [
        ("checkpoints/epoch-4", False),
        ("checkpoints/epoch-2", True),
    ]
    with pytest.raises(ValueError, match="version"):
        layout.Layout.from_json({**document, "version": 99})


def test_bad_arguments_are_one_line_exit_2(tmp_path: Path) -> None:
    for args in ((), ("scan",), ("list", str(tmp_path)), ("scan", str(tmp_path / "none"))):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_it_is_python_3_8_and_stdlib_only() -> None:
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"), feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def _python38() -> str | None:
    """A Python 3.8 that runs: on PATH, or one pyenv installed (its shim may not run)."""
    found = [
        shutil.which("python3.8"),
        *map(str, Path.home().glob(".pyenv/versions/3.8*/bin/python3")),
    ]
    for python in filter(None, found):
        if subprocess.run([python, "-c", ""], capture_output=True).returncode == 0:
            return python
    return None


def test_an_old_hosts_python_reads_the_checkpoint_as_this_one_does(ckpt: Path) -> None:
    python = _python38()
    if python is None:
        pytest.skip("no Python 3.8 here")
    old = subprocess.run(
        [python, str(SCRIPT), "needs", str(ckpt)], capture_output=True, text=True, check=True
    )
    assert json.loads(old.stdout) == host_json("needs", str(ckpt))


def test_lacks_names_what_a_copy_of_the_folder_misses_or_holds_short(ckpt: Path) -> None:
    """`lacks DIR < LSJSON` (a bucket copier's question before it sends .metadata): the
    files the local .metadata names that the listed copy lacks or holds too short."""
    sizes = {n: (ckpt / n).stat().st_size for n in SHARDS}

    def lacks(listed: list[dict]) -> list[str]:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "lacks", str(ckpt)],
            input=json.dumps(listed),
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.splitlines()

    whole = [{"Path": n, "Size": sizes[n]} for n in SHARDS]
    assert lacks(whole) == []
    assert lacks(whole[:1]) == ["__1_0.distcp"]
    cut = [whole[0], {"Path": "__1_0.distcp", "Size": 3}]
    need = layout.read_needs((ckpt / ".metadata").read_bytes())[0]["__1_0.distcp"]
    assert lacks(cut) == [f"__1_0.distcp (3 of {need} bytes)"]
    (ckpt / ".metadata").unlink()
    assert lacks(whole) == [".metadata"]
