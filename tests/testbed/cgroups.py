"""cgroups for the bed's dockerds: the machine's hierarchies mounted again inside a host
(``ip netns exec`` remounts /sys, which hides /sys/fs/cgroup), and removing the cgroups
named after a bed's prefix (the daemons' cgroup parents ``/<prefix>-<host>-docker``)."""

from __future__ import annotations

import os
from pathlib import Path


def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """(fstype, mount point, options) of this mount namespace's /sys/fs/cgroup mounts."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = left.split()[4]
        fstype, _source, superopts = right.split()[:3]
        if point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/"):
            found.append((fstype, point, superopts))
    return found


def cgroup_mount_script() -> str:
    """sh that mounts this machine's cgroup hierarchies again (after ``ip netns exec``
    hid them), then execs its arguments."""
    lines = ["set -e"]
    for fstype, point, opts in _cgroup_mounts():
        if fstype == "tmpfs":
            lines.append(f"mount -t tmpfs -o mode=755 cgroup {point}")
        elif fstype == "cgroup2":
            lines.append(f"mkdir -p {point} && mount -t cgroup2 cgroup2 {point}")
        elif fstype == "cgroup":
            wanted = [o for o in opts.split(",") if o not in ("rw", "ro")]
            if not any(not o.startswith("name=") for o in wanted):
                wanted.insert(0, "none")  # a named hierarchy without controllers
            lines.append(
                f"mkdir -p {point} && mount -t cgroup -o {','.join(wanted)} cgroup {point}"
            )
    lines.append('exec "$@"')
    return "\n".join(lines)


def _cgroup_roots() -> list[Path]:
    """Mount points of the cgroup hierarchies (v1 controllers, named ones, cgroup2)."""
    return [Path(p) for fstype, p, _ in _cgroup_mounts() if fstype in ("cgroup", "cgroup2")]


def remove_cgroup_tree(name: str) -> list[str]:
    """rmdir /sys/fs/cgroup/*/<name> bottom-up; returns what could not be removed."""
    left = []
    for root in _cgroup_roots():
        top = root / name.lstrip("/")
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
    return left


def top_cgroups() -> list[str]:
    """Names of the top-level cgroups of every hierarchy."""
    found: set[str] = set()
    for root in _cgroup_roots():
        try:
            found |= {n for n in os.listdir(root) if (root / n).is_dir()}
        except OSError:
            continue
    return sorted(found)


def prefix_cgroups(prefix: str) -> list[str]:
    """Top-level cgroups (in any hierarchy) named ``<prefix>-...``."""
    return [n for n in top_cgroups() if n.startswith(prefix + "-")]
