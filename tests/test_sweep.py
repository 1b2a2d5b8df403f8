"""The sweep's plan and record (vmrun.runs.sweep): sizes, order, atomic record, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import error_in

from vmrun.errors import UsageError
from vmrun.runs.state import RunState
from vmrun.runs.sweep import (
    RECORD,
    Size,
    Sweep,
    check_sweep_id,
    load,
    parse_counts,
    plan_sizes,
    save,
)


def test_counts_are_sorted_whole_numbers_each_once() -> None:
    assert parse_counts("--nodes", "2, 1,2") == [1, 2]
    assert parse_counts("--nodes", None) == [1]


@pytest.mark.parametrize("text", ["0", "1,x", "", "1,,2", "-1", "1.5"])
def test_bad_counts_name_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_counts("--nproc-per-node", text)
    assert info.value.code == "usage" and f"--nproc-per-node {text!r}" in info.value.message


def test_sizes_run_smallest_world_first_fewer_nodes_on_ties() -> None:
    sizes = plan_sizes([1, 2], [1, 2])
    assert [(s.nodes, s.nproc) for s in sizes] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [s.world_size for s in sizes] == [1, 2, 2, 4]
    assert sizes[2].label == "2x1"


def test_the_record_round_trips_and_keeps_what_is_left(tmp_path: Path) -> None:
    sweep = Sweep(
        "sweep-20260101-000000-abcd", {"hosts": ["a", "b"]}, {"epochs": 3}, plan_sizes([1, 2], [1])
    )
    sweep.sizes[0].run, sweep.sizes[0].state = "template-1x1-x", RunState.DONE
    sweep.sizes[1].state, sweep.sizes[1].detail = RunState.STOPPED, "interrupted"
    path = save(tmp_path, sweep)
    assert path == tmp_path / "results" / sweep.id / RECORD
    assert [p.name for p in path.parent.iterdir()] == [RECORD]  # no temporary file left
    again = load(tmp_path, sweep.id)
    assert again.to_json() == sweep.to_json()
    assert [s.label for s in again.left()] == ["2x1"]
    assert again.run_ids() == ["template-1x1-x"]
    assert json.loads(path.read_text())["sizes"][1]["state"] == "stopped"


def test_resume_names_a_sweep_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as missing:
        load(tmp_path, "sweep-x")
    assert missing.value.code == "sweep-not-found" and "sweep-x" in missing.value.message
    with pytest.raises(UsageError) as not_a_sweep:
        check_sweep_id("template-1x1")
    assert not_a_sweep.value.code == "usage" and "template-1x1" in not_a_sweep.value.message
    assert check_sweep_id("results/sweep-1-a/") == "sweep-1-a"


def test_size_words() -> None:
    assert Size(2, 4).world_size == 8


def test_a_list_for_other_options_adds_axes_to_the_grid() -> None:
    from vmrun.operations.sweep import parse_grid

    lists = {"cpus_per_task": "2,1", "gpus_per_node": "4", "batch_size": None, "lr": "0.1,1e-2"}
    fixed, axes, env = parse_grid(lists, ["MODE=fast,slow", "SEP=a\\,b", "TOKEN", "E="])
    assert fixed == {"gpus_per_node": 4}  # one value: as `train` takes it, not an axis
    assert axes == [("cpus_per_task", [1, 2]), ("lr", [0.01, 0.1]), ("env:MODE", ["fast", "slow"])]
    assert env == ["SEP=a,b", "TOKEN", "E="]  # `\,` is a comma inside a value
    sizes = plan_sizes([1], [1, 2], axes)
    assert len(sizes) == 2 * 2 * 2 * 2  # the cartesian product
    assert [s.label for s in sizes[:3]] == [
        "1x1-cpus1-lr0.01-MODE_fast",
        "1x1-cpus1-lr0.01-MODE_slow",
        "1x1-cpus1-lr0.1-MODE_fast",
    ]
    assert len({s.label for s in sizes}) == len(sizes)
    assert [s.world_size for s in sizes] == [1] * 8 + [2] * 8  # the smallest world first
    assert sizes[0].words() == "cpus=1 lr=0.01 MODE=fast"
    assert sizes[0].varied() == {"cpus": "1", "lr": "0.01", "MODE": "fast"}
    assert plan_sizes([1], [1])[0].label == "1x1" and plan_sizes([1], [1])[0].words() == ""


def test_env_values_unfit_for_a_run_name_go_by_their_position() -> None:
    sizes = plan_sizes([1], [1], [("env:P", ["a/b", "a b"])])
    assert [s.label for s in sizes] == ["1x1-P_v1", "1x1-P_v2"]
    assert [s.values for s in sizes] == [{"env:P": "a/b"}, {"env:P": "a b"}]


@pytest.mark.parametrize(
    ("flag", "text", "least"),
    [
        ("--cpus-per-task", "1,0", ">= 1"),
        ("--gpus-per-node", "-1", ">= 0"),
        ("--batch-size", "8,x", ">= 1"),
        ("--lr", "0.1,-1", "> 0"),
        ("--lr", "nan", "> 0"),
    ],
)
def test_bad_lists_name_the_flag(flag: str, text: str, least: str) -> None:
    """The flag and its value, and the bound (the one fact that differs by flag)."""
    from vmrun.operations.sweep import GRID_FLAGS, parse_grid

    key = next(k for k, f in GRID_FLAGS.items() if f == flag)
    with pytest.raises(UsageError) as info:
        parse_grid({key: text}, None)
    said = info.value.message
    assert info.value.code == "usage" and said.startswith(f"{flag} {text!r}") and least in said
    with pytest.raises(UsageError) as twice:
        parse_grid({}, ["A=1,2", "B=1", "A=3"])
    assert twice.value.code == "usage" and twice.value.message.startswith("-e A ")


def test_each_point_trains_its_own_values_and_the_record_keeps_them(tmp_path: Path) -> None:
    from vmrun.operations.sweep import make_plan, point_plans

    given = {
        "script": None,
        "epochs": 2,
        "save_every": None,
        "batch_size": None,
        "lr": 0.5,
        "task": None,
        "name": None,
    }
    axes = [("batch_size", [8, 16]), ("env:MODE", ["x", "y"])]
    sweep = Sweep("sweep-20260101-000000-abcd", {"local": True}, given, plan_sizes([1], [1], axes))
    plans = point_plans(sweep, given, ["KEEP=1"])
    plan = plans["1x1-batch16-MODE_y"]
    assert plan.args[plan.args.index("--batch-size") + 1] == "16"
    assert plan.args[plan.args.index("--lr") + 1] == "0.5"
    assert plan.env == {"KEEP": "1", "MODE": "y"}
    assert make_plan(given, None).args.count("--batch-size") == 0
    save(tmp_path, sweep)
    again = load(tmp_path, sweep.id)  # --resume: the points as they were planned
    assert [(s.label, s.values) for s in again.sizes] == [(s.label, s.values) for s in sweep.sizes]


def test_slurm_lists_without_a_cluster_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.main import run

    assert run(["sweep", "--local", "--cpus-per-task", "1,2"]) == 2
    err = capsys.readouterr().err
    code, said = error_in(err)
    assert code == "needs-cluster" and "--cpus-per-task" in said and "-C" in said
    assert len(err.strip().splitlines()) == 1


def test_a_points_slurm_values_reach_its_job(tmp_path: Path) -> None:
    from vmrun.backends.slurm.options import SlurmOptions
    from vmrun.operations.sweep_run import SweepJob, size_options

    sizes = plan_sizes([2], [1], [("cpus_per_task", [1, 2])])
    opts = SlurmOptions(time="0:10:00")
    job = SweepJob(
        Sweep("sweep-1", {"cluster": "hpc"}, {}, sizes),
        plan=None,
        project=tmp_path,
        settings=None,
        cluster="hpc",
        slurm=opts,
    )  # type: ignore[arg-type]
    assert [size_options(job, s).given() for s in sizes] == [
        {"nodes": 2, "cpus_per_task": 1, "time": "0:10:00"},
        {"nodes": 2, "cpus_per_task": 2, "time": "0:10:00"},
    ]


def test_a_cluster_sweep_without_nproc_runs_a_process_per_gpu() -> None:
    """As `train -C` does: --gpus-per-node 1,2 is worlds of 1 and 2 (not 1 process on 2 GPUs)."""
    from vmrun.runs.sweep import one_process_per_gpu

    sizes = one_process_per_gpu(plan_sizes([1, 2], [1], [("gpus_per_node", [2, 1])]), None)
    assert [(s.label, s.world_size) for s in sizes] == [
        ("1x1-gpus1", 1),
        ("1x2-gpus2", 2),
        ("2x1-gpus1", 2),
        ("2x2-gpus2", 4),
    ]
    assert [s.nproc for s in one_process_per_gpu(plan_sizes([1], [1]), 4)] == [4]
    assert [s.nproc for s in one_process_per_gpu(plan_sizes([1], [1]), None)] == [1]


def test_resume_of_a_grid_runs_what_is_left_with_each_points_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.operations.sweep import Grid, _resumed, sweep
    from vmrun.operations.train import RunOptions

    monkeypatch.chdir(tmp_path)
    options = {
        "script": None,
        "epochs": 2,
        "save_every": None,
        "batch_size": None,
        "lr": None,
        "task": None,
        "name": None,
        "env": [],
    }
    sizes = plan_sizes([1], [1], [("batch_size", [8, 16]), ("env:MODE", ["a", "b"])])
    sizes[0].run, sizes[0].state = "template-1x1-batch8-MODE_a-x", RunState.DONE
    save(tmp_path, Sweep("sweep-20260101-000000-abcd", {"local": True}, options, sizes))
    given = {
        k: None for k in ("script", "epochs", "save_every", "batch_size", "lr", "task", "name")
    }
    parts = _resumed("sweep-20260101-000000-abcd", given, None)
    left = [s.label for s in parts["sweep"].left()]
    assert left == ["1x1-batch8-MODE_b", "1x1-batch16-MODE_a", "1x1-batch16-MODE_b"]
    plan = parts["plans"]["1x1-batch16-MODE_b"]
    assert plan.args[plan.args.index("--batch-size") + 1] == "16" and plan.env == {"MODE": "b"}
    with pytest.raises(UsageError, match="drop --batch-size") as refused:
        sweep(RunOptions(), Grid(batch_size="8,16"), resume="sweep-20260101-000000-abcd")
    assert refused.value.code == "resume-conflict"
