"""The project directory goes to a per-project work directory on each host, incrementally.

What goes: `project_files` (git's own view in a git work tree, else a walk honouring
.gitignore files; then the defaults and `.vmrunignore`, see DEFAULT_IGNORES). Where:
`remote_workdir`, stable per local project. How: `sync_project`, with one of two engines:

- "rsync": `rsync -a --files-from=-` over OpenSSH with vmrun's exact connection settings
  (`openssh.ssh_options`: strict host keys, the same identities, ProxyJump...), when both
  ends have rsync. Its delta transfer sends only the changed blocks of a changed big file.
- "vmrun": `transfer_upload.upload` on the open connection: one listing round trip,
  size+mtime compare, one tar stream, SHA-256 on both ends, atomic renames. Needs nothing
  on the host but a POSIX shell, GNU find and tar.

Both compare size and mtime to the nanosecond (rsync gets `--modify-window=-1`; its default
compares whole seconds and misses a same-size edit within a second), both set mtimes, and
neither deletes a remote file that is not in the list: what a run wrote into the work
directory (results/, checkpoints) survives every sync.

`auto` is chosen by measurement (benchmarks/sync.py: NetnsBed host, 2 CPUs shared by both
ends, medians of 5 rounds; seconds, and x plain `rsync -a -e ssh`; vmrun rows include
project_files and reuse the open connection, as `vmrun train` does):

                             2,000 x 10 KiB tree           one 200 MiB file
                             first   same    one edit      first   same    1 MiB edited
    rsync -a -e ssh by hand  1.83 s  0.27 s  0.27 s        1.08 s  0.25 s  0.76 s
    rsync engine             1.05x   1.25x   1.30x         0.81x   1.07x   0.94x
    vmrun engine             1.15x   0.26x   0.35x         0.99x   0.07x   2.01x
    auto                     1.04x   0.21x   0.43x         0.94x   0.08x   1.24x

rsync pays a second SSH handshake and a process pair every time (~0.25 s here), even when
nothing changed; the vmrun engine answers "nothing changed" with one listing on the open
connection (0.21x rsync; 0.46x with a fresh connection), and sends a few changed files
faster too (probes: 1,000 new small files 0.40 s vs 0.68 s). rsync wins a first sync of
thousands of files (pipelined file list, no per-file hashing and renaming) and an edit of a
big file (delta transfer; the two are even at 32-64 MiB). So `auto` is a hybrid: the vmrun
engine's listing decides what differs; nothing -> done; then rsync sends the difference when
both ends have rsync and it is at least RSYNC_FILES files, RSYNC_BYTES bytes, or holds a
file of RSYNC_DELTA bytes that the host has another version of; else the vmrun engine does.
`VMRUN_SYNC_ENGINE=rsync|vmrun` forces one engine for the whole sync.
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vmrun.errors import (
    AuthError,
    ChangedHostKeyError,
    ConnectionLostError,
    HostKeyError,
    RemoteError,
    UnreachableError,
    UsageError,
    VmrunError,
)
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.ssh.result import Tail
from vmrun.sync import ignore
from vmrun.transfer.manifest import list_remote, normalize_remote, remote_arg, safe_rel
from vmrun.transfer.streams import capture
from vmrun.transfer.types import BIG_TRANSFER, Options, Progress

LARGE_FILE = 100 << 20
# auto sends changes with rsync from here on (benchmarks/sync.py; module docstring)
RSYNC_FILES = 1000  # changed files: rsync's pipelined file list beats per-file tar+hash+rename
RSYNC_BYTES = BIG_TRANSFER  # bytes: vmrun would start an `ssh` too, and hash everything twice
RSYNC_DELTA = 64 << 20  # one file this big that the host has another version of: delta transfer
ENGINES = ("auto", "rsync", "vmrun")
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


@dataclass
class SyncReport:
    host: str
    engine: str = ""  # "rsync" or "vmrun"
    files: int = 0  # total considered (the list given, or project_files)
    sent: int = 0  # files and symlinks written on the host
    sent_bytes: int = 0  # sizes of the files written
    unchanged: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


# -- what ------------------------------------------------------------------------------


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


# -- local classification --------------------------------------------------------------


@dataclass
class _Plan:
    regular: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)  # nanoseconds
    links: list[tuple[str, str]] = field(default_factory=list)  # (path, target)
    warnings: list[str] = field(default_factory=list)


def _link_inside(rel: str, target: str) -> bool:
    if not target or target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return joined != ".." and not joined.startswith("../")


def _classify(project: Path, files: Sequence[str]) -> _Plan:
    plan = _Plan()
    for rel in files:
        if not safe_rel(rel):
            plan.warnings.append(f"{rel!r}: not a path inside the project, skipped")
            continue
        path = project / rel
        try:
            st = os.lstat(path)
        except OSError:
            plan.warnings.append(f"{rel}: vanished before the sync, skipped")
            continue
        if stat.S_ISREG(st.st_mode):
            plan.regular.append(rel)
            plan.sizes[rel] = st.st_size
            plan.mtimes[rel] = st.st_mtime_ns
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            if _link_inside(rel, target):
                plan.links.append((rel, target))
            else:
                plan.warnings.append(
                    f"{rel}: symlink to {target!r} outside the project, skipped"
                    + (" (make it relative to sync it)" if target.startswith("/") else "")
                )
        # folders and sockets in a given list are not files to sync
    return plan


# -- the host side ---------------------------------------------------------------------

# sh -c PREPARE sh WORKDIR: make the work dir; print rsync's path and version if it has one.
_PREPARE = r"""mkdir -p -- "$1" || exit 3
PATH="$HOME/.vmrun/bin:$PATH"
r=$(command -v rsync 2>/dev/null) || exit 0
case $r in /*) printf '%s\n' "$r"; "$r" --version 2>/dev/null | head -n 1 ;; esac
exit 0
"""

# sh -c LINKS sh WORKDIR < "target\0path\0...": make each symlink unless it is already
# there; prints `L` per link made. ln to a temporary name, then mv -T: atomic.
_LINKS = r"""cd -- "$1" || exit 3
exec xargs -0 -n 2 sh -c '
t=$1 p=$2
if [ -L "$p" ] && [ "$(readlink -- "$p"; echo x)" = "$t
x" ]; then exit 0; fi
mkdir -p -- "$(dirname -- "$p")" && ln -sfn -- "$t" "$p.vmrun-link" &&
mv -f -T -- "$p.vmrun-link" "$p" && echo L' sh
"""


@dataclass(frozen=True)
class _HostRsync:
    path: str
    version: tuple[int, int, int]


def _version(text: str) -> tuple[int, int, int] | None:
    m = re.search(r"version\s+v?(\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _prepare(conn: Connection, workdir: str) -> _HostRsync | None:
    """One round trip: create the work dir, and learn whether (and which) rsync is there."""
    argv = ["sh", "-c", _PREPARE, "sh", remote_arg(workdir)]
    status, out, err = capture(conn, quoting.plain_command(argv), what="preparing the workdir")
    if status != 0:
        raise RemoteError(
            f"cannot create the work directory {workdir}: {err.strip() or f'exit {status}'}",
            host=conn.label,
            hint="check free space and permissions in the home directory on the host",
        )
    lines = os.fsdecode(out).splitlines()
    if len(lines) < 2:
        return None
    version = _version(lines[1])
    return _HostRsync(lines[0], version) if version else None


@functools.lru_cache(maxsize=1)
def _local_rsync() -> tuple[str, tuple[int, int, int]] | None:
    path = shutil.which("rsync")
    if path is None:
        return None
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    version = _version(out.splitlines()[0] if out else "")
    return (path, version) if version else None


# -- engine: vmrun (transfer_upload on the open connection) ----------------------------


def _make_links(conn: Connection, workdir: str, links: Sequence[tuple[str, str]]) -> int:
    """Create the symlinks that are not there yet, in one round trip; how many were made."""
    if not links:
        return 0
    data = b"".join(
        os.fsencode(target) + b"\0" + os.fsencode(remote_arg(rel)) + b"\0" for rel, target in links
    )
    argv = ["sh", "-c", _LINKS, "sh", remote_arg(workdir)]
    status, out, err = capture(conn, quoting.plain_command(argv), stdin=data, what="symlinks")
    if status != 0:
        raise RemoteError(f"creating symlinks on the host failed: {err.strip()}", host=conn.label)
    return out.count(b"L\n")


def _vmrun_send(
    conn: Connection,
    project: Path,
    workdir: str,
    files: Sequence[str],
    links: Sequence[tuple[str, str]],
    progress: Progress,
    report: SyncReport,
) -> None:
    from vmrun.transfer.upload import upload

    if files:
        up = upload(conn, project, workdir, Options(), progress, files=files)
        if up.failed:
            rel, why = next(iter(up.failed.items()))
            raise RemoteError(
                f"{len(up.failed)} file(s) failed verification on the host ({rel}: {why})",
                host=conn.label,
                hint="run the sync again",
            )
        report.sent += len(up.fetched)
        report.sent_bytes += up.fetched_bytes
        report.unchanged += up.unchanged
        _warn(report, progress, up.skipped + up.warnings)
    made = _make_links(conn, workdir, links)
    report.sent += made
    report.unchanged += len(links) - made


def _changed(conn: Connection, workdir: str, plan: _Plan) -> tuple[_Plan, int, int]:
    """One listing round trip: the part of `plan` that differs on the host (size or mtime of a
    file, target of a symlink), how many entries are the same, and the size of the biggest
    changed file the host has another version of (what rsync's delta transfer would save)."""
    root = list_remote(conn, [workdir]).roots[0]
    there = {e.rel: e for e in root.entries}
    todo, same, biggest_old = _Plan(), 0, 0
    for rel in plan.regular:
        entry = there.get(rel)
        size, mtime = plan.sizes[rel], plan.mtimes[rel]
        if entry is not None and entry.kind == "f":
            if entry.size == size and entry.mtime_ns == mtime:
                same += 1
                continue
            biggest_old = max(biggest_old, min(size, entry.size))
        todo.regular.append(rel)
        todo.sizes[rel], todo.mtimes[rel] = size, mtime
    for rel, target in plan.links:
        entry = there.get(rel)
        if entry is not None and entry.kind == "l" and entry.link == target:
            same += 1
        else:
            todo.links.append((rel, target))
    return todo, same, biggest_old


# -- engine: rsync over OpenSSH --------------------------------------------------------

_OUT_FORMAT = "vmrun:%i:%l:%n"
_PROGRESS2 = re.compile(rb"^\s*([\d,.]+)\s+\d+%")
_OCTAL = re.compile(rb"\\#([0-7]{3})")


def _rsync_word(word: str) -> str | None:
    """One word for rsync's `-e` string, which rsync splits on spaces itself: quotes group,
    a doubled quote inside quotes is that quote, backslashes are plain characters."""
    if "\0" in word:
        return None
    if word and not any(c in word for c in " '\""):
        return word
    return "'" + word.replace("'", "''") + "'"


@dataclass(frozen=True)
class _Rsync:
    argv: list[str]  # everything but the source and destination


def _rsync_command(conn: Connection, workdir: str, host: _HostRsync | None) -> _Rsync | str:
    """The rsync command for this connection, or why rsync cannot be used."""
    from vmrun.ssh.openssh import ssh_binary, ssh_options

    local = _local_rsync()
    if local is None:
        return "no rsync on this machine"
    if host is None:
        return "no rsync on the host"
    ssh = ssh_binary()
    if ssh is None:
        return "no OpenSSH `ssh` client on this machine"
    conn.open()
    target = conn.target
    assert target is not None
    try:
        words = [_rsync_word(w) for w in (ssh, *ssh_options(target, conn.settings))]
    except ValueError as exc:
        return str(exc)
    if any(w is None for w in words):
        return "an ssh option cannot be written in rsync's -e syntax"
    if target.hostname.startswith("-") or "\0" in workdir:
        return f"host name {target.hostname!r} cannot be given to rsync"
    path, version = local
    both = min(version, host.version)
    argv = [
        path, "-a", "--no-owner", "--no-group", "-8", "--from0", "--files-from=-",
        f"--out-format={_OUT_FORMAT}", f"--rsync-path={quoting.quote(host.path)}",
        "-e", " ".join(w for w in words if w is not None),
    ]  # fmt: skip
    if version >= (3, 1, 0):
        argv.append("--info=progress2")
    if both >= (3, 1, 3):
        argv.append("--modify-window=-1")  # compare nanoseconds, as the vmrun engine does
    if both >= (3, 0, 0):
        argv.append("--protect-args")
    elif not re.fullmatch(r"[A-Za-z0-9._/+=@%,-]+", workdir):
        return f"rsync {'.'.join(map(str, both))} cannot protect the path {workdir!r}"
    return _Rsync(argv)


def _unescape(name: bytes) -> str:
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m[1], 8)]), name))


class _RsyncOutput:
    """Turns rsync's stdout (--out-format lines, --info=progress2 updates) into Progress
    calls and counts; a file's line comes before its data, so it starts that file."""

    def __init__(self, label: str, progress: Progress):
        self.label = label
        self.progress = progress
        self.current: str | None = None
        self.sent = 0
        self.sent_bytes = 0
        self.moved = 0

    def line(self, raw: bytes) -> None:
        if raw.startswith(b"vmrun:"):
            parts = raw.split(b":", 3)
            if len(parts) != 4:
                return
            items, size, name = parts[1], parts[2], _unescape(parts[3])
            if len(items) < 2 or items[:1] not in (b"<", b">", b"c"):
                return  # "." is attributes only: nothing was written
            if items[1:2] == b"f":
                self.finish()
                nbytes = int(size.replace(b",", b"").replace(b".", b"") or 0)
                self.sent += 1
                self.sent_bytes += nbytes
                self.current = name
                self.progress.file_begin(self.label, name, nbytes, 0)
            elif items[1:2] == b"L":
                self.sent += 1
            return
        m = _PROGRESS2.match(raw)
        if m:
            total = int(m[1].replace(b",", b"").replace(b".", b""))
            if total > self.moved:
                self.progress.advance(self.label, total - self.moved)
                self.moved = total

    def finish(self, ok: bool = True) -> None:
        if self.current is not None:
            self.progress.file_end(self.label, self.current, ok)
            self.current = None


_SSH_UNREACHABLE = (
    "could not resolve hostname",
    "connection refused",
    "connection timed out",
    "no route to host",
    "network is unreachable",
    "kex_exchange_identification",
    "banner exchange",
    "connection closed by",
)
_SSH_LOST = ("timeout, server", "not responding", "broken pipe", "connection reset")


def _rsync_error(status: int, err: str, label: str) -> VmrunError:
    """rsync's exit status and stderr as the vmrun error a user can act on."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    low = err.lower()
    detail = next((ln for ln in lines if not ln.startswith("rsync error:")), "") or (
        lines[-1] if lines else f"exit status {status}"
    )
    if "remote host identification has changed" in low:
        return ChangedHostKeyError(
            "rsync's ssh refused the host: its HOST KEY CHANGED",
            host=label,
            hint="this can mean an attack; see `vmrun exec -H HOST -- true` for the fingerprints",
        )
    if "host key verification failed" in low:
        return HostKeyError(
            "rsync's ssh refused the host key (not in known_hosts)",
            host=label,
            hint="connect once with --accept-new-host-key, or add the key to ~/.ssh/known_hosts",
        )
    if "permission denied (" in low:
        return AuthError(f"rsync's ssh could not log in: {detail}", host=label)
    if status == 127 or "rsync: command not found" in low or "rsync: not found" in low:
        return RemoteError(
            "rsync is missing on the host", host=label, hint="VMRUN_SYNC_ENGINE=vmrun"
        )
    if any(s in low for s in _SSH_UNREACHABLE):
        return UnreachableError(f"rsync cannot reach the host: {detail}", host=label)
    if any(s in low for s in _SSH_LOST):
        return ConnectionLostError(f"the sync's connection dropped: {detail}", host=label)
    if "0 bytes received so far" in low:  # ssh (or a ProxyCommand) died before rsync spoke
        return UnreachableError(f"rsync cannot reach the host: {detail}", host=label)
    if status in (12, 255) and "connection unexpectedly closed" in low:
        return ConnectionLostError(f"the sync's connection dropped: {detail}", host=label)
    return RemoteError(f"rsync failed (exit {status}): {detail}", host=label)


def _rsync_send(
    conn: Connection,
    project: Path,
    workdir: str,
    command: _Rsync,
    entries: Sequence[str],
    progress: Progress,
    report: SyncReport,
) -> None:
    """Run rsync for `entries` (files and symlinks); count what it wrote."""
    target = conn.target
    assert target is not None
    host = f"[{target.hostname}]" if ":" in target.hostname else target.hostname
    argv = [*command.argv, "--", str(project) + "/", f"{host}:{workdir.rstrip('/')}/"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSYNC_")}
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its ssh child is in its group: both stop together
    )
    output = _RsyncOutput(conn.label, progress)
    err = Tail(16 * 1024)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

    def feed() -> None:
        with contextlib.suppress(OSError):
            stdin.write(b"".join(os.fsencode(e) + b"\0" for e in entries))
        with contextlib.suppress(OSError):
            stdin.close()

    def drain() -> None:
        while data := stderr.read1(65536):  # type: ignore[attr-defined]  # a BufferedReader
            err.feed(data)

    helpers = [threading.Thread(target=f, daemon=True) for f in (feed, drain)]
    for t in helpers:
        t.start()
    try:
        buf = b""
        while chunk := stdout.read1(65536):  # type: ignore[attr-defined]  # a BufferedReader
            *lines, buf = re.split(rb"[\r\n]", buf + chunk)
            for line in lines:
                output.line(line)
        output.line(buf)
        status = proc.wait()
    finally:
        if proc.poll() is None:
            _stop(proc)
        for t in helpers:
            t.join(timeout=5)
        stdout.close()
        stderr.close()
    output.finish(ok=status in (0, 24))
    if status not in (0, 24):  # 24: a file vanished before it could be sent
        raise _rsync_error(status, err.text(), conn.label)
    if status == 24:
        vanished = [ln for ln in err.text().splitlines() if "vanished" in ln]
        _warn(report, progress, vanished or ["some files vanished before they could be sent"])
    report.sent += output.sent
    report.sent_bytes += output.sent_bytes
    report.unchanged += len(entries) - output.sent


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop rsync and its ssh child (their own process group, led by rsync's pid)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


# -- the entry point -------------------------------------------------------------------


def _warn(report: SyncReport, progress: Progress, texts: Sequence[str]) -> None:
    for text in texts:
        report.warnings.append(text)
        progress.warn(report.host, text)


def _wanted(engine: str) -> str:
    if engine == "auto":
        engine = os.environ.get("VMRUN_SYNC_ENGINE", "").strip().lower() or "auto"
    if engine not in ENGINES:
        raise UsageError(
            f"unknown sync engine {engine!r}", hint="VMRUN_SYNC_ENGINE is rsync or vmrun"
        )
    return engine


def sync_project(
    conn: Connection,
    project: Path,
    workdir: str,
    *,
    files: list[str] | None = None,
    engine: str = "auto",
    progress: Progress | None = None,
) -> SyncReport:
    """Make workdir on the host hold the project's files (never deletes remote files that
    are not in the list: outputs a previous run wrote there must survive).

    `engine`: "auto" (see the module docstring), "rsync" or "vmrun"; with "auto",
    VMRUN_SYNC_ENGINE decides when set.
    """
    started = time.monotonic()
    progress = progress or Progress()
    project = Path(os.path.abspath(project))
    workdir = normalize_remote(workdir)  # `~/x` is `x`; `../x` is refused
    wanted = _wanted(engine)
    if files is None:
        files = project_files(project)
    plan = _classify(project, files)
    report = SyncReport(host=conn.label, files=len(files))
    _warn(report, progress, plan.warnings)
    host_rsync = _prepare(conn, workdir)
    rsync: _Rsync | str = "not wanted"
    if wanted != "vmrun":
        rsync = _rsync_command(conn, workdir, host_rsync)
        if wanted == "rsync" and isinstance(rsync, str):
            raise UsageError(
                f"the rsync engine was asked for, but {rsync}",
                host=conn.label,
                hint="VMRUN_SYNC_ENGINE=vmrun needs nothing but SSH",
            )
    if wanted == "rsync":
        assert isinstance(rsync, _Rsync)
        report.engine = "rsync"
        everything = sorted([*plan.regular, *(rel for rel, _ in plan.links)])
        progress.begin(conn.label, len(everything), sum(plan.sizes.values()))
        _rsync_send(conn, project, workdir, rsync, everything, progress, report)
    elif wanted == "vmrun":
        report.engine = "vmrun"
        _vmrun_send(conn, project, workdir, plan.regular, plan.links, progress, report)
    else:
        todo, same, biggest_old = _changed(conn, workdir, plan)
        report.unchanged += same
        nbytes = sum(todo.sizes.values())
        if isinstance(rsync, _Rsync) and (
            len(todo.regular) >= RSYNC_FILES or nbytes >= RSYNC_BYTES or biggest_old >= RSYNC_DELTA
        ):
            report.engine = "rsync"
            entries = sorted([*todo.regular, *(rel for rel, _ in todo.links)])
            progress.begin(conn.label, len(entries), nbytes)
            _rsync_send(conn, project, workdir, rsync, entries, progress, report)
        else:
            report.engine = "vmrun"
            _vmrun_send(conn, project, workdir, todo.regular, todo.links, progress, report)
    report.seconds = time.monotonic() - started
    return report
