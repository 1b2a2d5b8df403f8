"""Rootless podman on test hosts: each host's user runs Debian's ``podman`` itself (no
daemon), pulling from the Docker bed's registry (tests/testbed/docker.py) over http.

What podman needs here, and why (found by running it on this kind of machine):

* ``runc``, not ``crun``: crun 1.8 refuses this machine's hybrid cgroup layout ("cgroups
  in hybrid mode not supported, drop all controllers from cgroupv2"), and with
  ``--cgroups=disabled`` it finds no cgroup filesystem ("invalid file system type on
  '/sys/fs/cgroup'"); runc with ``--cgroups=disabled`` is refused by podman ("not
  compatible with NoCgroups"). So runc, set in the user's ``containers.conf``.
* the cgroup hierarchies mounted inside the host: ``ip netns exec`` remounts /sys, which
  hides /sys/fs/cgroup, and runc then fails ("no cgroup mount found in mountinfo"). The
  host's ``prelude`` mounts them again before its sshd and its commands, in the mount
  namespace ``ip netns exec`` made (nothing outside changes); a rootless runc on cgroup v1
  creates no cgroup there (it may not write), so none is left behind.
* storage driver ``overlay``: the kernel's own overlayfs, which an unprivileged user may
  mount in its user namespace (Linux 5.13 and later); ``fuse-overlayfs`` cannot open
  /dev/fuse here (root's only: "fuse: failed to open /dev/fuse: Permission denied").
* ``registries.conf`` marks the bed's registry ``insecure`` (plain http).
* the subordinate ids ``useradd`` gives each host's user (/etc/subuid, /etc/subgid) and
  ``newuidmap`` (Debian's uidmap) make the user namespace.

Everything is in the user's own ~/.config/containers; the machine's /etc is not touched.
Podman keeps a pause process per user (the user namespace's holder) and a ``conmon`` per
container; close() removes the containers, kills what is left of the user's processes by
pid, and removes podman's folders in /tmp (``podman-run-UID``, ``containers-user-UID``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .cgroups import cgroup_mount_script
from .errors import TestbedError
from .files import mkdir_shared, write_text
from .procs import kill_until_gone
from .testhost import TestHost
from .tools import _which

PODMAN = _which("podman", "/usr/bin/podman")
RUNC = _which("runc", "/usr/sbin/runc")
NEWUIDMAP = _which("newuidmap", "/usr/bin/newuidmap")
CATATONIT = "/usr/libexec/podman/catatonit"  # podman's --init (Debian's catatonit)

CONTAINERS_CONF = """\
[engine]
# runc: crun 1.8 cannot run containers on this machine (hybrid cgroups)
runtime = "runc"
"""
STORAGE_CONF = """\
[storage]
# the kernel's overlayfs, unprivileged; fuse-overlayfs cannot open /dev/fuse here
driver = "overlay"
"""


def skip_reason_no_podman() -> str | None:
    """Why rootless podman cannot run on the test hosts here, or None."""
    if os.geteuid() != 0:
        return "needs root"
    for exe in (PODMAN, RUNC, NEWUIDMAP, CATATONIT):
        if not os.access(exe, os.X_OK):
            return f"{exe} missing (apt-get install podman uidmap catatonit)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    with contextlib.suppress(OSError):
        if int(Path("/proc/sys/user/max_user_namespaces").read_text()) == 0:
            return "user namespaces are disabled (user.max_user_namespaces = 0)"
    return None


class PodmanHost:
    """``host``'s user set up for rootless podman pulling from ``insecure_registries``
    ("addr:port", plain http). Restarts the host's sshd (with the cgroup mounts)."""

    def __init__(self, host: TestHost, *, insecure_registries: Sequence[str] = ()) -> None:
        self.host = host
        self._closed = False
        host.prelude = cgroup_mount_script()
        host.restart_sshd()
        conf = host.home / ".config" / "containers"
        registries = "".join(
            f'[[registry]]\nlocation = "{r}"\ninsecure = true\n\n' for r in insecure_registries
        )
        for name, text in (
            ("containers.conf", CONTAINERS_CONF),
            ("storage.conf", STORAGE_CONF),
            ("registries.conf", registries),
        ):
            mkdir_shared(conf)
            write_text(conf / name, text)
        for path in (host.home / ".config", conf, *conf.iterdir()):
            os.chown(path, host.uid, host.gid)

    def __repr__(self) -> str:
        return f"PodmanHost({self.host.name!r})"

    def podman(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The user's podman inside the host."""
        proc = self.host.run([PODMAN, *args], as_user=True, check=False, timeout=timeout, text=True)
        if check and proc.returncode != 0:
            raise TestbedError(
                f"podman {' '.join(args)} on {self.host.name} failed (rc={proc.returncode}):\n"
                f"{proc.stderr.strip()}"
            )
        return proc

    def containers(self) -> list[str]:
        """Ids of every container the user has (running or not): ``podman ps -aq``."""
        return self.podman("ps", "-aq", "--no-trunc").stdout.split()

    def images(self) -> list[str]:
        out = self.podman("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        return out.split()

    def tmp_dirs(self) -> list[Path]:
        uid = self.host.uid
        return [Path(f"/tmp/podman-run-{uid}"), Path(f"/tmp/containers-user-{uid}")]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.podman("rm", "-af", "-t", "0", timeout=60, check=False)
        kill_until_gone(self.host.user_pids)  # the pause process, conmons
        for d in self.tmp_dirs():
            shutil.rmtree(d, ignore_errors=True)
        for d in (
            self.host.home / ".config" / "containers",
            self.host.home / ".local" / "share" / "containers",
        ):
            shutil.rmtree(d, ignore_errors=True)

    def __enter__(self) -> PodmanHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
