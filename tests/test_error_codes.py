"""Error codes: unique, one per class, every one documented in docs/errors.md, and printed
by the CLI and in `--json`. `python3 tests/test_error_codes.py` rewrites the doc's table."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "errors.md"
MARK = "<!-- codes -->\n"
SKIP = ("vmrun.hostside", "vmrun.trainer")  # host-side scripts and the torch trainer


def _load_all() -> None:
    """Import every module that may define an error class (each registers its code)."""
    import vmrun

    for mod in pkgutil.walk_packages(vmrun.__path__, "vmrun."):
        if not mod.name.startswith(SKIP) and mod.name != "vmrun.__main__":
            importlib.import_module(mod.name)


def _classes() -> list[type]:
    from vmrun.errors import VmrunError

    found, todo = [], [VmrunError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_has_its_own_registered_code() -> None:
    from vmrun.errors import CODES

    _load_all()
    classes = _classes()
    codes = [cls.__dict__.get("code") for cls in classes]
    assert None not in codes, [c.__name__ for c in classes if "code" not in c.__dict__]
    assert len(set(codes)) == len(codes)
    for cls in classes:
        assert CODES[cls.code].owner == cls.__name__


def test_a_code_is_registered_once_and_kebab_case() -> None:
    from vmrun.errors import UsageError, register

    with pytest.raises(ValueError, match="twice"):
        register("run-not-found", UsageError, "again")
    with pytest.raises(ValueError, match="kebab"):
        register("Run_Not_Found", UsageError, "x")


def test_a_raise_site_code_must_be_registered_for_its_class() -> None:
    from vmrun.errors import CommandFailed, RemoteError, UsageError

    assert UsageError("x", code="run-not-found").code == "run-not-found"
    assert CommandFailed("x", exit_status=124, code="timeout").code == "timeout"
    with pytest.raises(ValueError):
        UsageError("x", code="no-such-code")
    with pytest.raises(ValueError):  # exit 14 would contradict the doc's 2
        RemoteError("x", code="run-not-found")


def test_every_code_in_the_source_is_registered_and_every_registered_code_is_used() -> None:
    """A `code="..."` typo, or a code given to a class with another exit code, fails here
    and not at a user's raise; a code that nothing raises is not kept."""
    from vmrun.errors import CODES, _may_carry

    _load_all()
    classes = {cls.__name__: cls for cls in _classes()}
    used = {cls.code for cls in classes.values()}
    for path in (ROOT / "vmrun").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        used.update(re.findall(r'CODES\["([^"]+)"\]', text))
        for call in (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)):
            for kw in call.keywords:
                if kw.arg != "code" or not isinstance(kw.value, ast.Constant):
                    continue
                where = f"{path.relative_to(ROOT)}:{call.lineno}"
                assert kw.value.value in CODES, f"{where}: unregistered code {kw.value.value!r}"
                used.add(kw.value.value)
                cls = classes.get(getattr(call.func, "id", ""))
                if cls is not None:
                    assert _may_carry(cls, CODES[kw.value.value]), f"{where}: not {cls.__name__}'s"
    assert set(CODES) - used == set()


def _documented() -> list[tuple[str, str]]:
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", DOC.read_text(encoding="utf-8"), re.M)
    return [(name, status.strip()) for name, status in rows]


def test_docs_errors_md_lists_every_code_once_with_its_exit_status() -> None:
    from vmrun.errors import CODES, codes_table

    _load_all()
    names = [name for name, _ in _documented()]
    assert len(names) == len(set(names)), "a code is listed twice in docs/errors.md"
    assert set(names) == set(CODES), (
        f"missing: {sorted(set(CODES) - set(names))}, not a code: {sorted(set(names) - set(CODES))}"
    )
    assert DOC.read_text(encoding="utf-8").endswith(MARK + codes_table()), (
        "docs/errors.md is stale: run `python3 tests/test_error_codes.py`"
    )


