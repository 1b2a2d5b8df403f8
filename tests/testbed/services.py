"""Service hosts: bed hosts that are VMs to `vmrun setup --slurm` (a Slurm made by vmrun).

A VM runs Slurm's and munge's daemons as the distribution ships them: as root, from its own
``/etc/slurm``, ``/etc/munge``, ``/var/lib/*``, ``/var/log/*`` and ``/run``, started by its
init system.  Bed hosts share the machine's filesystem, so a service host gets:

* **root**: it is reached as root over SSH (``PermitRootLogin prohibit-password``); root's
  ``/root`` is the host's own home.  (A VM's user would run ``sudo -n``: this machine has no
  sudo, and vmrun runs the same scripts with an empty prefix as root.)
* **its own system folders**: each of :data:`PRIVATE` is a folder of the host's, bound over
  the machine's in the host's mount namespace (the prelude, before its sshd and each of its
  commands), made with the machine's owner and mode and empty, as on a fresh VM where the
  packages are installed but nothing is configured.  The machine's own are never written.
* **STAND-IN for systemd**: ``systemctl_standin.sh`` bound over ``/usr/bin/systemctl``, and
  ``/run/systemd/system`` (what tells a script that systemd runs).  No init system runs in a
  network namespace; the stand-in runs the units' own argv (munged as ``munge``,
  ``slurmctld -D``, ``slurmd -D``) in the background and stops them by pid.  The daemons
  themselves are Debian's ``slurm-wlm`` and ``munge``, real.

Every process runs in the host's network namespace, so the bed's close() kills them by pid
with the rest; a host's system folders go with the bed's prefix folder.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from .netns import NetnsBed
from .testhost import TestHost

DATABASE = "/var/lib/mysql"  # MariaDB's data, a host's own where it runs one (slurmdbd)
PRIVATE = (
    "/run",
    "/etc/slurm",
    "/etc/munge",
    "/var/lib/slurm",
    "/var/log/slurm",
    "/var/lib/munge",
    "/var/log/munge",
)
STANDIN = Path(__file__).with_name("systemctl_standin.sh")
SYSTEMCTL = "/usr/bin/systemctl"


def skip_reason_no_service_hosts() -> str | None:
    """Why service hosts cannot be made here (a pytest skip reason), or None."""
    from .slurmconf import skip_reason_no_slurm

    if reason := skip_reason_no_slurm():
        return reason
    for path in (*PRIVATE[1:], SYSTEMCTL):
        if not os.path.exists(path):
            return f"service hosts need {path} (apt-get install slurm-wlm munge systemd)"
    try:
        with open("/etc/shadow") as shadow:
            locked = any(line.startswith("root:!") for line in shadow)
    except OSError:
        locked = True
    if locked:  # sshd without PAM refuses a locked account, keys or not
        return "root's password field is locked ('!'): sshd would refuse root's key"
    return None


def system_dir(bed: NetnsBed, name: str) -> Path:
    """Where host ``name``'s own system folders are (``run``, ``etc_slurm`` ...)."""
    return bed.home_root / bed.prefix / f"{name}.sys"


def private_dir(bed: NetnsBed, name: str, target: str) -> Path:
    """The host's own folder that is ``target`` (one of PRIVATE) inside it."""
    return system_dir(bed, name) / target.strip("/").replace("/", "_")


def skip_reason_no_accounting() -> str | None:
    """Why a service host cannot run slurmdbd and MariaDB here, or None."""
    for path in (
        "/usr/sbin/slurmdbd",
        "/usr/sbin/mariadbd",
        "/usr/bin/mariadb-install-db",
        DATABASE,
    ):
        if not os.path.exists(path):
            return f"accounting needs {path} (apt-get install slurmdbd mariadb-server)"
    return None


def add_service_host(
    bed: NetnsBed, name: str, *, database: bool = False, **kwargs: object
) -> TestHost:
    """A host reached as root, with its own system folders and the systemctl stand-in;
    `database`: its own MariaDB data folder too, made as the package's install makes it."""
    targets = (*PRIVATE, DATABASE) if database else PRIVATE
    mounts = [(private_dir(bed, name, target), target) for target in targets]
    fresh_system(bed, name)
    if database:
        data = private_dir(bed, name, DATABASE)
        data.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            [
                "mariadb-install-db",
                "--user=mysql",
                f"--datadir={data}",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if made.returncode != 0:
            raise RuntimeError(f"mariadb-install-db for {name}: {made.stderr[-400:]}")
    standin = system_dir(bed, name) / "systemctl"
    shutil.copyfile(STANDIN, standin)
    standin.chmod(0o755)
    mounts.append((standin, SYSTEMCTL))
    return bed.add_host(
        name,
        root_login=True,
        sshd_extra_config="PermitRootLogin prohibit-password\n",
        mounts=mounts,
        **kwargs,  # type: ignore[arg-type]
    )


def fresh_system(bed: NetnsBed, name: str) -> None:
    """The host's system folders as a fresh VM has them: empty, with the machine's owner and
    mode (its processes gone first: a VM that boots again)."""
    for target in PRIVATE:
        src = private_dir(bed, name, target)
        src.mkdir(parents=True, exist_ok=True)
        for child in list(src.iterdir()):  # emptied in place: the folder stays bound
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        st = os.stat(target)
        os.chown(src, st.st_uid, st.st_gid)
        src.chmod(stat.S_IMODE(st.st_mode))
    run = private_dir(bed, name, "/run")
    (run / "sshd").mkdir(mode=0o755)  # sshd's privilege separation folder
    (run / "systemd" / "system").mkdir(parents=True)


def standin_log(bed: NetnsBed, name: str, unit: str) -> Path:
    """What a unit's daemon printed (the stand-in's log of it)."""
    return private_dir(bed, name, "/run") / "vmrun-standin" / f"{unit}.log"
