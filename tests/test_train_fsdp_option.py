"""`train --fsdp`: passed to the template as its `--fsdp`, listed under the template's
heading, refused with a SCRIPT (which shards and checkpoints itself) and with --resume."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import error_in


def test_the_template_gets_fsdp_after_its_other_options() -> None:
    from vmrun.runs.plan import make_plan

    common = dict(
        script=None,
        user_args=None,
        epochs=2,
        save_every=1,
        nproc_per_node="2",
        max_restarts=0,
        env=None,
        name=None,
        batch_size=8,
        lr=None,
        launcher="torchrun",
    )
    assert make_plan(**common, fsdp=True).args == ["2", "1", "--batch-size", "8", "--fsdp"]
    assert make_plan(**common).args == ["2", "1", "--batch-size", "8"]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (
            ["train", "--local", "my.py", "--fsdp"],
            "flags-conflict",
            "--fsdp is the template trainer's: your SCRIPT shards its model",
        ),
        (
            ["train", "--resume", "r-20260101-000000-abcd", "--fsdp"],
            "resume-conflict",
            "drop --fsdp",
        ),
    ],
)
def test_fsdp_is_refused_where_it_cannot_mean_anything(
    args: list[str],
    code: str,
    needle: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.py").write_text("print('never run')\n")
    assert run(args) == 2
    said = error_in(capsys.readouterr().err)
    assert said[0] == code and needle in said[1], said
    assert len(said[1].splitlines()) == 1


def test_help_all_lists_fsdp_under_the_template_heading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vmrun.cli.main import run

    assert run(["train", "--help-all"]) == 0
    text = capsys.readouterr().out
    section = text.split("\nThe template trainer:\n", 1)[1].split("\n\n", 1)[0]
    assert "--fsdp" in section and "checkpoints/epoch-N/" in text
