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


INLINE = "# vmrun-inline: "  # a line `# vmrun-inline: NAME` is replaced by NAME's text


@cache
def source(name: str) -> str:
    """The text of one host-side file, by its file name (`records_start.sh`, `netprobe.py`),
    with the files it inlines (code several scripts share, such as run_alive.sh's one rule
    for whether a run is alive, kept in one file that shellcheck reads too)."""
    path = HERE / name
    if path.parent != HERE or not path.is_file():
        raise FileNotFoundError(f"no host-side file {name!r} in {HERE}")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(
        source(line[len(INLINE) :].strip()) if line.startswith(INLINE) else line for line in lines
    )
