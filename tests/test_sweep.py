"""The sweep's plan and record (vmrun.runs.sweep): sizes, order, atomic record, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    with pytest.raises(UsageError, match=r"--nproc-per-node .*whole numbers >= 1"):
        parse_counts("--nproc-per-node", text)


def test_sizes_run_smallest_world_first_fewer_nodes_on_ties() -> None:
    sizes = plan_sizes([1, 2], [1, 2])
    assert [(s.nodes, s.nproc) for s in sizes] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert [s.world_size for s in sizes] == [1, 2, 2, 4]
    assert sizes[2].label == "2x1"


def test_the_record_round_trips_and_keeps_what_is_left(tmp_path: Path) -> None:
    sweep = Sweep("sweep-20260101-000000-abcd", {"hosts": ["a", "b"]}, {"epochs": 3},
                  plan_sizes([1, 2], [1]))  # fmt: skip
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
    with pytest.raises(UsageError, match="no sweep sweep-x here"):
        load(tmp_path, "sweep-x")
    with pytest.raises(UsageError, match="give a sweep id"):
        check_sweep_id("template-1x1")
    assert check_sweep_id("results/sweep-1-a/") == "sweep-1-a"


def test_size_words() -> None:
    assert Size(2, 4).world_size == 8
