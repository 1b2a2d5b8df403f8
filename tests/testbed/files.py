"""Writing the bed's files and directories (modes set, safe against concurrent beds)."""

from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def mkdir_shared(path: Path, mode: int = 0o755) -> None:
    """mkdir -p that survives a concurrent bed rmdir'ing an (empty) shared parent."""
    for _ in range(20):
        try:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    path.mkdir(mode=mode, parents=True, exist_ok=True)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def listdir(path: Path) -> list[str]:
    """Entry names of ``path``; [] when it does not exist (or cannot be read)."""
    try:
        return os.listdir(path)
    except OSError:
        return []
