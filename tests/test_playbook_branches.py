"""playbook: a script that branches on a param with choices (pure): strict parsing, the branch
a param's value picks, and fingerprints (a changed param re-runs the step)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from vmrun.errors import ConfigError
from vmrun.setup.playbook import fingerprint, load, parse
from vmrun.setup.stepscripts import apply_script, dry_run_text

BOOK = """\
params:
  mode: {default: a, choices: [a, b]}
  free: x
steps:
  - name: s1
    inputs: [free]
    apply:
      by: mode
      a: echo from-a
      b: echo from-b
"""


def _book(tmp_path: Path, text: str = BOOK) -> Path:
    path = tmp_path / "book.yaml"
    path.write_text(text)
    return path


def test_the_param_value_picks_the_branch_and_only_it_shows(tmp_path: Path) -> None:
    book = load(_book(tmp_path))
    assert book.params == {"mode": "a", "free": "x"} and book.choices == {"mode": ("a", "b")}
    (step,) = book.steps
    as_b = step.resolved({"mode": "b", "free": "x"})
    assert apply_script(as_b) == "echo from-b" and as_b.picked == ("mode",)
    shown = dry_run_text(as_b, {"VMRUN_MODE": "b"})
    assert shown == "# VMRUN_MODE=b\necho from-b"
    assert "from-a" not in shown


def test_a_changed_branch_param_changes_the_fingerprint_even_if_not_an_input(
    tmp_path: Path,
) -> None:
    (step,) = load(_book(tmp_path)).steps
    prints = {
        mode: fingerprint(step.resolved({"mode": mode, "free": "x"}), {"mode": mode}, {})
        for mode in ("a", "b")
    }
    assert prints["a"] != prints["b"]
    assert "mode" in step.params_used and "mode" not in step.inputs


def test_a_step_without_branches_hashes_as_it_always_did() -> None:
    """Hosts set up before keep their state: the new fields are not in a plain step's hash."""
    step = load().step("torch")
    old_body = {
        k: v
        for k, v in step.__dict__.items()
        if k not in ("description", "branches", "picked", "relogin")
    }
    old = hashlib.sha256(json.dumps(old_body, sort_keys=True, default=list).encode()).hexdigest()
    assert step.definition_hash() == old
    assert step.resolved({"env": "uv"}) is step


def test_the_default_env_step_has_a_branch_per_manager() -> None:
    book = load()
    step = book.step("python-env")
    assert book.choices["env"] == ("venv", "uv", "conda", "python")
    scripts = {env: step.resolved({"env": env}).apply for env in book.choices["env"]}
    assert "python3 -m venv" in scripts["venv"] and "UV_VENV_CLEAR" not in scripts["venv"]
    assert '"$uv" venv' in scripts["uv"] and "miniconda3" not in scripts["uv"]
    assert "miniconda3" in scripts["conda"]
    assert "does not run on this host" in scripts["python"]
    assert all("case" not in s for s in scripts.values())


@pytest.mark.parametrize(
    ("apply", "needle"),
    [
        ("{by: mode, a: x, b: y, c: z}", ("apply.c", "a, b")),  # the choices there are
        ("{by: mode, a: x}", ("mode=b",)),
        ("{by: free, a: x, b: y}", ("apply.by",)),
        ("{by: nope, a: x, b: y}", ("apply.by",)),
        ("{a: x, b: y}", ("apply.by",)),
        ("{by: mode, a: x, b: [y]}", ("apply.b", "list")),
        ("[x]", ("apply", "list")),
    ],
)
def test_bad_branches_are_one_line_naming_file_step_and_field(
    tmp_path: Path, apply: str, needle: tuple[str, ...]
) -> None:
    text = BOOK.split("    apply:")[0] + f"    apply: {apply}\n"
    path = _book(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    line = info.value.one_line()
    assert "\n" not in line and info.value.code == "bad-config"
    assert line.startswith(f"{path}: step 's1': ") and all(f in line for f in needle), line


@pytest.mark.parametrize(
    ("param", "needle"),
    [
        ("{default: c, choices: [a, b]}", "'c'"),
        ("{default: a, choices: []}", "choices"),
        ("{default: a, choices: [a, 1]}", "choices"),
        ("{default: a}", "choices"),
        ("{default: a, choices: [a], help: x}", "help"),
    ],
)
def test_bad_choices_are_one_line_naming_file_and_param(
    tmp_path: Path, param: str, needle: str
) -> None:
    path = _book(tmp_path, BOOK.replace("{default: a, choices: [a, b]}", param))
    with pytest.raises(ConfigError) as info:
        load(path)
    line = info.value.one_line()
    assert info.value.code == "bad-config" and line.startswith(f"{path}: param mode: ")
    assert needle in line.removeprefix(f"{path}: param mode: "), line


def test_extra_steps_may_branch_on_the_playbooks_choices() -> None:
    book = parse(
        {
            "params": {"mode": {"default": "a", "choices": ["a", "b"]}},
            "steps": [{"name": "one", "apply": "true"}],
        },
        "t",
    )
    from vmrun.setup.playbook import parse_steps

    (extra,) = parse_steps(
        [{"name": "two", "check": {"by": "mode", "a": "true", "b": "false"}, "apply": "x"}],
        "extra.yaml",
        set(book.params),
        book.choices,
    )
    assert extra.resolved({"mode": "b"}).check == "false"
    with pytest.raises(ConfigError) as info:
        parse_steps([{"name": "two", "check": {"by": "mode"}, "apply": "x"}], "extra.yaml")
    assert info.value.code == "bad-config"
    assert info.value.message.startswith("extra.yaml: step 'two': check.by")
