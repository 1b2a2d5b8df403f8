"""What made a run, as known here before it starts: the code (git commit, uncommitted diff,
a content hash of what is synced) and the variables the run is given.

The host side records the rest beside the run (hostside/run_provenance.py: interpreter,
packages, torch/CUDA/NCCL, hardware), started by the same command that starts the run, so
the record costs no round trip. The code facts go in run.json (`code`), the diff itself in
the record's code.patch: it travels in the launch spec (over stdin, never on a command
line), gzipped, and the spec is one environment string with a hard limit (MAX_ARG_STRLEN,
128 KiB), hence PATCH_LIMIT.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATCH_LIMIT = 96 << 10  # the encoded patch in the launch spec (base64 of gzip)
UNTRACKED_LISTED = 100
GIT_TIMEOUT_S = 20.0
CUT_MARK = b"# vmrun: the diff was cut here (too large)\n"
_CREDENTIALS = re.compile(r"(?<=://)[^/@]*@")


@dataclass(frozen=True)
class Code:
    """The code facts (run.json's `code`) and the uncommitted diff (b"" when clean)."""

    facts: dict[str, Any]
    patch: bytes = b""

    def sent(self) -> str:
        """The diff as the launch spec carries it to the host's record ("" when clean)."""
        return encode_patch(self.patch)


def code_of(
    project: Path, files: Sequence[str] | None = None, *, trainer: Path | None = None
) -> Code:
    """The project's git state and the hash of what is synced: `files` (the project's,
    relative), or the template `trainer` alone when the run is vmrun's template (then the
    project's commit is told, but nothing of it is synced: no dirty state, no diff)."""
    from vmrun.sync.files import project_files

    if trainer is not None:
        tree, count = tree_hash(trainer.parent, [trainer.name]), 1
        facts, patch = _git_state(project, None)
    else:
        listed = list(files) if files is not None else project_files(project)
        tree, count = tree_hash(project, listed), len(listed)
        facts, patch = _git_state(project, listed)
    return Code({**facts, "tree_sha256": tree, "files": count}, patch)


def tree_hash(root: Path, files: Sequence[str]) -> str:
    """SHA-256 over each file's path, kind and content hash (a link's target), sorted: the
    same tree gives the same hash wherever it is, whatever the mtimes."""
    whole = hashlib.sha256()
    for rel in sorted(files):
        whole.update(f"{rel}\0{_entry_hash(root / rel)}\n".encode("utf-8", "surrogateescape"))
    return whole.hexdigest()


def _entry_hash(path: Path) -> str:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return "link:" + hashlib.sha256(os.fsencode(os.readlink(path))).hexdigest()
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        exec_bit = "x" if st.st_mode & 0o100 else "-"
        return f"{exec_bit}:{digest.hexdigest()}"
    except OSError:
        return "missing"


_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_LITERAL_PATHSPECS": "1"}


def _git(project: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(project), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **_GIT_ENV},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "surrogateescape") if done.returncode == 0 else None


@dataclass
class _Status:
    """`git status --porcelain=v2 -z` of the project's folder, paths as the sync names them
    (relative to the project)."""

    head: str | None = None
    branch: str | None = None
    changed: list[str] = field(default_factory=list)  # tracked, changed (both names of a rename)
    untracked: list[str] = field(default_factory=list)  # a folder ends with /


def _status(text: str, prefix: str) -> _Status:
    found = _Status()
    entries = iter(text.split("\0"))
    cut = len(prefix) + 1 if prefix else 0
    for entry in entries:
        kind = entry[:2]
        if entry.startswith("# branch.oid "):
            found.head = entry.split()[-1]
        elif entry.startswith("# branch.head "):
            found.branch = entry.split(" ", 2)[-1]
        elif kind == "? ":
            found.untracked.append(entry[2:][cut:])
        elif kind in _PATH_AT:
            found.changed.append(entry.split(" ", _PATH_AT[kind])[-1][cut:])
            if kind == "2 ":  # a rename or copy: the original name is the next entry
                found.changed.append(next(entries, "")[cut:])
    return found


_PATH_AT = {"1 ": 8, "2 ": 9, "u ": 10}  # the path is the field after these many spaces


