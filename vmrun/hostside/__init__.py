"""Files that run on the hosts: POSIX `sh` scripts and stdlib-only Python, shipped in the
wheel and never imported by vmrun itself.

They are installed once per version of this package under `~/.vmrun/lib/<version>-<hash>/`
on each host (vmrun.ssh.hostlib: checked by hash in a connection's first command, re-sent
only when missing or changed) and run by path: `command("run_list.sh", ...)` is the argv
`sh ~/.vmrun/lib/<v>/run_list.sh ...`, every argument built from an argv and quoted in one
place (vmrun.ssh.quoting), so a host's `ps` shows the script's name, not its text. Keeping
them as files lets shellcheck (CI) read every line that runs on a host. `source(name)` is
the text, for what must travel whole (the installer itself, a Slurm batch script).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB_ROOT = ".vmrun/lib"  # vmrun.remote_paths.LIB_DIR (a test keeps the two equal)
SUFFIXES = (".sh", ".bash", ".py")
INTERPRETER = {".sh": "sh", ".bash": "bash", ".py": "python3"}

INLINE = "# vmrun-inline: "  # a line `# vmrun-inline: NAME` is replaced by NAME's text


class HostPath(str):
    """A path relative to the host user's home that a shell must see as absolute:
    vmrun.ssh.quoting writes it `"$HOME"/path`, so it holds whatever the command's cwd."""

    __slots__ = ()


@cache
def source(name: str) -> str:
    """The text of one host-side file, by its file name (`records_start.sh`, `netprobe.py`),
    with the files it inlines (code several scripts share, such as run_alive.sh's one rule
    for whether a run is alive, kept in one file that shellcheck reads too)."""
    path = HERE / name
    if path.parent != HERE or not path.is_file() or path.suffix not in SUFFIXES:
        raise FileNotFoundError(f"no host-side file {name!r} in {HERE}")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(
        source(line[len(INLINE) :].strip()) if line.startswith(INLINE) else line for line in lines
    )


@cache
def names() -> tuple[str, ...]:
    """Every host-side file, as installed (sorted)."""
    found = (p for p in HERE.iterdir() if p.suffix in SUFFIXES and not p.name.startswith("_"))
    return tuple(sorted(p.name for p in found if p.is_file()))


@cache
def manifest() -> str:
    """`sha256sum` lines (`HASH  NAME`) of the installed texts: what a host's copy is
    checked against (`sha256sum -c MANIFEST`)."""
    return "".join(f"{hashlib.sha256(source(n).encode()).hexdigest()}  {n}\n" for n in names())


def manifest_hash() -> str:
    return hashlib.sha256(manifest().encode()).hexdigest()


@cache
def lib_dir() -> str:
    """`.vmrun/lib/<version>-<12 hex of the manifest's hash>`, relative to the home: the
    hash makes a changed script a new folder even where the version string did not change
    (a development checkout), so no host ever runs a stale copy."""
    from vmrun import __version__

    return f"{LIB_ROOT}/{__version__}-{manifest_hash()[:12]}"


def path(name: str) -> HostPath:
    """Where the installed `name` lies on a host."""
    source(name)  # a name that is not a host-side file fails here, not on the host
    return HostPath(f"{lib_dir()}/{name}")


def folder() -> HostPath:
    """The folder itself, for a script that runs its siblings (run_start.sh)."""
    return HostPath(lib_dir())


def command(name: str, *args: str, python: str = "python3") -> list[str]:
    """The argv that runs host-side file `name` by path with `args` (its $1...; a `.py`
    under `python`, the host's interpreter)."""
    suffix = Path(name).suffix
    interpreter = python if suffix == ".py" else INTERPRETER[suffix]
    return [interpreter, path(name), *args]


def script_name(argv: tuple[str, ...] | list[str]) -> str | None:
    """The host-side file an argv from `command` runs (`run_list`), for messages."""
    if len(argv) > 1 and isinstance(argv[1], HostPath):
        return Path(argv[1]).stem
    return None
