"""One output object (vmrun.reporting): what the library says goes to the `out: Reporter`
its caller hands down, never to callbacks or straight to the terminal."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from fake_group import FakeGroup

from vmrun.backends.api import RunRef
from vmrun.backends.hosts import records
from vmrun.backends.hosts.backend import HostsBackend
from vmrun.reporting import Recorder, Reporter
from vmrun.ssh.connection import Connection

PACKAGE = Path(__file__).resolve().parent.parent / "vmrun"
CALLBACKS = {"note", "emit", "on_line"}  # what `out` replaced
ALIASES = {"Note", "Emit"}
# run on hosts, never imported by vmrun: they print as any script does
NOT_LIBRARY = ("hostside", "trainer")


def _trees(skip: tuple[str, ...]) -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(skip):
            found.append((rel, ast.parse(path.read_text(encoding="utf-8"))))
    return found


def test_no_note_or_emit_callback_parameter_or_alias_is_left() -> None:
    left = []
    for rel, tree in _trees(NOT_LIBRARY):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                    if arg is not None and arg.arg in CALLBACKS:
                        left.append(f"{rel}:{node.lineno} parameter {arg.arg}")
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ALIASES:
                    left.append(f"{rel}:{node.lineno} alias {target.id}")
    assert not left, f"take `out: Reporter` instead (vmrun.reporting): {left}"


def test_the_library_never_writes_to_the_terminal_itself() -> None:
    """sys.stdout/sys.stderr and print() are the CLI's (its Terminal); the library says
    things through `out`."""
    stray = []
    for rel, tree in _trees((*NOT_LIBRARY, "cli")):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("stdout", "stderr")
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                stray.append(f"{rel}:{node.lineno} sys.{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                stray.append(f"{rel}:{node.lineno} print()")
    assert not stray, f"say it through `out: Reporter` (vmrun.reporting): {stray}"


def test_the_cli_writes_one_way() -> None:
    """In cli/, only output.py writes (say, show, info_line, warn_line, error_line) or makes
    a rich Console (make_console): no typer.echo, print, sys.std* writes or Console() of
    a command's own. A live view may print through the console it was given."""
    stray = []
    for rel, tree in _trees(()):
        if not rel.startswith("cli/") or rel == "cli/output.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            owner = getattr(getattr(func, "value", None), "id", None)
            if (
                (name in ("print", "Console") and isinstance(func, ast.Name))
                or (name == "echo" and owner == "typer")
                or (name == "write" and getattr(func.value, "attr", None) in ("stdout", "stderr"))
            ):
                stray.append(f"{rel}:{node.lineno} {name}")
    assert not stray, f"write through vmrun.cli.output: {stray}"


@pytest.fixture
def one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HostsBackend:
    """A hosts backend on a fake group of one host, accA, whose run r1 prints two ranks'
    lines in torchrun's tee'd form (a line cut across two chunks) and ends well."""
    fake = FakeGroup(["accA"], tmp_path)
    chunks = [b"\x1e[rank0]:epoch 1 ", b"loss 0.5\n\x1e[rank1]:epoch 1 loss 0.4\n"]

    def follow(conn: Connection, run_id: str, out: Reporter, **kw: Any) -> None:
        for chunk in chunks:
            out.output(chunk)

    def list_runs(conn: Connection, run_ids: Any = ()) -> list[records.RunRecord]:
        return [records.RunRecord("r1", conn.label, exit_code=0, ended=2.0)]

    monkeypatch.setattr(records, "follow", follow)
    monkeypatch.setattr(records, "list_runs", list_runs)
    return HostsBackend(fake)  # type: ignore[arg-type]


def test_following_a_run_says_its_lines_and_its_end_to_the_reporter(
    one_node: HostsBackend,
) -> None:
    out = Recorder()
    assert one_node.follow(RunRef("r1", ("accA",)), out) == 0
    assert out.outputs == [b"[rank0] epoch 1 loss 0.5\n", b"[rank1] epoch 1 loss 0.4\n"]
    (said,) = out.said
    assert said[0] == "info" and said[1].startswith("run r1 finished on accA")
