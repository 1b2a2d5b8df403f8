"""vmrun.results: results folders read as RunHistory values (the three run.json forms, a
folder per host, missing and differing metrics) and the report's arithmetic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from results_fixtures import T0, epochs, hosts_run, local_run, slurm_run, write_metrics

from vmrun.results.history import RunDataError, load_run, load_runs, run_dirs, run_path
from vmrun.results.layout import layout_of
from vmrun.results.record import RunRecord
from vmrun.results.report import (
    HEADERS,
    ReportRow,
    cells,
    headers,
    render_markdown,
    report_rows,
    rows_json,
)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return tmp_path / "results"


def test_a_local_run(results: Path) -> None:
    run = load_run(local_run(results, "loc-1", epochs(3, world=2), nproc="2"))
    assert (run.run_id, run.where, run.hosts, run.cluster) == ("loc-1", "local", (), None)
    assert (run.launcher, run.nodes, run.procs_per_node, run.world_size) == ("torchrun", 1, 2, 2)
    assert (run.epochs_done, run.epochs_asked) == (3, 3)
    assert run.started == T0 and run.duration == 45.0 and run.exit_code == 0
    assert [e for e, _ in run.values("loss")] == [1, 2, 3]
    assert run.last("loss") == pytest.approx(1 / 3)


def test_an_older_local_record_gives_its_epochs_in_argv() -> None:
    """Records written before `args` was kept: the template's first argument after it."""
    meta = {
        "template": True,
        "launcher": "torchrun",
        "nproc": "2",
        "script": "/t/template.py",
        "argv": ["python", "-m", "torch.distributed.run", "/t/template.py", "7", "5"],
        "start_time": "2023-11-14T22:13:20+00:00",
    }
    assert layout_of(RunRecord.from_json(meta)).epochs_asked == 7
    older = RunRecord.from_json({**meta, "template": False})
    assert layout_of(older).epochs_asked is None  # a SCRIPT's own count


def test_a_run_of_two_hosts_fetched_into_a_folder_each(results: Path) -> None:
    d = hosts_run(results, "two-1", epochs(3, world=4), ["n1", "n2"], exits=[0, 0])
    assert sorted(p.name for p in d.iterdir()) == ["n1", "n2"]
    run = load_run(d)
    assert (run.where, run.hosts, run.nodes, run.procs_per_node, run.world_size) == (
        "hosts",
        ("n1", "n2"),
        2,
        2,
        4,
    )
    assert run.epochs_done == 3 and run.epochs_asked == 3
    assert run.started == T0 and run.ended == T0 + 60 and run.duration == 60.0
    assert run.exit_code == 0
    failed = load_run(hosts_run(results, "two-2", epochs(2), ["n1", "n2"], exits=[0, 3]))
    assert failed.exit_code == 3  # a node that failed fails the run
    going = load_run(hosts_run(results, "two-3", epochs(2), ["n1", "n2"]))
    assert going.exit_code is None and going.duration is None  # no exit record yet


def test_one_host_and_gpu_processes_take_the_world_size_from_the_metrics(results: Path) -> None:
    run = load_run(hosts_run(results, "gpu-1", epochs(2, world=8), ["g1"], nproc="gpu"))
    assert (run.nodes, run.procs_per_node, run.world_size) == (1, 8, 8)


def test_a_slurm_run_requeued_once(results: Path) -> None:
    run = load_run(slurm_run(results, "slurm-1", epochs(4, world=2), nodes=2, per_node=1))
    assert (run.where, run.cluster, run.hosts) == ("cluster", "bed", ())
    assert (run.nodes, run.procs_per_node, run.world_size, run.epochs_asked) == (2, 1, 2, 4)
    assert run.started == T0 and run.duration == 95.0  # first start to the last exit
    assert run.exit_code == 0


def test_metric_lines_a_run_still_writes_and_a_resumed_epoch(results: Path) -> None:
    d = results / "part-1"
    write_metrics(d, epochs(3))
    with (d / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"epoch": 2, "loss": 0.25, "note": "resumed"}) + "\n")
        fh.write('{"epoch": 4, "loss": 0.1')  # half a line: still being written
    run = load_run(d)
    assert run.epochs_done == 3 and run.where == "" and run.launcher is None
    assert run.values("loss")[1] == (2, 0.25) and "note" not in run.epochs[1]


