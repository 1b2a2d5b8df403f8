"""vmrun.results.provenance and .rundiff, and `vmrun diff` / `report --diff` / `report --json`
over results folders written here: code, packages, environment, hardware and launch of two
runs compared, whatever layout each has and whatever files an older run lacks."""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from conftest import errors_in
from results_fixtures import epochs, local_run

from vmrun.results.history import RunDataError
from vmrun.results.provenance import load_provenance
from vmrun.results.rundiff import diff_runs, render_text

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def provenance(
    node: str = "gpu-1",
    *,
    torch: str = "2.13.0",
    packages: dict[str, str] | None = None,
    gpus: int = 2,
    slurm: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A provenance.json as hostside/run_provenance.py writes it."""
    return {
        "schema": 1,
        "recorded": 1.7e9,
        "node": node,
        "environment": {
            "python": {
                "executable": "/venv/bin/python",
                "version": "3.12.3",
                "implementation": "CPython",
                "prefix": "/venv",
                "virtualenv": True,
            },
            "manager": "pip",
            "packages": {"torch": torch, "numpy": "2.1.0", **(packages or {})},
            "torch": {
                "version": torch,
                "cuda": "12.4",
                "hip": None,
                "git_version": "x",
                "nccl": [2, 21, 5],
                "cudnn": 90100,
            },
        },
        "hardware": {
            "hostname": node,
            "fqdn": f"{node}.lan",
            "os": "Ubuntu 24.04",
            "kernel": "6.8.0",
            "arch": "x86_64",
            "cpu": {"model": "EPYC 9654", "count": 96, "usable": 96},
            "memory_bytes": 512 * 2**30,
            "driver": "550.54",
            "gpus": [
                {
                    "index": i,
                    "name": "NVIDIA H100 80GB HBM3",
                    "memory_mib": 81559,
                    "driver": "550.54",
                    "uuid": f"GPU-{i}",
                }
                for i in range(gpus)
            ],
        },
        "slurm": slurm,
    }


def code(commit: str = COMMIT_A, *, patch: str = "", untracked: tuple[str, ...] = ()) -> dict:
    return {
        "git": True,
        "commit": commit,
        "branch": "main",
        "dirty": bool(patch),
        "remote": "git@github.com:me/p.git",
        "path": "",
        "untracked": list(untracked),
        "untracked_count": len(untracked),
        "tree_sha256": "c" * 64,
        "files": 12,
        "patch_bytes": len(patch),
        "patch_truncated": False,
        "patch_sha256": sha256(patch.encode()).hexdigest() if patch else None,
    }


def write_run(
    results: Path,
    rid: str,
    *,
    prov: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    patch: str | None = None,
) -> Path:
    """A one-folder run (a local run, or a run of one host): run.json, provenance.json."""
    d = results / rid
    d.mkdir(parents=True, exist_ok=True)
    record = {
        "id": rid,
        "launcher": "torchrun",
        "args": ["3", "5"],
        "nproc": "2",
        "code": code(),
        "variables": {"LR": "0.1"},
        **(meta or {}),
    }
    (d / "run.json").write_text(json.dumps(record))
    if prov is not None:
        (d / "provenance.json").write_text(json.dumps(prov))
    if patch is not None:
        (d / "code.patch").write_text(patch)
    return d


def diff_of(a: Path, b: Path) -> Any:
    return diff_runs(load_provenance(a), load_provenance(b))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


def test_a_torch_upgrade_shows_in_packages_and_environment(results: Path) -> None:
    a = write_run(results, "a-1", prov=provenance(torch="2.13.0"))
    b = write_run(results, "b-1", prov=provenance(torch="2.12.0"))
    diff = diff_of(a, b)
    assert diff.packages.changed == {"torch": ["2.13.0", "2.12.0"]}
    assert not diff.packages.added and not diff.packages.removed
    assert [c.to_json() for c in diff.environment] == [
        {"what": "torch", "a": "2.13.0", "b": "2.12.0"}
    ]
    assert not diff.same and not diff.code and not diff.hardware and not diff.launch
    text = render_text(diff)
    assert text.splitlines()[0] == "runs a-1 -> b-1:"
    assert "  ~ torch 2.13.0 -> 2.12.0" in text and "  torch: 2.13.0 -> 2.12.0" in text


def test_packages_added_and_removed(results: Path) -> None:
    a = write_run(results, "a-1", prov=provenance(packages={"pandas": "2.2.1"}))
    b = write_run(results, "b-1", prov=provenance(packages={"scipy": "1.14.0"}))
    data = diff_of(a, b).to_json()
    assert data["packages"] == {
        "added": {"scipy": "1.14.0"},
        "removed": {"pandas": "2.2.1"},
        "changed": {},
        "notes": [],
    }
    text = render_text(diff_of(a, b))
    assert "  + scipy 1.14.0" in text and "  - pandas 2.2.1" in text


def test_another_commit_and_a_dirty_patch(results: Path) -> None:
    a = write_run(
        results,
        "a-1",
        prov=provenance(),
        patch="--- x\n+++ x\n+one\n",
        meta={"code": code(COMMIT_A, patch="+one\n", untracked=("old.py",))},
    )
    b = write_run(
        results,
        "b-1",
        prov=provenance(),
        patch="--- x\n+++ x\n+two\n",
        meta={"code": code(COMMIT_B, patch="+two\n", untracked=("new.py",))},
    )
    diff = diff_of(a, b)
    by_what = {(c.what, c.change): c for c in diff.code}
    assert (by_what["commit", ""].a, by_what["commit", ""].b) == (COMMIT_A, COMMIT_B)
    assert by_what["patch", ""].a["bytes"] == 5 and by_what["patch", ""].b["bytes"] == 5
    assert by_what["untracked", "added"].b == ["new.py"]
    assert by_what["untracked", "removed"].a == ["old.py"]
    assert by_what["tree_sha256", ""].note.startswith("same code synced")  # the trees agree
    data = diff.to_json()
    assert "-+one" in data["patch_diff"] and "++two" in data["patch_diff"]
    assert data["patch_diff"].startswith("--- a-1/code.patch\n+++ b-1/code.patch")
    text = render_text(diff)
    assert f"  commit: {COMMIT_A[:12]} -> {COMMIT_B[:12]}" in text
    assert "  patch diff:" in text and "  + untracked: new.py" in text
    json.dumps(data)  # JSON-able throughout


def test_identical_runs_say_one_line(results: Path) -> None:
    a = write_run(results, "a-1", prov=provenance(), patch="+x\n")
    b = write_run(results, "b-1", prov=provenance(), patch="+x\n")
    diff = diff_of(a, b)
    assert diff.same and diff.to_json()["same"] is True and diff.patch_diff is None
    assert render_text(diff) == (
        "runs a-1 and b-1: no difference in code, packages, environment, hardware or launch\n"
    )


def test_two_hosts_in_a_folder_each_against_one_folder(results: Path) -> None:
    one = write_run(results, "one-1", prov=provenance("gpu-1"))
    two = results / "two-1"
    for host in ("gpu-2", "gpu-1"):  # the record's order, rank 0's host first
        extra = {"triton": "3.1.0"} if host == "gpu-1" else {}
        write_run(
            two,
            host,
            prov=provenance(f"host-{host}", gpus=8, packages=extra),
            meta={"id": "two-1", "nodes": ["gpu-2", "gpu-1"], "host": host},
        )
    run = load_provenance(two)
    assert run.run_id == "two-1" and [n.name for n in run.nodes] == ["gpu-2", "gpu-1"]
    diff = diff_of(one, two)
    nodes = next(c for c in diff.hardware if c.what == "nodes")
    assert (nodes.a, nodes.b) == (1, 2)
    gpus = next(c for c in diff.hardware if c.what == "gpus")
    assert (gpus.a, gpus.b, gpus.node) == (
        "2x NVIDIA H100 80GB HBM3",
        "8x NVIDIA H100 80GB HBM3",
        (1, "gpu-1", "gpu-2"),
    )
    launch = {c.what: (c.a, c.b) for c in diff.launch}
    assert launch["where"] == ("local", "hosts") and launch["nodes"] == (1, 2)
    assert not diff.packages.added  # the first node's packages; the other's are a note
    [note] = diff.packages.notes
    assert note.note == "two-1: node gpu-1 differs from gpu-2 in triton"
    text = render_text(diff)
    assert "  nodes: 1 -> 2" in text and "  node 1 (gpu-1 / gpu-2):" in text
    assert "    gpus: 2x NVIDIA H100 80GB HBM3 -> 8x NVIDIA H100 80GB HBM3" in text


def test_a_slurm_run_has_a_node_per_provenance_file(results: Path) -> None:
    def slurm_run(rid: str, partition: str) -> Path:
        d = write_run(results, rid, meta={"cluster": "bed", "nodes": 2, "nproc_per_node": 1})
        for i, node in enumerate(("n2", "n10")):
            job = {
                "job_id": "7",
                "partition": partition,
                "nodes": ["n2", "n10"],
                "num_nodes": 2,
                "node_id": i,
                "alloc_tres": "cpu=2",
            }
            (d / f"provenance-{node}.json").write_text(json.dumps(provenance(node, slurm=job)))
        return d

    a, b = slurm_run("s-1", "gpu"), slurm_run("s-2", "debug")
    run = load_provenance(a)
    assert [n.name for n in run.nodes] == ["n2", "n10"]  # natural order, names from files
    assert run.nodes[0].slurm and run.nodes[0].slurm["partition"] == "gpu"
    diff = diff_of(a, b)
    assert [(c.what, c.a, c.b) for c in diff.hardware] == [("slurm partition", "gpu", "debug")]
    assert diff.to_json()["launch"] == [] and "slurm partition: gpu -> debug" in render_text(diff)


def test_an_older_run_without_provenance_is_said_once(results: Path) -> None:
    new = write_run(results, "new-1", prov=provenance())
    old = results / "old-1"
    old.mkdir(parents=True)
    (old / "run.json").write_text(
        json.dumps({"id": "old-1", "launcher": "torchrun", "args": ["3", "5"], "nproc": "2"})
    )
    (old / "versions.json").write_text(json.dumps({"python": "3.11.9", "torch": "2.3.0"}))
    assert load_provenance(old).summary()["torch"] == "2.3.0"  # versions.json, the fallback
    diff = diff_of(new, old)
    text = render_text(diff)
    assert text.count("no provenance recorded") == 1, text
    assert "old-1: no provenance recorded" in text and "old-1: no code recorded" in text
    notes = [n["note"] for n in diff.to_json()["packages"]["notes"]]
    assert notes == ["old-1: no provenance recorded"]
    assert not diff.launch  # the launch was recorded by both, and is the same


def test_bad_json_is_absent_and_no_record_at_all_is_an_error(results: Path) -> None:
    a = write_run(results, "a-1", prov=provenance())
    bad = write_run(results, "bad-1")
    (bad / "provenance.json").write_text("{not json")
    (bad / "versions.json").write_text("[1, 2]")
    (bad / "run.json").write_text(json.dumps({"id": "bad-1", "code": "odd", "variables": [1]}))
    run = load_provenance(bad)
    assert (run.code, run.variables, run.recorded) == ({}, None, False)
    assert set(run.summary().values()) == {None}
    odd = provenance()
    odd["environment"] = {"python": "3.12", "packages": ["torch"], "torch": None}
    odd["hardware"] = {"cpu": 4, "gpus": "none", "memory_bytes": "lots"}
    write_run(results, "odd-1", prov=odd)
    for other in (bad, results / "odd-1"):
        json.dumps(diff_of(a, other).to_json())
        render_text(diff_of(other, a))
    empty = results / "empty-1"
    empty.mkdir()
    (empty / "provenance.json").write_text("nope")
    with pytest.raises(RunDataError, match="empty-1"):
        load_provenance(empty)


def test_variables_added_removed_and_not_recorded(results: Path) -> None:
    a = write_run(results, "a-1", prov=provenance(), meta={"variables": {"LR": "0.1", "K": None}})
    b = write_run(results, "b-1", prov=provenance(), meta={"variables": {"LR": None, "X": "1"}})
    text = render_text(diff_of(a, b))
    assert "  variable LR: 0.1 -> (not recorded)" in text
    assert "  - variable K: (not recorded)" in text and "  + variable X: 1" in text


# -- the CLI, in this process (quick tier) ------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VMRUN_HOSTS", raising=False)
    write_run(tmp_path / "results", "a-1", prov=provenance(torch="2.13.0"))
    write_run(tmp_path / "results", "b-1", prov=provenance(torch="2.12.0"))
    return tmp_path


def test_diff_json_and_text_and_report_diff(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmrun.cli.main import run

    assert run(["diff", "a-1", "b-1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == ["a-1", "b-1"] and len(data["diffs"]) == 1
    assert set(data["diffs"][0]) == {
        "a",
        "b",
        "same",
        "code",
        "packages",
        "environment",
        "hardware",
        "launch",
        "patch_diff",
    }
    assert data["diffs"][0]["packages"]["changed"] == {"torch": ["2.13.0", "2.12.0"]}

    assert run(["diff", "a-1", "b-1"]) == 0
    text = capsys.readouterr().out
    assert run(["report", "a-1", "b-1", "--diff"]) == 0
    assert capsys.readouterr().out == text and "~ torch 2.13.0 -> 2.12.0" in text
    assert run(["report", "a-1", "b-1", "--diff", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == data

    assert run(["diff", "a-1", "a-1"]) == 0  # the same run: no difference, still exit 0
    assert "no difference" in capsys.readouterr().out


def test_diff_needs_two_runs(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.main import run

    for args, flag in ((["diff", "a-1"], "diff"), (["report", "a-1", "--diff"], "--diff")):
        assert run(args) == 2
        out, err = capsys.readouterr()
        assert out == "" and errors_in(err) == [
            ("usage", f"{flag} needs two runs or more (got 1)")
        ], err
    assert run(["report", "a-1", "b-1", "--diff", "--markdown"]) == 2
    [(code, said)] = errors_in(capsys.readouterr().err)
    assert code == "usage" and "--diff and --markdown" in said
    assert run(["diff", "a-1", "nope-1"]) == 2  # one left: nothing to compare
    [(code, said)] = errors_in(capsys.readouterr().err)
    assert code == "usage" and "1 of the 2 runs" in said


def test_report_json_names_commit_dirty_and_versions(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmrun.cli.main import run

    results = project / "results"
    rec = local_run(results, "loc-1", epochs(2))
    meta = json.loads((rec / "run.json").read_text())
    (rec / "run.json").write_text(json.dumps({**meta, "code": code(COMMIT_B, patch="+x\n")}))
    (rec / "provenance.json").write_text(json.dumps(provenance()))
    local_run(results, "old-1", epochs(2))
    assert run(["report", "loc-1", "old-1", "--json"]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["loc-1"]["commit"], rows["loc-1"]["dirty"]) == (COMMIT_B, True)
    assert rows["loc-1"]["versions"] == {
        "python": "3.12.3",
        "torch": "2.13.0",
        "cuda": "12.4",
        "nccl": "2.21.5",
        "gpu": "NVIDIA H100 80GB HBM3",
        "driver": "550.54",
    }
    assert (rows["old-1"]["commit"], rows["old-1"]["dirty"], rows["old-1"]["versions"]) == (
        None,
        None,
        None,
    )


def test_own_batch_scripts_compare_their_script_and_scontrols_allocation(results: Path) -> None:
    """`vmrun submit` runs: nothing of vmrun runs on their nodes, so the record keeps the
    script as the job ran it (batch.sh) and the login node's `scontrol show job -o` line."""
    meta = {"cluster": "della", "launcher": "sbatch", "batch_script": True, "nodes": 2}
    a = write_run(results, "a", meta=meta)
    b = write_run(results, "b", meta=meta)
    (a / "batch.sh").write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun python train.py\n")
    (b / "batch.sh").write_text("#!/bin/bash\n#SBATCH --nodes=4\nsrun python train.py\n")
    line = "JobId={} JobName=j Partition={} NodeList={} NumNodes={} ReqTRES=cpu=1 TRES={}\n"
    (a / "allocation").write_text(line.format(7, "gpu", "c[1-2]", 2, "cpu=8,node=2"))
    (b / "allocation").write_text(line.format(9, "gpu", "c[1-4]", 4, "cpu=16,node=4"))
    got = diff_of(a, b).to_json()
    (batch,) = [c for c in got["code"] if c["what"] == "batch script"]
    assert batch["a"].startswith("3 lines") and batch["a"] != batch["b"]
    slurm = {c["what"]: (c["a"], c["b"]) for c in got["hardware"] if c["what"].startswith("slurm")}
    assert slurm["slurm node_list"] == ("c[1-2]", "c[1-4]")
    assert slurm["slurm alloc_tres"] == ("cpu=8,node=2", "cpu=16,node=4")
    assert "slurm partition" not in slurm  # the same on both
    (results / "c").mkdir()
    (results / "c" / "run.json").write_text(json.dumps({"id": "c", **meta}))
    (results / "c" / "allocation").write_text("")  # a job Slurm had forgotten: unknown
    assert load_provenance(results / "c").allocation is None


def test_a_requeued_job_counts_the_nodes_of_its_last_attempt(results: Path) -> None:
    """A fetch never deletes: after a requeue onto other nodes the folder holds both
    attempts' node files; the run's nodes are its last attempt's."""
    d = results / "rq"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"id": "rq", "cluster": "bed", "nodes": 2}))
    for node, restarts in (("c1", None), ("c2", None), ("c3", "1"), ("c4", "1")):
        slurm = {"partition": "gpu", "restart_count": restarts, "nodes": ["x"]}
        (d / f"provenance-{node}.json").write_text(json.dumps(provenance(node, slurm=slurm)))
    assert [n.name for n in load_provenance(d).nodes] == ["c3", "c4"]


def test_a_resumed_run_that_ran_other_code_before_says_so(results: Path) -> None:
    earlier = [{**code(COMMIT_B), "tree_sha256": "d" * 64, "attempt": 1}]
    a = write_run(results, "a", prov=provenance())
    b = write_run(results, "b", prov=provenance(), meta={"code_earlier": earlier})
    got = diff_of(a, b)
    (change,) = [c for c in got.code if c.what == "earlier attempts' code"]
    assert change.a is None and change.b == ["attempt 1: bbbbbbbbbbbb"]
    assert "earlier attempts' code" in render_text(got)
