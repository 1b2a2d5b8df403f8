"""What made a run, as known here before it starts: the code (git commit, uncommitted diff,
a content hash of what is synced) and the variables the run is given.

The host side records the rest beside the run (hostside/run_provenance.py: interpreter,
packages, torch/CUDA/NCCL, hardware), started by the same command that starts the run, so
the record costs no round trip. The code facts go in run.json (`code`), the diff itself in
the record's code.patch: it travels in the start command's environment (over stdin, never
on a command line), gzipped, and an environment string has a hard limit (MAX_ARG_STRLEN,
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATCH_LIMIT = 96 << 10  # the encoded patch in the environment (base64 of gzip)
UNTRACKED_LISTED = 100
GIT_TIMEOUT_S = 20.0
# the host side reads these (hostside/run_start.sh) and takes them out of the run's env
PATCH_VAR = "VMRUN_CODE_PATCH"
COLLECTOR_VAR = "VMRUN_PROVENANCE"  # the interpreter that describes the run ("": none)
COLLECTOR_ARGS_VAR = "VMRUN_PROVENANCE_ARGS"
CUT_MARK = b"# vmrun: the diff was cut here (too large)\n"
_CREDENTIALS = re.compile(r"(?<=://)[^/@]*@")


@dataclass(frozen=True)
class Code:
    """The code facts (run.json's `code`) and the uncommitted diff (b"" when clean)."""

    facts: dict[str, Any]
    patch: bytes = b""

    def host_env(self) -> dict[str, str]:
        """The variables that carry the diff to the host's record (none when clean)."""
        encoded = encode_patch(self.patch)
        return {PATCH_VAR: encoded} if encoded else {}


def code_of(
    project: Path, files: Sequence[str] | None = None, *, trainer: Path | None = None
) -> Code:
    """The project's git state and the hash of what is synced: `files` (the project's,
    relative), or the template `trainer` alone when the run is vmrun's template."""
    from vmrun.sync.files import project_files

    if trainer is not None:
        tree, count = tree_hash(trainer.parent, [trainer.name]), 1
    else:
        listed = list(files) if files is not None else project_files(project)
        tree, count = tree_hash(project, listed), len(listed)
    facts, patch = _git_state(project)
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


def _git(project: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(project), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "surrogateescape") if done.returncode == 0 else None


def _git_state(project: Path) -> tuple[dict[str, Any], bytes]:
    """Commit, branch, dirty, remote, untracked files and the diff against HEAD, of the
    project's folder in its repository (what is synced); {"git": False} outside one."""
    status = _git(project, "status", "--porcelain=v2", "--branch", "-z", "--", ".")
    if status is None:
        return {"git": False, "commit": None, "dirty": None}, b""
    head = branch = None
    changed = 0
    untracked: list[str] = []
    for entry in status.split("\0"):
        if entry.startswith("# branch.oid "):
            head = entry.split()[-1]
        elif entry.startswith("# branch.head "):
            branch = entry.split(" ", 2)[-1]
        elif entry.startswith("? "):
            untracked.append(entry[2:])
        elif entry[:2] in ("1 ", "2 ", "u "):
            changed += 1
    commit = head if head and head != "(initial)" else None
    prefix = (_git(project, "rev-parse", "--show-prefix") or "").strip().rstrip("/")
    untracked = [u[len(prefix) + 1 :] if prefix else u for u in untracked]  # as synced
    patch = b""
    if commit and changed:
        text = _git(project, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff", "--", ".")
        patch = (text or "").encode("utf-8", "surrogateescape")
    facts = {
        "git": True,
        "commit": commit,
        "branch": None if branch in (None, "(detached)") else branch,
        "dirty": bool(changed or untracked),
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
