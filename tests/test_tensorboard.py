"""vmrun.runs.tensorboard's pure parts: which folders a run's TensorBoard serves, --logdir as
the host sees it, what --local fetches, and the host script's answers when it cannot serve
(run here with sh, as the host runs it). The serving itself: tests/test_cli_tensorboard.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vmrun.errors import UsageError
from vmrun.hostside import source
from vmrun.results.record import RunRecord
from vmrun.runs.outputs import location_of
from vmrun.runs.tensorboard import (
    NO_PYTHON,
    NO_TENSORBOARD,
    NOTHING_TO_SERVE,
    HostBoard,
    LogDir,
    host_path,
    log_dirs,
)
from vmrun.runs.tensorboard_local import fetch_specs

WORK = "vmrun/proj-abc123"
RID = "template-20260101-000000-abcd"


def template_meta() -> RunRecord:
    return RunRecord.from_json(
        {"workdir": WORK, "out_dir": f"{WORK}/results/{RID}", "template": True}
    )


def test_a_template_run_serves_its_output_folder_and_the_usual_log_folders() -> None:
    dirs = log_dirs(template_meta(), f"{WORK}/results/{RID}")
    assert dirs == [
        LogDir(RID, f"{WORK}/results/{RID}", required=True, own=True),
        LogDir("runs", f"{WORK}/runs", required=False),
        LogDir("lightning_logs", f"{WORK}/lightning_logs", required=False),
    ]


def test_a_script_run_does_not_walk_its_whole_work_dir() -> None:
    meta = {"workdir": WORK, "out_dir": WORK, "template": False}
    dirs = log_dirs(RunRecord.from_json(meta), WORK, ["tb", "~/shared/tb", "/data/tb/"])
    assert [(d.name, d.path, d.required) for d in dirs] == [
        ("runs", f"{WORK}/runs", False),
        ("lightning_logs", f"{WORK}/lightning_logs", False),
        ("tb", f"{WORK}/tb", True),
        ("tb-2", "shared/tb", True),
        ("tb-3", "/data/tb", True),
    ]


def test_a_slurm_run_uses_its_code_dir_and_absolute_paths() -> None:
    meta = {
        "code_dir": "/shared/u/vmrun/p-1",
        "out_dir": "/shared/u/vmrun/p-1/results/r",
        "template": False,
    }
    dirs = log_dirs(RunRecord.from_json(meta), "/shared/u/vmrun/p-1/results/r")
    assert [(d.path, d.required) for d in dirs] == [
        ("/shared/u/vmrun/p-1/results/r", False),  # a script's: only if it is there
        ("/shared/u/vmrun/p-1/runs", False),
        ("/shared/u/vmrun/p-1/lightning_logs", False),
    ]


def test_each_folder_once_and_none_inside_one_always_served() -> None:
    dirs = log_dirs(template_meta(), f"{WORK}/results/{RID}", ["runs", "runs/"])
    assert [(d.name, d.required) for d in dirs] == [
        (RID, True),
        ("runs", True),
        ("lightning_logs", False),
    ]
    whole = log_dirs(template_meta(), f"{WORK}/results/{RID}", ["."])
    assert [(d.name, d.path) for d in whole] == [("proj-abc123", WORK)]


def test_host_paths() -> None:
    assert host_path("a/../b", WORK) == f"{WORK}/b"
    assert host_path("~", WORK) == "."
    assert host_path("~/x/", WORK) == "x"
    assert host_path("/abs//x", WORK) == "/abs/x"
    for bad in (" ", "~bob/x", "a\nb"):
        with pytest.raises(UsageError) as info:
            host_path(bad, WORK)
        assert info.value.code == "usage" and info.value.message.startswith("--logdir ")


def test_a_comma_cannot_go_into_tensorboards_list_of_folders() -> None:
    with pytest.raises(UsageError) as info:
        log_dirs(template_meta(), f"{WORK}/results/{RID}", ["a,b"])
    assert info.value.code == "usage" and "a,b" in info.value.message
    alone = log_dirs(
        RunRecord.from_json({"template": False}), "", ["/x/a,b"]
    )  # the only one: --logdir takes it
    assert [d.path for d in alone] == ["/x/a,b"]


def test_local_fetches_the_runs_metrics_and_each_folders_event_files() -> None:
    location = location_of(RID, "h1", template_meta(), None)
    specs = fetch_specs(location, log_dirs(template_meta(), location.out_dir))
    assert [(s.remote, s.local) for s in specs] == [
        (f"{WORK}/results/{RID}", f"results/{RID}"),  # as `vmrun fetch metrics`
        (f"{WORK}/runs", f"results/{RID}/runs"),
        (f"{WORK}/lightning_logs", f"results/{RID}/lightning_logs"),
    ]
    assert "events.out.tfevents.*" in specs[0].select
    assert specs[1].select == ("events.out.tfevents.*",)


def serve(python: str, *words: str) -> subprocess.CompletedProcess[str]:
    argv = ["sh", "-c", source("tensorboard_serve.sh"), "vmrun-tensorboard", python, "5", *words]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_the_host_script_says_why_it_cannot_serve(tmp_path: Path) -> None:
    done = serve(str(tmp_path / "no-such-python"), "need", "x", str(tmp_path))
    assert done.returncode == NO_PYTHON and "not found" in done.stderr
    bare = tmp_path / "bare"  # a python without tensorboard (and without pip: quick)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = serve(str(bare / "bin" / "python"), "need", "x", str(tmp_path))
    assert done.returncode == NO_TENSORBOARD and "cannot import tensorboard" in done.stderr
    pytest.importorskip("tensorboard")  # the dev extra has it: then this interpreter serves
    done = serve(sys.executable, "may", "runs", str(tmp_path / "missing"))
    assert done.returncode == NOTHING_TO_SERVE and done.stdout == ""


def test_the_host_script_gets_its_folders_as_argv_words() -> None:
    dirs = [LogDir("a b", "/x y/z", True), LogDir("runs", "w/runs", False)]
    board = HostBoard(None, "/env/bin/python", dirs)  # type: ignore[arg-type]
    argv = board.argv()
    assert argv[1].endswith("/tensorboard_serve.sh")
    assert argv[2:] == ["/env/bin/python", "5", "need", "a b", "/x y/z", "may", "runs", "w/runs"]
