"""Files that run on the hosts: POSIX `sh` scripts and stdlib-only Python, shipped in the
wheel and never imported by vmrun itself.

The code that needs one reads it with `source("name.sh")` and sends it as the program of
`sh -c SOURCE NAME ARGS...` (or `python -c SOURCE ARGS...`), every argument built from an
argv and quoted in one place (vmrun.ssh.quoting). Keeping them as files lets shellcheck
(CI) read every line that runs on a host.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent


@cache
def source(name: str) -> str:
    """The text of one host-side file, by its file name (`records_start.sh`, `netprobe.py`)."""
    path = HERE / name
    if path.parent != HERE or not path.is_file():
        raise FileNotFoundError(f"no host-side file {name!r} in {HERE}")
    return path.read_text(encoding="utf-8")
