"""`vmrun setup`'s input is checked before it connects anywhere: bad input exits 2.

The host named here is TEST-NET-3 (RFC 5737), which nothing answers: had setup tried to
connect, it would have failed with the connect timeout's exit code, not 2, and said so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Client, error_in

NOWHERE = "203.0.113.9"


@pytest.mark.parametrize(
    ("field", "needle"),
    [
        ("when: {os: 22.04}", "step 'one': when.os must be a string or a list of strings"),
        ('when: {gpu: "false"}', "step 'one': when.gpu must be true or false"),
        ('sudo: "no"', "step 'one': sudo must be true or false, not the string 'no'"),
        ("colour: blue", "step 'one': unknown field(s) colour"),
    ],
)
def test_a_bad_playbook_field_exits_2_naming_file_step_and_field(
    client: Client, tmp_path: Path, field: str, needle: str
) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(f"steps:\n  - name: one\n    apply: 'true'\n    {field}\n")
    done = client.vmrun("setup", NOWHERE, "--playbook", str(book), timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{book}: {needle}" in done.stderr, done.stderr
    assert NOWHERE not in done.stderr  # it never got as far as the host


def test_a_bad_extra_file_exits_2_too(client: Client, tmp_path: Path) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text("steps:\n  - name: more\n    apply: 'true'\n    reboot: 'yes'\n")
    done = client.vmrun("setup", NOWHERE, "--extra", str(extra), timeout=60)
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "bad-config" and said.startswith(f"{extra}: step 'more': reboot"), said


@pytest.mark.parametrize(
    "args",
    [
        ("--env-manager", "nonsense"),
        ("--param", "env=nonsense"),
        ("--env", "nonsense"),  # the deprecated name
    ],
)
def test_an_unknown_env_manager_exits_2_before_connecting(
    client: Client, args: tuple[str, ...]
) -> None:
    done = client.vmrun("setup", NOWHERE, *args, timeout=60)
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "usage" and "'nonsense'" in said, done.stderr
    assert NOWHERE not in done.stderr


def test_the_old_env_flag_is_a_deprecated_alias(client: Client) -> None:
    done = client.vmrun("setup", NOWHERE, "--env", "uv", "--env-manager", "conda", timeout=60)
    assert done.returncode == 2, done.stderr
    assert "setup --env is deprecated: use --env-manager" in done.stderr
    code, said = error_in(done.stderr)
    assert code == "usage" and said.startswith("--env uv and --env-manager conda"), said
    notes = [line for line in done.stderr.splitlines() if "deprecated" in line]
    assert len(notes) == 1, done.stderr


BRANCHED = """\
params:
  mode: {default: a, choices: [a, b]}
steps:
  - name: one
    apply: {by: mode, a: 'true', b: 'true'%s}
"""


def test_a_bad_branch_exits_2_naming_file_step_and_field(client: Client, tmp_path: Path) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(BRANCHED % ", c: 'true'")
    done = client.vmrun("setup", NOWHERE, "--playbook", str(book), timeout=60)
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "bad-config" and said.startswith(f"{book}: step 'one': ") and "apply.c" in said
    assert NOWHERE not in done.stderr


def test_a_value_outside_a_params_choices_exits_2(client: Client, tmp_path: Path) -> None:
    book = tmp_path / "book.yaml"
    book.write_text(BRANCHED % "")
    done = client.vmrun("setup", NOWHERE, "--playbook", str(book), "--param", "mode=c", timeout=60)
    assert done.returncode == 2, done.stderr
    code, said = error_in(done.stderr)
    assert code == "usage" and "mode='c'" in said and "a, b" in said, done.stderr
    assert NOWHERE not in done.stderr
