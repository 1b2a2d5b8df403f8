"""gitignore matching (vmrun.sync.ignore) held against git itself.

Each case writes a tree and its ignore files, asks real git which files it would add
(`git ls-files --others --exclude-standard` in a fresh repository), and requires the walk
that vmrun uses outside git work trees to give the same list.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vmrun.sync import ignore
from vmrun.sync.files import _vmrun_matcher, _walk

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

TREE = [
    "a.log",
    "keep.log",
    "src/a.py",
    "src/a.log",
    "src/build/out.o",
    "build/x",
    "docs/build/y",
    "deep/er/foo/z",
    "deep/foo",
    "foo/bar/baz.txt",
    "abc/x/y/z.tmp",
    "abc/top.tmp",
    "lit#hash",
    "#comment-like",
    "!bang",
    "sp ace ",
    "sp ace",
    "q?",
    "qx",
    "x1.c",
    "x2.c",
    "xa.c",
    "x-.c",
    "node/a.js",
    "node/keep/b.js",
    "logs/sub/a.txt",
    "logs/important.txt",
    "nested/.gitignore",
    "nested/drop.me",
    "nested/keep.me",
    "nested/inner/drop.me",
    "uni/ünï.txt",
    "trailing-spaces.txt",
]

ROOT_IGNORE = r"""
# a comment
*.log
!keep.log
/build/
**/foo/z
deep/**/foo
abc/**
!abc/top.tmp
\#comment-like
\!bang
sp\ ace\{SP}
q[?]
x[0-9].c
x[!0-9].c
node/*
!node/keep/
logs/
!logs/important.txt
uni/*.txt
trailing-spaces.txt{SP}{SP}{SP}
""".replace("{SP}", " ")

NESTED_IGNORE = """
*.me
!keep.me
"""


def _git_view(root: Path) -> list[str]:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
        env={"HOME": str(root.parent), "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
    ).stdout
    shutil.rmtree(root / ".git")
    return sorted(p.decode() for p in out.split(b"\0") if p)


@needs_git
def test_walk_gives_what_git_gives(tmp_path: Path) -> None:
    root = tmp_path / "p"
    for rel in TREE:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text(ROOT_IGNORE)
    (root / "nested" / ".gitignore").write_text(NESTED_IGNORE)
    expected = _git_view(root)
    ours = sorted(_walk(root, ignore.Matcher()))
    assert ours == expected, "\n".join(sorted(set(ours) ^ set(expected)))
    # sanity: the cases do exclude and re-include things
    assert "keep.log" in ours and "a.log" not in ours and "node/keep/b.js" in ours
    assert "abc/top.tmp" in ours and "abc/x/y/z.tmp" not in ours  # `x/**` spares x itself
    assert "sp ace " not in ours and "sp ace" in ours  # an escaped trailing space counts
    assert "logs/important.txt" not in ours  # its folder is excluded: no re-include
    assert "trailing-spaces.txt" not in ours


def test_rules_on_single_paths() -> None:
    rules = ignore.parse("*.pt\n!small.pt\nresults/\n/anchored\nd/**/e\n")
    m = ignore.Matcher(rules)
    assert m.ignored("a/b/model.pt") and not m.ignored("a/small.pt")
    assert m.ignored("x/results/f.txt") and not m.ignored("results")  # a file, not a folder
    assert m.ignored("anchored") and not m.ignored("sub/anchored")
    assert m.ignored("d/e") and m.ignored("d/x/y/e") and not m.ignored("dd/e")
    assert ignore.parse("# only\n\n   \n") == []


def test_a_venv_is_found_by_its_pyvenv_cfg_and_can_be_re_included(tmp_path: Path) -> None:
    (tmp_path / "tools-env").mkdir()
    (tmp_path / "tools-env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "plain").mkdir()
    m = _vmrun_matcher(tmp_path)
    assert m.ignored("tools-env/bin/python") and not m.ignored("plain/x.py")
    (tmp_path / ".vmrunignore").write_text("!tools-env/\n")
    assert not _vmrun_matcher(tmp_path).ignored("tools-env/bin/python")
