"""setup shows a download's bytes and rate live, on the host's row of its live view, and logs it.

A real setup on a real sshd test host, in a terminal (a pty), downloading over HTTP: the test
host has no internet, so tests/paced_http.py serves the wheelhouses from inside the host at
64 MiB/s, as an index over a network would (a local file server sends 180 MiB too fast for any
progress line). With --env-manager uv, python-env installs uv with the host's own pip (23.0.1,
Debian 12's: no raw progress, a size and one finished bar line) and the env gets pip 26.3, so
the torch step's pip prints `Progress CUR of TOTAL` lines (`--progress-bar raw`, pip 24.1+).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CACHE, TORCH_SPEC, Client
from test_cli_setup import _last_run, _wipe, uv_wheelhouse  # noqa: F401 (a fixture, by name)
from testbed import NetnsBed, TestHost

HERE = Path(__file__).resolve().parent
TORCH_MIB = "182.9"  # torch 2.13.0's CPU wheel for CPython 3.11: 191,794,682 bytes


@pytest.fixture
def h1(bed: NetnsBed) -> Iterator[TestHost]:
    host = bed["h1"]
    _wipe(host)
    yield host
    _wipe(host)


@pytest.fixture
def paced_index(h1: TestHost, wheelhouse: Path, uv_wheelhouse: Path) -> Iterator[str]:  # noqa: F811
    """http://127.0.0.1:PORT inside h1, serving the test cache (the wheelhouses) at 64 MiB/s."""
    server = h1.popen(
        ["/usr/bin/python3", str(HERE / "paced_http.py"), str(CACHE), "64"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()  # said once it listens
        assert port.isdigit(), f"paced_http.py did not start (exit {server.poll()})"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait(timeout=10)


def _in_a_terminal(client: Client, *args: str, timeout: float) -> tuple[int, str]:
    """Run the CLI with its stdout on a pty, 160 columns wide; its exit status and all it
    wrote there (the live view's frames included), escape sequences removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmrun", *args],
        cwd=client.cwd,
        env=client.environ(COLUMNS="160", LINES="50", TERM="xterm"),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the pty (the CLI ended)
                break
            if not data:
                break
            chunks.append(data)
        status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    return status, re.sub(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][A-Z0-9]|[=>])", "", text)


def test_the_live_view_shows_torchs_download_with_bytes_and_rate(
    bed_client: Client, h1: TestHost, paced_index: str
) -> None:
    version = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    status, screen = _in_a_terminal(
        bed_client,
        "setup",
        "h1",
        "--only",
        "python-env",
        "--only",
        "torch",
        "--no-record",
        "--env-manager",
        "uv",
        "--python-version",
        version,
        "--torch",
        TORCH_SPEC,
        "--index-url",
        f"{paced_index}/none/",
        "--find-links",
        f"{paced_index}/wheelhouse-uv-pip/",
        "--find-links",
        f"{paced_index}/{Path(str(CACHE / 'wheelhouse-torch-2.13.0')).name}/",
        timeout=600,
    )
    assert status == 0, screen[-3000:]
    assert "ran 2 (python-env, torch)" in screen, screen[-3000:]
    # on h1's row while torch downloads: bytes so far, of all, and the rate
    during = re.findall(
        rf"torch: applying \| torch: (\d+\.\d)/{TORCH_MIB} MiB (\d+\.\d) MiB/s", screen
    )
    assert during, screen[-3000:]
    assert any(0 < float(done) < float(TORCH_MIB) and float(rate) > 0 for done, rate in during)
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h1.log")
    assert f"torch: {TORCH_MIB} MiB downloaded at" in log, log[-3000:]
    assert "\nProgress " not in log  # pip's raw lines feed the view; the log keeps its own
    # uv came with the host's old pip: its size, and the rate of its one finished bar line
    assert re.search(r"uv: \d+\.\d MiB downloaded at \d+\.\d MiB/s", log), log[-3000:]


def test_vmrun_fetch_shows_curls_progress_live(
    bed_client: Client, h1: TestHost, paced_index: str, tmp_path: Path
) -> None:
    """The conda step's Miniconda installer comes with vmrun_fetch (curl); here a step of its
    own fetches the torch wheel, as no installer can be downloaded from here."""
    wheel = next((CACHE / "wheelhouse-torch-2.13.0").glob("torch-*.whl")).name
    extra = tmp_path / "fetch.yaml"
    extra.write_text(
        "steps:\n  - name: fetch\n    apply: |\n"
        f'      vmrun_fetch "{paced_index}/wheelhouse-torch-2.13.0/{wheel}" "$HOME/t.whl"\n'
    )
    status, screen = _in_a_terminal(
        bed_client,
        "setup",
        "h1",
        "--extra",
        str(extra),
        "--only",
        "fetch",
        "--no-record",
        timeout=300,
    )
    assert status == 0, screen[-3000:]
    # curl's meter, in its binary units: 182M of the wheel's 182.9 MiB
    during = re.findall(r"fetch: applying \| torch: (\d+\.\d)/182\.0 MiB (\d+\.\d) MiB/s", screen)
    assert any(0 < float(done) < 182 and float(rate) > 0 for done, rate in during), screen[-3000:]
    assert (h1.home / "t.whl").stat().st_size == 191_794_682
    log = _last_run(bed_client.cwd / ".vmrun" / "logs" / "setup-h1.log")
    assert "torch: 182.0 MiB downloaded at" in log, log[-3000:]
    assert " % Total " in log  # curl's header lines stay; its rows do not
    assert not re.search(r"^\s*\d+\s+182M\s", log, re.M), log[-3000:]
