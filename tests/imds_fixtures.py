"""The STAND-IN metadata service (tests/standins/imds.py: IMDS exists only on EC2) at its
real address inside one test host's own network namespace, for the spot tests and
benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conftest import wait_for
from testbed import TestHost

IMDS = Path(__file__).parent / "standins" / "imds.py"
METADATA = "169.254.169.254"


@contextlib.contextmanager
def metadata(host: TestHost, folder: Path) -> Iterator[tuple[Path, Path]]:
    """The stand-in on 169.254.169.254:80 in `host`'s namespace (no other host reaches
    it); yields its state file (what it says) and its request log."""
    state, requests = folder / "imds.json", folder / "imds.log"
    state.write_text("{}")
    host.run(["ip", "addr", "add", f"{METADATA}/32", "dev", "lo"])
    argv = [sys.executable, str(IMDS), METADATA, "80", str(state), str(requests)]
    proc = host.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: host.can_connect(METADATA, 80), 20, "the metadata stand-in")
        yield state, requests
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        host.run(["ip", "addr", "del", f"{METADATA}/32", "dev", "lo"], check=False)
