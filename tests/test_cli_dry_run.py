"""`train --dry-run` on every target: what the start would do is printed (the target's
backend `prepare`), nothing is sent or started, and the exit status is 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import error_in

from vmrun.backends.api import Prepared


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "train.py").write_text("print('trained')\n")
    return tmp_path


def test_a_dry_run_on_hosts_prints_the_sync_and_the_launch_and_reaches_no_host(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmrun.cli.main import run

    args = ["train", "-H", "a@h1.invalid", "-H", "b@h2.invalid", "train.py", "--dry-run"]
    assert run([*args, "--nproc-per-node", "2", "--data", "train.py", "-e", "TOKEN=s3cr3t"]) == 0
    said = capsys.readouterr()
    assert "# on a@h1.invalid, b@h2.invalid (the master first)" in said.out
    assert "--nnodes=2 --nproc-per-node=2" in said.out and "train.py" in said.out
    assert f"# sync {project} -> ~/" in said.out and f"# push {project / 'train.py'}" in said.out
    assert "TOKEN" in said.out and "s3cr3t" not in said.out + said.err  # names, never values
    assert not (project / "results").exists()


def test_a_dry_run_here_prints_the_launch_and_runs_nothing(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmrun.cli.main import run

    assert run(["train", "--local", "train.py", "--dry-run", "--nproc-per-node", "3"]) == 0
    said = capsys.readouterr().out
    assert "# on this machine" in said and "--nproc-per-node=3" in said
    assert "trained" not in said and not (project / "results").exists()


def test_a_dry_run_is_a_value_for_a_library_caller(project: Path) -> None:
    from vmrun.operations.train import RunOptions, train

    done = train(RunOptions(script="train.py", launcher="python"), local=True, dry_run=True)
    assert isinstance(done, Prepared) and any("train.py" in line for line in done.lines)
    assert not (project / "results").exists()


def test_a_resumed_run_has_no_dry_run(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.main import run

    assert run(["train", "-H", "a@h1.invalid", "--resume", "r-1", "--dry-run"]) == 2
    code, message = error_in(capsys.readouterr().err)
    assert code == "resume-conflict" and "--dry-run" in message


def test_a_run_here_tells_its_id_once_its_record_exists(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep keeps each size's run id as it starts, here as on hosts (open_training's
    on_start reaches every target)."""
    from vmrun.backends.api import RunRef, StartOptions
    from vmrun.backends.select import Target, open_training
    from vmrun.config import load_settings
    from vmrun.operations.train import RunOptions
    from vmrun.reporting import QUIET
    from vmrun.runs import local

    def fake_run(plan: object, *, on_start: object = None, **_: object) -> int:
        assert callable(on_start)
        on_start("r-here")
        return 0

    monkeypatch.setattr(local, "run_local", fake_run)
    settings = load_settings({})
    told: list[RunRef] = []
    plan = RunOptions(script="train.py", launcher="python").plan(nproc_per_node=None)
    with open_training(Target("local"), settings, on_start=told.append) as training:
        ref = training.start(plan, StartOptions(), QUIET)
        assert training.follow_and_tell(ref, None, QUIET) == 0
    assert [r.run_id for r in told] == ["r-here"] and ref.run_id == "r-here"
