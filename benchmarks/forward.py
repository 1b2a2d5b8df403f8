"""`vmrun forward` against a direct connection and OpenSSH's `ssh -L`, on a test host.

A `python3 -m http.server` on the host answers (1) many small requests, 8 at a time, as a
browser loading TensorBoard does, and (2) one big file. Each is timed straight to the
host's address (no SSH: the floor), through `ssh -N -L` (OpenSSH's client), and through
`vmrun forward` (vmrun's paramiko transport, one direct-tcpip channel per connection).
Also the time from `vmrun forward` to the URL it prints. Needs root (a test host).

    python benchmarks/forward.py [--requests 400] [--size 64M]

Measured here (2 cores shared with other work, medians of 5): URL printed 0.25 s after the
command. 1 KiB requests, 8 at once: direct 376/s, ssh -L 349/s, vmrun forward 553/s (its
listener is this machine's loopback with TCP_NODELAY, and each connection is only a channel
of a transport already open). 64 MiB: direct 775 MiB/s, ssh -L 259 MiB/s, vmrun forward
98 MiB/s (paramiko handles every 32 KiB packet in Python: plenty for a dashboard or a
notebook; bulk files go through `vmrun fetch`, which uses OpenSSH for big transfers).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import client_dirs, parse_size  # noqa: E402
from testbed import ClientKeys, NetnsBed  # noqa: E402

PORT = 18700


def fetch(url: str) -> int:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return len(resp.read())


def small_requests(base: str, count: int) -> float:
    """Requests per second for `count` GETs of a 1 KiB page, 8 at a time."""
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda _: fetch(f"{base}/small.txt"), range(count)))
    assert all(s == 1024 for s in sizes)
    return count / (time.perf_counter() - started)


def big_file(base: str, size: int) -> float:
    """MiB per second for one GET of the big file."""
    started = time.perf_counter()
    assert fetch(f"{base}/big.bin") == size
    return size / (1 << 20) / (time.perf_counter() - started)


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_vmrun(env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], int, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmrun", "forward", str(PORT), "-H", "h1", "--local-port", "0"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    took = time.perf_counter() - started
    return proc, int(url.rstrip("/").rsplit(":", 1)[1]), took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--size", default="64M")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    size = parse_size(args.size)
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    procs: list[subprocess.Popen[str]] = []
    try:
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed:
            host = bed.add_host("h1")
            home, cwd, env = client_dirs(bed, work)
            www = host.home / "www"
            www.mkdir()
            (www / "small.txt").write_bytes(b"x" * 1024)
            with open(www / "big.bin", "wb") as fh:
                fh.write(os.urandom(size))
            for path in (www, www / "small.txt", www / "big.bin"):
                os.chown(path, host.uid, host.gid)
            server = host.popen(
                ["/usr/bin/python3", "-m", "http.server", "--bind", "0.0.0.0", str(PORT)],
                as_user=True,
                cwd=str(www),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(server)
            deadline = time.monotonic() + 30
            while not host.can_connect("127.0.0.1", PORT):
                if time.monotonic() > deadline:
                    raise RuntimeError("the HTTP server did not start")
            ssh_port = free_port()
            known = home / ".ssh" / "known_hosts"
            ssh = subprocess.Popen(
                [
                    "ssh",
                    "-F",
                    str(home / ".ssh" / "config"),
                    "-o",
                    f"UserKnownHostsFile={known}",
                    "-o",
                    "BatchMode=yes",
                    "-N",
                    "-L",
                    f"127.0.0.1:{ssh_port}:127.0.0.1:{PORT}",
                    "h1",
                ],
                env={**env, "HOME": str(home)},
                stderr=subprocess.DEVNULL,
            )
            procs.append(ssh)
            wait_port(ssh_port)
            to_url = []
            for _ in range(args.runs):
                proc, _, took = start_vmrun(env, cwd)
                to_url.append(took)
                proc.terminate()
                proc.wait()
            vmrun, vm_port, _ = start_vmrun(env, cwd)
            procs.append(vmrun)
            ways = {
                "direct (no SSH)": f"http://{host.addr}:{PORT}",
                "ssh -L (OpenSSH)": f"http://127.0.0.1:{ssh_port}",
                "vmrun forward": f"http://127.0.0.1:{vm_port}",
            }
            small: dict[str, list[float]] = {w: [] for w in ways}
            big: dict[str, list[float]] = {w: [] for w in ways}
            for _ in range(args.runs):  # interleaved, so drift hits each alike
                for way, base in ways.items():
                    small[way].append(small_requests(base, args.requests))
                    big[way].append(big_file(base, size))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"vmrun forward to URL printed, median of {args.runs}: {statistics.median(to_url):.2f} s")
    print(f"{'':18} {'requests/s (1 KiB, 8 at once)':>30} {'MiB/s (' + args.size + ')':>14}")
    for way in ways:
        print(f"{way:18} {statistics.median(small[way]):30.0f} {statistics.median(big[way]):14.1f}")


if __name__ == "__main__":
    main()
