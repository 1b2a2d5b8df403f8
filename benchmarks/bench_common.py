"""What the benchmarks share: command-line sizes, a user's side of the test bed."""

from __future__ import annotations

import os
from pathlib import Path


def parse_size(text: str) -> int:
    """`1G`, `200M`, `64KiB`, `1000`: bytes (K, M, G are powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text[-1:] in units else ""
    return int(float(text[: len(text) - len(unit)]) * units[unit])


def client_dirs(bed: object, tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    """A user's side for a NetnsBed: a home whose ssh config and known_hosts reach the bed's
    hosts, a project directory, and the environment the real CLI runs with there."""
    home, cwd = tmp / "home", tmp / "project"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    cwd.mkdir()
    (home / ".ssh" / "config").write_text(bed.ssh_config_text())  # type: ignore[attr-defined]
    (home / ".ssh" / "known_hosts").write_text(bed.known_hosts_text())  # type: ignore[attr-defined]
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "LANG": "C.UTF-8",
    }
    return home, cwd, env
