"""`vmrun plot`, the real CLI process: PNG and SVG files read back (one line colour, one
line id per run), the terminal plot on a real pseudo-terminal, bad input, and which
commands import matplotlib."""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Client, error_in, errors_in
from results_fixtures import epochs, line_colours, local_run, svg_line_ids

from vmrun.results.plotting import COLOURS


def test_png_and_svg_of_two_local_runs(local_runs: Path, client: Client) -> None:
    pytest.importorskip("matplotlib")
    shutil.copytree(local_runs / "results", client.cwd / "results")
    one, two = sorted(p.name for p in (client.cwd / "results").iterdir())
    done = client.vmrun("plot", "-o", "loss.png")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "vmrun: wrote loss.png (2 runs)\n" and done.stdout == ""
    png = client.cwd / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert line_colours(png, COLOURS) == list(COLOURS[:2])
    assert sorted(p.name for p in client.cwd.iterdir()) == ["loss.png", "results"]  # no part

    svg = client.vmrun("plot", two, one, "--metric", "samples_per_s", "--x", "time", "-o", "s.svg")
    assert svg.returncode == 0, svg.stderr
    assert svg_line_ids(client.cwd / "s.svg") == [f"run-{two}", f"run-{one}"]
    text = (client.cwd / "s.svg").read_text()
    assert "1 node x 2 procs (torchrun)" in text and "1 node x 1 proc (torchrun)" in text
    assert "samples_per_s by training time" in text and "training time (s)" in text


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """Three runs made by hand: two with accuracy, one without; one folder with no metrics."""
    results = tmp_path / "project" / "results"
    local_run(results, "a-1", epochs(4, world=1, accuracy=0.5), nproc="1")
    local_run(results, "b-1", epochs(4, world=2, accuracy=0.75), nproc="2")
    local_run(results, "c-1", epochs(4, world=4), nproc="4")
    (results / "d-1").mkdir()
    (results / "d-1" / "run.json").write_text("{}")
    return tmp_path / "project"


def _cli(project: Path, *args: str, tty: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process; `tty`: its stdout a real pseudo-terminal (read back), a
    colour one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "NO_COLOR": "1"}
    if tty:
        env.pop("NO_COLOR")
        env.update(TERM="xterm-256color", COLORTERM="truecolor")
    argv = [sys.executable, "-m", "vmrun", *args]
    if not tty:
        return subprocess.run(
            argv, cwd=project, env=env, capture_output=True, text=True, timeout=60
        )
    leader, follower = pty.openpty()
    with subprocess.Popen(
        argv, cwd=project, env=env, stdout=follower, stderr=subprocess.PIPE, text=True
    ) as proc:
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(leader)
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(timeout=60)
    out = b"".join(chunks).decode().replace("\r\n", "\n")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_runs_lacking_the_metric_or_any_metrics_are_named_and_left_out(project: Path) -> None:
    pytest.importorskip("matplotlib")
    done = _cli(project, "plot", "--metric", "accuracy", "-o", "acc.png")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "vmrun: warning: run d-1: no metrics.jsonl in "
        f"{project / 'results' / 'd-1'}; it has nothing to report; left out",
        "vmrun: warning: run c-1 has no accuracy; left out of the plot",
        "vmrun: wrote acc.png (2 runs)",
    ]
    assert line_colours(project / "acc.png", COLOURS) == list(COLOURS[:2])


@pytest.mark.parametrize(
    ("args", "code", "fact"),
    [
        (["-o", "p.pdf"], "usage", "not .pdf"),
        (["-o", "nowhere/p.png"], "usage", "no folder nowhere"),
        (["-o", "shot.png"], "usage", "is a folder"),
        (["--metric", "nope", "-o", "p.png"], "metric-not-found", "these have: accuracy,"),
        (["--x", "wall", "-o", "p.png"], "usage", "--x wall"),
        ([], "usage", "-o plot.png"),
        (["d-1", "-o", "p.png"], "usage", "no run to plot"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    project: Path, args: list[str], code: str, fact: str
) -> None:
    (project / "shot.png").mkdir()
    done = _cli(project, "plot", *args)
    assert done.returncode == 2, done.stderr
    said = error_in(done.stderr.splitlines()[-1])
    assert said[0] == code and fact in said[1], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert sorted(p.name for p in project.rglob("*.png")) == ["shot.png"]  # nothing written
    assert not list(project.glob(".*"))


def test_without_matplotlib_a_file_plot_says_what_to_install(project: Path) -> None:
    probe = (
        "import sys\nsys.modules['matplotlib'] = None\nfrom vmrun.cli.main import main\n"
        "main(['plot', '-o', 'p.png'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2
    [(code, said)] = errors_in(done.stderr)  # one line: the code and what to install
    assert code == "missing-dependency" and "pip install 'vmrun[plot]'" in said, done.stderr
    assert not (project / "p.png").exists()


def test_the_terminal_plot(project: Path) -> None:
    done = _cli(project, "plot", "a-1", "b-1", "c-1", tty=True)
    assert done.returncode == 0, done.stderr
    rgb = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in COLOURS[:4]]
    drawn = [f"38;2;{r};{g};{b}m" in done.stdout for r, g, b in rgb]
    assert drawn == [True, True, True, False]  # one colour per run
    lines = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).splitlines()
    assert lines[:2] == ["loss by epoch", "loss"]
    dots = [ln for ln in lines if "│" in ln]
    assert len(dots) == 16 and any(chr(0x2801) <= ch <= chr(0x28FF) for ch in "".join(dots))
    assert dots[0].split("│")[0].strip() == "1" and dots[-1].split("│")[0].strip() == "0.25"
    under = "(the same line as 1 node x 1 proc (torchrun), over it)"  # the runs' losses agree
    assert lines[-3:] == [
        "  ━━ 1 node x 1 proc (torchrun)",
        f"  ━━ 1 node x 2 procs (torchrun) {under}",
        f"  ━━ 1 node x 4 procs (torchrun) {under}",
    ]


def _loaded_by(project: Path, args: list[str]) -> set[str]:
    probe = (
        "import sys\nfrom vmrun.cli.main import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('LOADED:' + ' '.join(m for m in ('matplotlib', 'rich', 'torch', 'paramiko')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout
    return set(out.splitlines()[-1].removeprefix("LOADED:").split())


def test_only_plot_to_a_file_imports_matplotlib(project: Path) -> None:
    """report --json and --markdown load neither matplotlib nor rich (nor, with every run
    here, paramiko); the terminal paths load rich alone; plot -o loads matplotlib."""
    pytest.importorskip("matplotlib")
    assert _loaded_by(project, ["report", "--json"]) == set()
    assert _loaded_by(project, ["report", "--markdown", "a-1"]) == set()
    assert _loaded_by(project, ["plot", "--help"]) == set()
    assert _loaded_by(project, ["status", "--help"]) == set()
    assert _loaded_by(project, ["plot", "-o", "p.png"]) == {"matplotlib"}
