"""A sync's local side and its outcome: the files and symlinks to send, classified once.

Shared by both engines (vmrun.sync.engine, vmrun.sync.rsync) and the orchestration in
vmrun.sync.project.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vmrun.transfer.manifest import links_inside, safe_rel
from vmrun.transfer.types import Progress


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


def warn(report: SyncReport, progress: Progress, texts: Sequence[str]) -> None:
    for text in texts:
        report.warnings.append(text)
        progress.warn(report.host, text)


@dataclass
class Plan:
    regular: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)  # nanoseconds
    links: list[tuple[str, str]] = field(default_factory=list)  # (path, target)
    warnings: list[str] = field(default_factory=list)


def classify(project: Path, files: Sequence[str]) -> Plan:
    plan = Plan()
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
            plan.links.append((rel, os.readlink(path)))
        # folders and sockets in a given list are not files to sync
    inside = links_inside(dict(plan.links))  # resolved through each other, as the host will
    for rel, target in plan.links:
        if rel not in inside:
            plan.warnings.append(
                f"{rel}: symlink to {target!r} outside the project, skipped"
                + (" (make it relative to sync it)" if target.startswith("/") else "")
            )
    plan.links = [(rel, target) for rel, target in plan.links if rel in inside]
    return plan
