"""Helpers for the tests of `vmrun forward` and `vmrun tensorboard`: a real HTTP server in a
test host, requests through a forward, the CLI's printed URL, and a real headless browser.
Every process started here is stopped by PID."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from conftest import wait_for
from testbed import TestHost

PAGE = b"served from the host's own loopback\n" * 2000  # ~72 KB: several windows' worth


@contextmanager
def http_server(host: TestHost, port: int, bind: str = "127.0.0.1") -> Iterator[str]:
    """`python3 -m http.server` in the host, as its user, serving page.txt; stopped by PID."""
    www = host.home / "www"
    host.run(["mkdir", "-p", str(www)], as_user=True)
    (www / "page.txt").write_bytes(PAGE)
    os.chown(www / "page.txt", host.uid, host.gid)
    proc = host.popen(
        ["/usr/bin/python3", "-m", "http.server", "--bind", bind, str(port)],
        as_user=True,
        cwd=str(www),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: host.can_connect(bind, port), 20, f"the HTTP server on {host.name}")
        yield "/page.txt"
    finally:
        proc.kill()
        proc.wait()


def get(port: int, path: str, timeout: float = 20) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
        return resp.read()


class Lines:
    """A child's stdout and stderr read line by line in threads, so a test can wait for a
    line with a deadline and still see everything the child said."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.out: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        assert proc.stdout is not None and proc.stderr is not None
        threading.Thread(target=self._pump, args=(proc.stdout, self.out.put), daemon=True).start()
        threading.Thread(
            target=self._pump, args=(proc.stderr, self.err.append), daemon=True
        ).start()

    @staticmethod
    def _pump(stream: IO[str], put: Callable[[str], object]) -> None:
        for line in stream:
            put(line)

    def url(self, timeout: float) -> str:
        """The first line on stdout (the URL the command prints), within `timeout`."""
        try:
            line = self.out.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"no URL within {timeout:g} s; stderr: {''.join(self.err)}")
        assert line.startswith("http://127.0.0.1:"), line + "".join(self.err)
        return line.strip()

    def finish(self, sig: int | None, timeout: float = 30) -> tuple[int, str]:
        """Send `sig` (None: none), wait for the exit; (exit code, all of stderr)."""
        if sig is not None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"no exit within {timeout:g} s (signal {sig})")
        time.sleep(0.1)  # let the reader threads take the last lines
        return code, "".join(self.err)


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


# a headless Chromium that reaches no network: every host name but 127.0.0.1 resolves to
# nothing, and nothing of its own (updates, sync, extensions) runs
CHROMIUM_QUIET = (
    *("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"),
    *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
    *("--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
)


def browser_dom(url: str, tmp: Path, budget_ms: int = 20000) -> str:
    """The page as a real headless Chromium renders it (its JavaScript run), as HTML. Every
    host name but 127.0.0.1 resolves to nothing, so the browser reaches no network."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is needed (apt-get install chromium)")
    profile = tmp / "chromium-profile"
    argv = [
        chromium,
        *CHROMIUM_QUIET,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        "--dump-dom",
        url,
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its helpers: its process group
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return out.decode("utf-8", "replace")


def processes(pids: list[int], needle: str) -> list[int]:
    """Those of `pids` whose command line contains `needle` (zombies excluded)."""
    found = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError):
            continue
        if state != "Z" and needle.encode() in cmdline:
            found.append(pid)
    return found


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
