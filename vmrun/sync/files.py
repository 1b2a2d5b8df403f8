"""Which files of the project go to the hosts: git's view, .gitignore, the defaults, .vmrunignore.

`project_files` lists them (git's own view in a git work tree, else a walk honouring
.gitignore files; then DEFAULT_IGNORES and `.vmrunignore`); `large_files` picks the ones the
CLI warns about before sending. How they go is `vmrun.sync.project`'s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

from vmrun.sync import ignore

LARGE_FILE = 100 << 20
VMRUNIGNORE = ".vmrunignore"

# gitignore syntax; a `!pattern` in .vmrunignore re-includes one. `results/` is anchored:
# vmrun's own results folder is at the root, and a package named `results` deeper down is
# code. A folder holding `pyvenv.cfg` (any virtual env, whatever its name) is excluded too.
DEFAULT_IGNORES = (
    ".git/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    ".vmrun/",
    "/results/",
    "checkpoints/",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.safetensors",
    ".ipynb_checkpoints/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "node_modules/",
    ".DS_Store",
)


def _is_venv(project: Path, rel: str) -> bool:
    return os.path.isfile(os.path.join(project, rel, "pyvenv.cfg"))


def _vmrun_matcher(project: Path) -> ignore.Matcher:
    rules = ignore.parse("\n".join(DEFAULT_IGNORES))
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        text = (project / VMRUNIGNORE).read_text(encoding="utf-8", errors="surrogateescape")
        rules += ignore.parse(text)
    return ignore.Matcher(rules, dir_hook=functools.partial(_is_venv, project))


def _git_files(folder: Path) -> list[str] | None:
    """git's list (tracked + untracked not ignored) relative to `folder`; None: not git."""
    git = shutil.which("git")
    if git is None:
        return None
    argv = [git, "-C", str(folder), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    proc = subprocess.run(argv, capture_output=True, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        return None
    found = []
    for raw in dict.fromkeys(proc.stdout.split(b"\0")):
        if not raw:
            continue
        rel = os.fsdecode(raw)
        path = folder / rel
        if path.is_dir() and not path.is_symlink():  # a submodule: its own work tree
            inner = _git_files(path) if (path / ".git").exists() else None
            found += [f"{rel}/{r}" for r in inner or ()]
        elif os.path.lexists(path):  # --cached lists files deleted from the work tree
            found.append(rel)
    return found


def _walk(project: Path, vmrun: ignore.Matcher) -> list[str]:
    """Not a git work tree: walk, honouring every .gitignore as git would; folders that
    the defaults or .vmrunignore exclude are not entered at all (node_modules, venvs)."""
    found: list[str] = []

    def visit(rel_dir: str, folder: str, rules: list[ignore.Rule]) -> None:
        gitignore = os.path.join(folder, ".gitignore")
        if os.path.isfile(gitignore):
            with open(gitignore, encoding="utf-8", errors="surrogateescape") as fh:
                rules = rules + ignore.parse(fh.read(), rel_dir)
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            return
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.name == ".git" or ignore.decide(rules, rel, is_dir):
                continue
            if is_dir:
                if not vmrun.dir_ignored(rel):
                    visit(rel, entry.path, rules)
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                found.append(rel)

    visit("", str(project), [])
    return found


def project_files(project: Path) -> list[str]:
    """POSIX relative paths of the files (and symlinks) to sync, sorted.

    git's view when the project is in a git work tree (`git ls-files --cached --others
    --exclude-standard`: nested .gitignore, .git/info/exclude, the global excludes file),
    else a walk honouring .gitignore files; then DEFAULT_IGNORES and `.vmrunignore`.
    A `!` line in .vmrunignore can re-include a default, not what .gitignore excludes.
    """
    project = Path(os.path.abspath(project))
    vmrun = _vmrun_matcher(project)
    files = _git_files(project)
    if files is None:
        files = _walk(project, vmrun)
    return sorted(f for f in files if not vmrun.ignored(f))


def vmrun_ignores(project: Path) -> ignore.Matcher:
    """The rules vmrun adds to git's (its defaults, `.vmrunignore`): `.ignored(rel)` tells
    whether a path, there or not, would be left out of the sync."""
    return _vmrun_matcher(Path(os.path.abspath(project)))


def large_files(
    project: Path, files: Sequence[str], threshold: int = LARGE_FILE
) -> list[tuple[str, int]]:
    """(path, size) of the regular files of at least `threshold` bytes, biggest first: the
    CLI warns before syncing them (a dataset or model that should be excluded, usually)."""
    big = []
    for rel in files:
        try:
            st = os.lstat(project / rel)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size >= threshold:
            big.append((rel, st.st_size))
    return sorted(big, key=lambda item: (-item[1], item[0]))