def test_a_run_without_metrics_is_named_and_left_out(results: Path) -> None:
    good = local_run(results, "good-1", epochs(2))
    bare = results / "bare-1"
    bare.mkdir(parents=True)
    (bare / "run.json").write_text("{}")
    empty = local_run(results, "empty-1", [])
    problems: list = []
    runs = load_runs([good, bare, results / "gone-1", empty, good], problems)
    assert [r.run_id for r in runs] == ["good-1"]  # the same folder once
    assert [p.run for p in problems] == ["bare-1", "gone-1", "empty-1"]
    assert {p.code for p in problems} == {"run-data-missing"}
    assert str(bare) in problems[0].message and str(results / "gone-1") in problems[1].message
    with pytest.raises(RunDataError) as info:
        load_runs([good, bare])
    assert info.value.run == "bare-1" and info.value.code == "run-data-missing"


def test_runs_under_results_oldest_first_and_names(tmp_path: Path, results: Path) -> None:
    hosts_run(results, "b-run", epochs(1), ["h1"])  # started T0
    local_run(results, "a-run", epochs(1))  # started T0 too: then by name
    later = local_run(results, "c-run", epochs(1))
    record = json.loads((later / "run.json").read_text())
    (later / "run.json").write_text(json.dumps({**record, "start_time": "2024-01-01T00:00:00"}))
    (results / "not-a-run").mkdir()
    (results / ".hidden").mkdir()
    assert [d.name for d in run_dirs(tmp_path)] == ["a-run", "b-run", "c-run"]
    assert run_dirs(tmp_path / "nowhere") == []
    assert run_path("a-run", tmp_path) == results / "a-run"
    assert run_path("elsewhere/a-run", tmp_path) == Path("elsewhere/a-run")
    assert run_path("~/x", tmp_path) == Path.home() / "x"


def _run(results: Path, rid: str, world: int, rates: list[float], **extra: float):
    lines = [
        {
            "epoch": i,
            "loss": 1.0 / i,
            "samples_per_s": r,
            "epoch_time_s": 1000 / r,
            "world_size": world,
            **extra,
        }
        for i, r in enumerate(rates, 1)
    ]
    return load_run(local_run(results, rid, lines, nproc=str(world)))


def test_speedup_and_efficiency_against_the_smallest_world(results: Path) -> None:
    """speed-up = median samples/s / the smallest world's; efficiency = speed-up / world
    ratio. Medians, so one slow first epoch does not count."""
    runs = [
        _run(results, "w2", 2, [50, 180, 190, 170]),  # median 175
        _run(results, "w1", 1, [10, 100, 100]),  # median 100: the baseline
        _run(results, "w4", 4, [300, 20, 320]),  # median 300
        _run(results, "w1b", 1, [400, 400, 400]),  # the same world as w1: w1 came first
    ]
    rows = {r.run: r for r in report_rows(runs)}
    assert rows["w1"].speedup == 1.0 and rows["w1"].efficiency == 1.0
    assert rows["w2"].speedup == pytest.approx(1.75)
    assert rows["w2"].efficiency == pytest.approx(0.875)
    assert rows["w4"].speedup == pytest.approx(3.0)
    assert rows["w4"].efficiency == pytest.approx(0.75)
    assert rows["w1b"].speedup == pytest.approx(4.0) and rows["w1b"].efficiency == 4.0
    assert {r.baseline for r in rows.values()} == {"w1"}
    assert rows["w2"].samples_per_s == 175 and rows["w2"].epoch_time_s == pytest.approx(
        (1000 / 180 + 1000 / 170) / 2
    )
    assert rows["w4"].final_loss == pytest.approx(1 / 3) and rows["w4"].epochs == 3


def test_differing_metrics_leave_cells_blank(results: Path) -> None:
    plain = _run(results, "plain", 1, [100, 100])
    both = _run(results, "both", 2, [150, 150], accuracy=0.5, eval_accuracy=0.75)
    only_train = _run(results, "train-acc", 2, [150, 150], accuracy=0.625)
    slow = load_run(local_run(results, "no-rate", [{"epoch": 1, "loss": 0.5}]))
    rows = {r.run: r for r in report_rows([plain, both, only_train, slow])}
    assert rows["both"].final_accuracy == 0.75  # eval_accuracy first
    assert rows["train-acc"].final_accuracy == 0.625
    assert rows["plain"].final_accuracy is None
    assert rows["no-rate"].speedup is None and rows["no-rate"].samples_per_s is None
    assert cells(rows["plain"])[-1] == "" and cells(rows["no-rate"])[8:11] == ("", "", "")
    assert plain.metric_names == ["epoch_time_s", "loss", "samples_per_s", "world_size"]


