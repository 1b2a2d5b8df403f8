"""What is on the host, in one round trip: a listing with size, mtime, mode and type.

The host may lack Python, so the listing is GNU `find -printf` with NUL separators (every
byte of a name survives: spaces, quotes, newlines, a leading `-`, any encoding), and
checksums come from `openssl dgst` (SHA-NI: 1.4 GB/s here) or coreutils `sha256sum`
(240 MB/s) when openssl is missing. Paths are bytes on the host and `os.fsdecode`d strings
here (surrogateescape), so they round-trip exactly.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection
from vmrun.transfer.streams import capture

PART_SUFFIX = ".vmrun-part"


@dataclass(frozen=True)
class Entry:
    """One thing under a remote root; `rel` is "" for the root itself."""

    rel: str
    kind: str  # "f" file, "d" directory, "l" symlink
    size: int
    mtime_ns: int
    mode: int
    link: str = ""


@dataclass
class RootListing:
    root: str  # the remote path as listed (normalised, `./x` or `/x`)
    state: str  # "ok", "missing", "dangling", "error"
    entries: list[Entry]


@dataclass
class Listing:
    remote_now: int  # the host's clock, seconds since the epoch
    roots: list[RootListing]
    warnings: list[str]


def remote_arg(path: str) -> str:
    """A remote path as a command argument: never starts with `-` (`./x` or `/x`)."""
    if path.startswith("/"):
        return path
    return "./" + path if path not in ("", ".") else "."


def normalize_remote(path: str, *, base: str = "", where: str = "the run directory") -> str:
    """Join `path` to `base` (both remote, relative to the home unless absolute; `~/x` is in
    the home whatever the base) and refuse relative paths that climb out of `base` with
    `..` (`where` names the base in that message)."""
    if "\x00" in path:
        raise UsageError(f"remote path {path!r} contains a NUL byte")
    if path.startswith("~/") or path == "~":
        path, base = path[2:], ""
    if path.startswith("/"):
        return posixpath.normpath(path)
    base_norm = posixpath.normpath(base) if base else "."
    joined = posixpath.normpath(posixpath.join(base_norm, path))
    if base_norm == ".":
        inside = not (joined == ".." or joined.startswith("../"))
    else:
        inside = joined == base_norm or joined.startswith(base_norm.rstrip("/") + "/")
    if not inside:
        where = where if base else "the home directory"
        raise UsageError(
            f"remote path {path!r} is outside {where}; give an absolute path to fetch from"
            " elsewhere"
        )
    return joined


def join_remote(root: str, rel: str) -> str:
    """The remote path of `rel` under `root` (both as in a Listing)."""
    if not rel:
        return root
    if root in ("", "."):
        return rel
    return root.rstrip("/") + "/" + rel


def safe_rel(rel: str) -> bool:
    """True for a relative path that stays inside its root (what the host sent is checked)."""
    if not rel:
        return True
    if rel.startswith("/") or "\x00" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def links_inside(links: Mapping[str, str]) -> set[str]:
    """Which symlinks of one root (rel -> target) stay inside it, each resolved as the OS
    would, through the others: `a -> .` and `b -> a/..` put `b` at the root's parent, though
    `a/..` reads as inside. A link that climbs out at any step, or loops, is left out."""
    memo: dict[str, tuple[str, ...] | None] = {}

    def resolve(rel: str) -> tuple[str, ...] | None:
        """Where the link at `rel` leads, as components under the root; None: outside."""
        if rel in memo:
            return memo[rel]
        memo[rel] = None  # while being resolved: a loop leads nowhere
        target = links[rel]
        at: tuple[str, ...] | None = tuple(rel.split("/")[:-1])
        if not target or target.startswith("/"):
            at = None
        for part in target.split("/"):
            if at is None:
                break
            if part in ("", "."):
                continue
            if part == "..":
                at = at[:-1] if at else None
                continue
            at = (*at, part)
            if "/".join(at) in links:
                at = resolve("/".join(at))
        memo[rel] = at
        return at

    return {rel for rel in links if rel and resolve(rel) is not None}


def _mtime_ns(text: str) -> int:
    """`find %T@` text (`1700000000.1234567890`) to integer nanoseconds, exactly."""
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("-").partition(".")
    return sign * (int(whole or 0) * 1_000_000_000 + int((frac + "000000000")[:9]))


def list_remote(conn: Connection, roots: Sequence[str]) -> Listing:
    """One round trip: every root's entries (files, dirs, symlinks), and the host's clock."""
    argv = hostside.command("transfer_list.sh", *(remote_arg(r) for r in roots))
    status, out, err = capture(conn, quoting.plain_command(argv), what="the remote listing")
    fields = out.split(b"\0")
    if not fields or fields[0] != b"T":
        raise RemoteError(
            f"listing files failed (exit {status}): {err.strip() or 'no output'}",
            host=conn.label,
            hint="vmrun needs a POSIX shell and GNU find (findutils) on the host",
        )
    now = int(fields[1] or 0)
    i = 2
    listing = Listing(remote_now=now, roots=[], warnings=[])
    current: RootListing | None = None
    while i < len(fields) - 1:
        tag = fields[i]
        if tag == b"R":
            current = RootListing(root=os.fsdecode(fields[i + 1]), state="ok", entries=[])
            listing.roots.append(current)
            i += 2
            continue
        assert current is not None
        if tag in (b"M", b"L", b"X"):
            current.state = {b"M": "missing", b"L": "dangling", b"X": "error"}[tag]
            i += 1
            continue
        kind, size, mtime, mode, rel, link = fields[i : i + 6]
        i += 6
        current.entries.append(
            Entry(
                rel=os.fsdecode(rel),
                kind=kind.decode("ascii", "replace"),
                size=int(size),
                mtime_ns=_mtime_ns(mtime.decode("ascii")),
                mode=int(mode, 8),
                link=os.fsdecode(link),
            )
        )
    for line in err.splitlines():
        if "-printf" in line or "unknown predicate" in line:
            raise RemoteError(
                f"the host's find has no -printf: {line.strip()}",
                host=conn.label,
                hint="install GNU findutils on the host",
            )
        if line.strip():
            listing.warnings.append(line.strip())
    for root in listing.roots:
        if root.state == "error" and root.entries:
            root.state = "ok"  # find listed what it could; its complaints are in warnings
    return listing


def hash_command() -> str:
    return quoting.plain_command(hostside.command("transfer_hash.sh"))


def hash_input(paths: Iterable[str]) -> bytes:
    return b"".join(os.fsencode(remote_arg(p)) + b"\0" for p in paths)


def _unescape(name: str) -> str:
    out = []
    chars = iter(name)
    for c in chars:
        if c == "\\":
            nxt = next(chars, "")
            out.append({"n": "\n", "r": "\r", "\\": "\\"}.get(nxt, "\\" + nxt))
        else:
            out.append(c)
    return "".join(out)


def parse_hashes(output: bytes, paths: Sequence[str]) -> dict[str, str]:
    """Map each of `paths` to its hex SHA-256 from `sha256sum`/`openssl dgst -r` output.

    Lines come in argument order, one per file that could be read; a file that vanished has
    no line, so each line is matched to the next path of the same name.
    """
    found: dict[str, str] = {}
    wanted = [remote_arg(p) for p in paths]
    pos = 0
    for raw in output.split(b"\n"):
        if not raw:
            continue
        line = os.fsdecode(raw)
        escaped = line.startswith("\\")
        if escaped:
            line = line[1:]
        digest, name = line[:64], line[66:]
        if escaped:
            name = _unescape(name)
        for j in range(pos, len(wanted)):
            if wanted[j] == name:
                found[paths[j]] = digest.lower()
                pos = j + 1
                break
    return found


def remote_hashes(conn: Connection, paths: Sequence[str]) -> dict[str, str]:
    """SHA-256 of each remote path (those that could not be read are absent)."""
    if not paths:
        return {}
    _status, out, _err = capture(
        conn, hash_command(), stdin=hash_input(paths), what="checksums on the host"
    )
    return parse_hashes(out, paths)


# -- local side ------------------------------------------------------------------------


def part_name(name: str, size: int, mtime_ns: int) -> str:
    """The temporary name of `name` while it arrives: it carries the remote file's identity
    (size, mtime), so a later run resumes only a partial copy of the same version."""
    token = f"{size:x}-{mtime_ns & (2**64 - 1):x}"
    candidate = f".{name}.{token}{PART_SUFFIX}"
    if len(os.fsencode(candidate)) <= 255:
        return candidate
    import hashlib

    short = hashlib.sha256(os.fsencode(name)).hexdigest()[:24]
    return f".vmrun-{short}.{token}{PART_SUFFIX}"


def part_owner(part: str) -> tuple[str, str] | None:
    """(name-or-key, token) of a temporary file made by `part_name`, else None."""
    if not (part.startswith(".") and part.endswith(PART_SUFFIX)):
        return None
    stem = part[1 : -len(PART_SUFFIX)]
    name, dot, token = stem.rpartition(".")
    if not dot or "-" not in token:
        return None
    return name, token
