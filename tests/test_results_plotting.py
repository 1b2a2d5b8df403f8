"""vmrun.results.plotting: series, labels, and the image file (matplotlib, read back)."""

from __future__ import annotations

from pathlib import Path

import pytest
from results_fixtures import (
    epochs,
    hosts_run,
    line_colours,
    local_run,
    slurm_run,
    svg_line_ids,
    svg_line_looks,
)

from vmrun.errors import UsageError
from vmrun.results import plotting
from vmrun.results.history import load_run


def test_labels_name_the_shape_and_add_the_id_only_where_two_share_one(tmp_path: Path) -> None:
    results = tmp_path / "results"
    runs = [
        load_run(hosts_run(results, "h-a", epochs(2, world=4), ["n1", "n2"])),
        load_run(local_run(results, "l-a", epochs(2, world=1), nproc="1")),
        load_run(slurm_run(results, "s-a", epochs(2, world=2))),
        load_run(slurm_run(results, "s-b", epochs(2, world=2))),
    ]
    assert plotting.labels(runs) == [
        "2 nodes x 2 procs (torchrun)",
        "1 node x 1 proc (torchrun)",
        "2 nodes x 1 proc (torchrun) s-a",
        "2 nodes x 1 proc (torchrun) s-b",
    ]


def test_series_by_epoch_and_by_training_time(tmp_path: Path) -> None:
    lines = [
        {"epoch": 1, "loss": 0.9, "epoch_time_s": 2.0},
        {"epoch": 2, "epoch_time_s": 3.0},  # no loss this epoch: its time still counts
        {"epoch": 3, "loss": 0.5, "epoch_time_s": 1.5, "eval_loss": 0.7},
        {"epoch": 4, "loss": 0.4},  # no time: left out by time
    ]
    run = load_run(local_run(tmp_path / "results", "r", lines))
    assert plotting.series(run, "loss") == [(1.0, 0.9), (3.0, 0.5), (4.0, 0.4)]
    assert plotting.series(run, "loss", "time") == [(2.0, 0.9), (6.5, 0.5)]
    kept, lacking = plotting.with_metric([run], "accuracy")
    assert (kept, lacking) == ([], [run])
    assert plotting.metric_names([run]) == ["epoch_time_s", "eval_loss", "loss"]


@pytest.mark.parametrize("name", ["plot.pdf", "plot", "plot.png.txt"])
def test_only_png_and_svg(name: str) -> None:
    with pytest.raises(UsageError) as info:
        plotting.image_format(Path(name))
    assert info.value.code == "usage" and name in info.value.message
    assert plotting.image_format(Path("x.PNG")) == "png"


def _runs(tmp_path: Path, n: int) -> list:
    results = tmp_path / "results"
    return [
        load_run(local_run(results, f"run-{i}", epochs(5, world=i + 1, loss0=1 + i / 3)))
        for i in range(n)
    ]


def test_a_png_has_one_line_colour_per_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for n in (1, 3):
        path = plotting.save_plot(_runs(tmp_path / str(n), n), "loss", tmp_path / f"{n}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert line_colours(path, plotting.COLOURS) == list(plotting.COLOURS[:n])
    assert not list(tmp_path.glob(".*part"))  # nothing left beside it


def test_an_svg_names_each_runs_line(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plotting.save_plot(_runs(tmp_path, 4), "samples_per_s", tmp_path / "p.svg", x="time")
    assert svg_line_ids(path) == ["run-run-0", "run-run-1", "run-run-2", "run-run-3"]


def test_a_failed_write_leaves_the_old_file_and_no_part(tmp_path: Path) -> None:
    target = tmp_path / "p.png"
    target.write_bytes(b"old")

    def half(fh) -> None:
        fh.write(b"\x89PNG half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        plotting._write_atomically(target, half)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png"]


def _twins(tmp_path: Path) -> list:
    """Two runs that draw the very same curve (1x2 and 2x1 train alike), and a third."""
    results = tmp_path / "results"
    return [
        load_run(local_run(results, "a", epochs(20, world=2))),
        load_run(local_run(results, "b", epochs(20, world=2))),
        load_run(local_run(results, "c", epochs(20, world=2, loss0=3))),
    ]


def test_coinciding_lines_both_stay_visible(tmp_path: Path) -> None:
    """The later line does not paint over the earlier one: each has its dash pattern, and
    markers of its own shape starting at a point of its own."""
    pytest.importorskip("matplotlib")
    runs = _twins(tmp_path)
    png = plotting.save_plot(runs, "loss", tmp_path / "p.png")
    assert line_colours(png, plotting.COLOURS) == list(plotting.COLOURS[:3])
    svg = plotting.save_plot(runs, "loss", tmp_path / "p.svg")
    looks = svg_line_looks(svg)
    assert list(looks) == ["run-a", "run-b", "run-c"]
    assert all(marks for _, marks in looks.values())  # every line has markers
    assert len({look for look, _ in looks.values()}) == 3  # no two alike in dashes and markers
    a_marks, b_marks = looks["run-a"][1], looks["run-b"][1]
    assert not set(a_marks) & set(b_marks)  # at no point does b's marker sit on a's


def test_legend_labels_name_what_a_sweep_varied(tmp_path: Path) -> None:
    runs = _twins(tmp_path)[:2]
    notes = {"a": "cpus=1 lr=0.1", "b": "cpus=2 lr=0.1"}
    assert plotting.labels(runs, notes) == [
        "1 node x 2 procs (torchrun) cpus=1 lr=0.1",
        "1 node x 2 procs (torchrun) cpus=2 lr=0.1",
    ]
    assert plotting.labels(runs) == [
        "1 node x 2 procs (torchrun) a",
        "1 node x 2 procs (torchrun) b",
    ]


def test_the_terminal_plot_says_which_line_is_under_another() -> None:
    from vmrun.cli.plot_term import render

    same = [(1.0, 1.0), (2.0, 0.5)]
    text = render(
        [same, list(same), [(1.0, 2.0), (2.0, 1.0)]],
        ["a", "b", "c"],
        ["red", "green", "blue"],
        title="t",
        x_label="epoch",
        y_label="loss",
        width=60,
    ).plain
    legend = text.splitlines()[-3:]
    assert legend == ["  ━━ a", "  ━━ b (the same line as a, over it)", "  ━━ c"]