def test_json_keys_are_stable_and_numbers_are_numbers(results: Path) -> None:
    rows = report_rows(
        [
            _run(results, "a", 1, [100]),
            load_run(local_run(results, "b", [{"epoch": 1, "loss": 0.5}])),
        ]
    )
    data = json.loads(rows_json(rows))
    fields = [*ReportRow.__dataclass_fields__, "error"]
    assert [list(d) for d in data] == [fields, fields]
    assert data[0]["speedup"] == 1.0 and isinstance(data[0]["world_size"], int)
    assert data[1]["samples_per_s"] is None and data[1]["final_accuracy"] is None
    assert data[0]["error"] is None


def test_markdown_is_a_github_table(results: Path) -> None:
    rows = report_rows([_run(results, "a", 1, [100, 100]), _run(results, "b", 2, [190, 190])])
    lines = render_markdown(rows).splitlines()
    assert lines[0] == "| " + " | ".join(HEADERS) + " |"
    assert lines[1].count("|") == len(HEADERS) + 1 and "---:" in lines[1]
    b = [c.strip() for c in lines[3].strip("|").split("|")]
    assert b[0] == "b" and b[3] == "2" and b[9] == "1.90x" and b[10] == "95%"
    assert lines[-1] == (
        "speed-up: samples/s over a (world size 1); efficiency: speed-up / world size ratio"
    )


def test_the_python_launcher_leaves_processes_to_the_metrics(results: Path) -> None:
    d = local_run(results, "spawn", epochs(2, world=3))
    record = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps({**record, "launcher": "python", "nproc": None}))
    run = load_run(d)
    assert (run.procs_per_node, run.world_size) == (3, 3)
    os.remove(d / "run.json")
    assert load_run(d).nodes is None  # no record: only what the metrics say


def test_a_sweeps_other_axes_are_columns_after_run(results: Path) -> None:
    a, b = _run(results, "a", 1, [100, 100]), _run(results, "b", 1, [120, 120])
    rows = report_rows([a, b], {"a": {"cpus": "1", "lr": "0.1"}, "b": {"cpus": "2", "lr": "0.1"}})
    assert rows[1].varied == {"cpus": "2", "lr": "0.1"}
    assert json.loads(rows_json(rows))[0]["varied"] == {"cpus": "1", "lr": "0.1"}
    heads, numeric = headers(rows)
    assert {1, 2, 3} <= numeric and 0 not in numeric  # the varied values right-aligned too
    assert heads[:4] == ("RUN", "CPUS", "LR", "NODES") and len(heads) == len(HEADERS) + 2
    assert cells(rows[1], ["cpus", "lr"])[:3] == ("b", "2", "0.1")
    lines = render_markdown(rows).splitlines()
    assert lines[0].startswith("| RUN | CPUS | LR | NODES |")
    assert lines[1].count("|") == len(HEADERS) + 3
    assert [c.strip() for c in lines[3].strip("|").split("|")][:3] == ["b", "2", "0.1"]
    assert headers(report_rows([a]))[0] == HEADERS  # nothing varied: the table as ever


def test_a_failed_run_s_own_code_and_first_failed_worker_are_in_the_json(results: Path) -> None:
    """A two-host run whose rank 3 on h2 exited 3 (h1 was stopped after it, 143): the row
    has the run's code and which worker failed first, from the fetched failure.json."""
    d = hosts_run(results, "fail2", epochs(1, world=4), ["h1", "h2"], exits=[143, 3])
    (d / "h2" / "failure.json").write_text(
        json.dumps(
            {
                "exit": 3,
                "rank": 3,
                "local_rank": 1,
                "host": "h2.lan",
                "signal": None,
                "launcher_exit": 1,
            }
        )
    )
    (row,) = json.loads(rows_json(report_rows([load_run(d)])))
    assert row["exit"] == 3  # the first node to fail, not the first in host order
    failure = row["failure"]
    assert failure["node"] == "h2" and (failure["rank"], failure["exit"]) == (3, 3)