def test_the_cli_prints_the_code_with_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    from vmrun.cli.main import run

    assert run(["exec", "--bogus", "--", "true"]) == 2
    assert capsys.readouterr().err.startswith("vmrun: error[usage]: No such option: --bogus")
    assert run(["report", "--json", "--markdown"]) == 2
    assert capsys.readouterr().err.startswith("vmrun: error[usage]: ")
    assert run(["plot", "no-such-run", "-C", "x", "-H", "y"]) == 2
    assert capsys.readouterr().err.startswith("vmrun: error[usage]: ")


def test_an_unknown_cluster_is_its_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vmrun.toml").write_text('[[clusters]]\nname = "bed"\nlogin = "u@login"\n')
    assert run(["status", "-C", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("vmrun: error[cluster-not-found]: -C nosuch")


def test_hosts_failed_has_the_hosts_code_when_they_share_one() -> None:
    from vmrun.errors import AuthError, HostsFailed, UnreachableError

    same = HostsFailed({"a": UnreachableError("x"), "b": UnreachableError("y")}, total=2)
    assert same.code == "host-unreachable" and same.exit_code == 12
    mixed = HostsFailed({"a": AuthError("x"), "b": UnreachableError("y")}, total=2)
    assert mixed.code == "hosts-failed" and mixed.exit_code == 12


def test_watch_gpus_json_carries_the_code() -> None:
    from vmrun.gpus.fleet import HostSample, HostState, HostStatus

    sample = HostSample(
        "h1", HostState.UNREACHABLE, 0.0, message="no answer", exit_code=12, code="host-unreachable"
    )
    data = json.loads(json.dumps(HostStatus(sample).to_json()))
    assert data["state"] == "unreachable" and data["code"] == "host-unreachable"
    assert data["error"] == {"code": "host-unreachable", "message": "no answer", "exit_status": 12}
    fine = HostStatus(HostSample("h1", HostState.OK, 0.0)).to_json()
    assert fine["code"] is None

    assert fine["error"] is None
    lost = HostSample(
        "h1", HostState.DISCONNECTED, 0.0, message="dropped; retrying", code="connection-lost"
    )
    assert HostStatus(lost).to_json()["error"] == {
        "code": "connection-lost",
        "message": "dropped; retrying",
        "exit_status": 13,
    }  # a retried failure adds nothing to the exit yet: the code's own status


def test_error_json_is_one_shape_for_any_failure() -> None:
    from vmrun.errors import CommandFailed, UsageError, error_json

    assert error_json(UsageError("bad", host="h1", code="run-not-found")) == {
        "code": "run-not-found",
        "message": "h1: bad",
        "exit_status": 2,
    }
    assert error_json(CommandFailed("x", exit_status=7))["exit_status"] == 7
    assert error_json(RuntimeError("boom"))["code"] == "internal"


def test_report_json_carries_each_left_out_run_with_its_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import errors_in

    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("VMRUN_HOSTS", raising=False)
    good = tmp_path / "results" / "good-1"
    good.mkdir(parents=True)
    (good / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.5}\n')
    (tmp_path / "results" / "bare-1").mkdir()
    assert run(["report", "good-1", "bare-1", "nope-1", "--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert [(r["run"], r["error"] and r["error"]["code"]) for r in rows] == [
        ("good-1", None),
        ("bare-1", "run-data-missing"),
        ("nope-1", "run-data-missing"),
    ]
    assert [list(r) for r in rows[1:]] == [list(rows[0])] * 2 and rows[2]["epochs"] is None
    assert "nope-1" in rows[2]["error"]["message"] and rows[2]["error"]["exit_status"] == 2
    assert errors_in(err) == []  # on stderr they are warnings: the report went on

    assert run(["report", "nope-1", "--json"]) == 2  # none left: the JSON still says why
    out, err = capsys.readouterr()
    assert [r["error"]["code"] for r in json.loads(out)] == ["run-data-missing"]
    assert errors_in(err)[0][0] == "usage"


if __name__ == "__main__":  # rewrite docs/errors.md's table from the registry
    sys.path.insert(0, str(ROOT))
    _load_all()
    from vmrun.errors import codes_table

    head = DOC.read_text(encoding="utf-8").split(MARK, 1)[0]
    DOC.write_text(head + MARK + codes_table(), encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
