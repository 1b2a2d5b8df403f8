"""The shape rules the code keeps (docs/development.md): no module in vmrun/
over 400 lines, no function over 80 lines of body (a signature's parameter list, such as a
Typer command's declared options, is not counted), except where the function's `def` line
carries a `# long:` comment saying why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "vmrun"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# Modules that keep their size on purpose, and why.
LARGE_BY_DESIGN = {
    "trainer/template.py": "uploaded to the hosts as one file and run there by path",
}
# Modules and functions that have still to be split; an entry goes when its split lands.
STILL_TO_SPLIT: set[str] = set()


def _signature_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines taken by the parameter list (after the `def` line, up to the body)."""
    first_body = fn.body[0]
    start = first_body.lineno
    if first_body.__dict__.get("decorator_list"):
        start = min(d.lineno for d in first_body.decorator_list)  # type: ignore[attr-defined]
    return max(0, start - fn.lineno - 1)


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The function's lines less its own and its nested functions' parameter lists."""
    total = (fn.end_lineno or fn.lineno) - fn.lineno + 1
    nested = [n for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return total - sum(_signature_lines(n) for n in nested)


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_modules_are_small() -> None:
    big = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
        and str(p.relative_to(PACKAGE)) not in STILL_TO_SPLIT
        and str(p.relative_to(PACKAGE)) not in LARGE_BY_DESIGN
    }
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them): {big}"


def test_functions_are_short() -> None:
    long: dict[str, int] = {}
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if "# long:" in lines[node.lineno - 1]:
                continue
            if f"{path.relative_to(PACKAGE)} {node.name}" in STILL_TO_SPLIT:
                continue
            n = body_lines(node)
            if n > MAX_FUNCTION_LINES:
                long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them): {long}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(\n    a: int,\n    b: int,\n) -> None:\n    x = 1\n    y = 2\n", 3),
        ("def f():\n    pass\n", 2),
    ],
)
def test_body_lines_leave_out_the_parameter_list(source: str, expected: int) -> None:
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert body_lines(fn) == expected