def _synced_only(
    project: Path, status: _Status, files: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The changed and untracked paths the sync sends, and tracked files deleted here that
    it would have sent (a file .vmrunignore or vmrun's defaults leave here, results/ say,
    is neither dirt nor diff of the run's code)."""
    from vmrun.sync.files import vmrun_ignores

    synced = set(files)
    folders = {rel[: i + 1] for rel in synced for i, c in enumerate(rel) if c == "/"}
    gone = [p for p in status.changed if p not in synced and not os.path.lexists(project / p)]
    if gone:
        rules = vmrun_ignores(project)
        synced |= {p for p in gone if not rules.ignored(p)}
    changed = [p for p in status.changed if p in synced]
    untracked = [u for u in status.untracked if u in synced or u in folders]
    return changed, untracked


def _diff(project: Path, paths: list[str], per_call: int = 500) -> bytes:
    """`git diff HEAD` of these paths (literal), a few hundred to a command line."""
    parts = []
    for at in range(0, len(paths), per_call):
        text = _git(
            project,
            "diff",
            "HEAD",
            "--binary",
            "--no-color",
            "--no-ext-diff",
            "--",
            *paths[at : at + per_call],
        )
        parts.append((text or "").encode("utf-8", "surrogateescape"))
    return b"".join(parts)


def _git_state(project: Path, files: Sequence[str] | None) -> tuple[dict[str, Any], bytes]:
    """Commit, branch, remote, and of the synced `files` (None: none, a template run)
    whether any differs from the commit, the untracked ones and the diff against HEAD;
    {"git": False} outside a repository."""
    text = _git(project, "status", "--porcelain=v2", "--branch", "-z", "--", ".")
    if text is None:
        return {"git": False, "commit": None, "dirty": None}, b""
    prefix = (_git(project, "rev-parse", "--show-prefix") or "").strip().rstrip("/")
    status = _status(text, prefix)
    commit = status.head if status.head and status.head != "(initial)" else None
    changed, untracked = _synced_only(project, status, files or [])
    patch = b""
    if commit and changed:
        patch = _diff(project, sorted(set(changed)))
    facts = {
        "git": True,
        "commit": commit,
        "branch": None if status.branch in (None, "(detached)") else status.branch,
        "dirty": None if files is None else bool(changed or untracked),
        "remote": _remote(project),
        "path": prefix,
        "untracked": untracked[:UNTRACKED_LISTED],
        "untracked_count": len(untracked),
        "patch_bytes": len(patch),
        "patch_sha256": hashlib.sha256(patch).hexdigest() if patch else None,
        "patch_truncated": bool(patch) and not encode_patch(patch, check_only=True),
    }
    return facts, patch


def _remote(project: Path) -> str | None:
    """The upstream's URL (origin first), with any user and token taken out."""
    text = _git(project, "config", "--get-regexp", r"^remote\..*\.url$") or ""
    urls = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    url = urls.get("remote.origin.url") or next(iter(urls.values()), None)
    return _CREDENTIALS.sub("", url) if url else None


def encode_patch(patch: bytes, *, check_only: bool = False) -> str:
    """base64 of the gzipped diff, cut (at a line end, marked) until it fits PATCH_LIMIT;
    "" for no diff. `check_only`: "" also when it would have to be cut."""
    if not patch:
        return ""
    body = patch
    while body:
        packed = base64.b64encode(gzip.compress(body, compresslevel=6, mtime=0)).decode()
        if len(packed) <= PATCH_LIMIT:
            return packed
        if check_only:
            return ""
        cut = body[: len(body) * PATCH_LIMIT // len(packed) * 9 // 10]
        body = cut[: cut.rfind(b"\n") + 1] + CUT_MARK
        if len(cut) < 1024:
            return ""
    return ""


def sent_patch(patch: bytes) -> bytes:
    """The diff as the host's record keeps it: cut as the environment's limit cuts it, so
    every backend keeps the same text."""
    encoded = encode_patch(patch)
    return gzip.decompress(base64.b64decode(encoded)) if encoded else b""


# -- the run's variables ----------------------------------------------------------------


def variables(given: Mapping[str, str], users: Iterable[str]) -> dict[str, str | None]:
    """Every variable the run is given: the value of those vmrun sets, None for the ones
    the user gave (--env, vmrun.toml's env, NCCL_* from this shell): a value may be a secret."""
    hidden = set(users)
    return {name: (None if name in hidden else value) for name, value in sorted(given.items())}


def versions_of(text: str) -> dict[str, Any] | None:
    """versions.json's one line (python, torch, CUDA, NCCL, GPU, driver), or None."""
    import json

    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
