"""vmrun's host-side files, installed on a host once per version and run by path.

A connection's first command travels under a small guard (vmrun/hostside/lib_guard.sh) in
the same round trip: if `~/.vmrun/lib/<version>-<hash>/` holds this vmrun's files (each
checked by sha256 against a MANIFEST whose own hash is in the folder's name), the command
runs; else the guard runs nothing and names the stale files, which are sent in one more
round trip (lib_install.sh: a temporary file, then a rename; user-only permissions) before
the command is sent again. A connection remembers that its host's copy is in place, so
later commands pay nothing. The guard and the installer are the two scripts that must
travel as text: they run before the folder can be trusted.
"""

from __future__ import annotations

import functools

from vmrun.hostside import lib_dir, manifest, manifest_hash, names, source
from vmrun.ssh import quoting

STALE_EXIT = 97  # lib_guard.sh ran nothing: files are missing or changed
STALE_MARK = "vmrun-lib-stale"


def _bare(name: str) -> str:
    """A script's text without its comment lines: what travels on every first command."""
    return "".join(ln for ln in source(name).splitlines(True) if not ln.lstrip().startswith("#"))


def guard(command: str) -> str:
    """`command` (a command line for the host's login shell, quoted for sh) under the
    guard that runs it only if this vmrun's host-side files are in place."""
    return "exec /bin/sh -c " + quoting.join(
        [_bare("lib_guard.sh"), "vmrun-lib", lib_dir(), manifest_hash(), command]
    )


def stale(status: int, stderr: str) -> list[str] | None:
    """The files a guarded command found stale (all of them for `*`), or None if it ran."""
    if status != STALE_EXIT or not stderr.startswith(STALE_MARK):
        return None
    told = stderr.splitlines()[0].split()[1:]
    known = set(names())
    return sorted(known) if "*" in told or not set(told) <= known else sorted(set(told))


def install_command() -> str:
    """The command that places the files its stdin holds (lib_install.sh; `bundle`)."""
    return "exec /bin/sh -c " + quoting.join(
        [_bare("lib_install.sh"), "vmrun-lib-install", lib_dir()]
    )


def bundle(files: list[str]) -> bytes:
    """A gzipped tar of `files` (their installed texts) and the MANIFEST, mode 0600; made
    once per set of files (each host of a first fan-out needs the same one)."""
    return _bundle(tuple(files), manifest_hash())


@functools.lru_cache(maxsize=8)
def _bundle(files: tuple[str, ...], version: str) -> bytes:
    del version  # (part of the key: the files' texts, as the MANIFEST's hash names them)
    import io
    import tarfile  # only for an install: not on every command's path

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.USTAR_FORMAT) as tar:
        for name, text in [*((n, source(n)) for n in files), ("MANIFEST", manifest())]:
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
