"""py-spy on the hosts, for `vmrun stacks` and the hang watcher's dumps.

py-spy is one static binary (in its wheel's scripts): vmrun sends it to
~/.vmrun/tools/py-spy-VERSION/ on a host that has none (not in the run's env, not on PATH),
so a host needs no package index and nothing is installed in the user's env. The binary
comes from VMRUN_TOOL_WHEELS (a folder holding py-spy's wheel: offline use, the tests), else
vmrun's cache, filled once by `pip download` here for the host's machine.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError
from vmrun.ssh.connection import Connection

VERSION = "0.4.3"
TOOLS_DIR = ".vmrun/tools"
WHEELS_ENV = "VMRUN_TOOL_WHEELS"
_HERE = threading.Lock()  # the nodes' threads get the binary once


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vmrun" / "tools"


def wheels() -> list[Path]:
    """py-spy's wheels this machine has, for any machine (what it sent hosts)."""
    given = os.environ.get(WHEELS_ENV)
    folder = Path(given) if given else _cache()
    return sorted(folder.glob(f"py_spy-{VERSION}-*.whl"))


def wheel_for(machine: str) -> Path:
    """py-spy's wheel for `machine` (x86_64, aarch64)."""
    given = os.environ.get(WHEELS_ENV)
    folders = [Path(given)] if given else [_cache()]
    for folder in folders:
        found = sorted(folder.glob(f"py_spy-{VERSION}-*{machine}*.whl"))
        if found:
            return found[-1]
    if given:
        raise UsageError(
            f"no py-spy {VERSION} wheel for {machine} in {WHEELS_ENV}={given}",
            hint=f"pip download py-spy=={VERSION} --only-binary=:all: --platform"
            f" manylinux2014_{machine} -d {given}",
        )
    folder = _cache()
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            f"manylinux2014_{machine}",
            "--retries",
            "1",
            "--timeout",
            "20",
            "-d",
            str(folder),
            f"py-spy=={VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    found = sorted(folder.glob(f"py_spy-{VERSION}-*{machine}*.whl"))
    if done.returncode != 0 or not found:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RemoteError(
            f"could not download py-spy {VERSION} for {machine}: {said}",
            hint=f"put its wheel in a folder named by {WHEELS_ENV}, or `pip install py-spy`"
            " in the host's env (vmrun setup HOST --pip py-spy)",
            code="stack-tool-missing",
        )
    return found[-1]


def binary_for(machine: str) -> Path:
    """The py-spy executable out of its wheel, kept beside the wheel's cache."""
    with _HERE:
        return _binary_for(machine)


def _binary_for(machine: str) -> Path:
    wheel = wheel_for(machine)
    target = _cache() / f"py-spy-{VERSION}-{machine}"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zipped:
        name = next(n for n in zipped.namelist() if n.endswith(".data/scripts/py-spy"))
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        tmp.write_bytes(zipped.read(name))
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, target)
    return target


def ensure(conn: Connection, python: str = "python3") -> str:
    """py-spy's path on the host (absolute): the one it has, else the one sent now."""
    found = conn.run(
        hostside.command("stacks.py", "--tool", python=python),
        what="looking for py-spy",
        activity=False,
    )
    lines = found.stdout_tail.splitlines()
    if not found.ok or len(lines) < 3:
        raise RemoteError(
            f"could not look for py-spy: {found.output_tail(3)}",
            host=conn.label,
            code="stack-tool-missing",
        )
    if lines[-3].strip():
        return lines[-3].strip()
    machine, home = lines[-2].strip(), lines[-1].strip()
    from vmrun.transfer.upload import upload

    remote = f"{TOOLS_DIR}/py-spy-{VERSION}/py-spy"
    sent = upload(conn, binary_for(machine), remote)
    made = conn.run(["chmod", "755", hostside.HostPath(remote)], what="py-spy's mode")
    if not sent.ok or not made.ok:
        raise RemoteError("could not send py-spy", host=conn.label, code="stack-tool-missing")
    return f"{home}/{remote}"
