"""What the benchmarks share: command-line sizes, a user's side of the test bed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket
    import threading


def parse_size(text: str) -> int:
    """`1G`, `200M`, `64KiB`, `1000`: bytes (K, M, G are powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text[-1:] in units else ""
    return int(float(text[: len(text) - len(unit)]) * units[unit])


def client_dirs(bed: object, tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    """A user's side for a NetnsBed: a home whose ssh config and known_hosts reach the bed's
    hosts, a project directory, and the environment the real CLI runs with there."""
    home, cwd = tmp / "home", tmp / "project"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    cwd.mkdir()
    (home / ".ssh" / "config").write_text(bed.ssh_config_text())  # type: ignore[attr-defined]
    (home / ".ssh" / "known_hosts").write_text(bed.known_hosts_text())  # type: ignore[attr-defined]
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "LANG": "C.UTF-8",
    }
    return home, cwd, env


def delay_relay(target: tuple[str, int], rtt_s: float) -> tuple[int, object]:
    """A far host without netem (not in every kernel): 127.0.0.1:PORT here relays to `target`
    in a process of its own, holding every chunk rtt/2 in each direction without limiting
    the rate (chunks queue; each leaves when due). SSH's own flow control (a channel's
    window, the kex and auth round trips) then sees the RTT end to end; TCP's does not (the
    relay acknowledges at once). Returns (PORT, the process: terminate() it)."""
    import multiprocessing
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    proc = multiprocessing.get_context("fork").Process(
        target=_relay_main, args=(listener, target, rtt_s / 2), daemon=True
    )
    proc.start()
    listener.close()
    return port, proc


def _relay_main(listener: object, target: tuple[str, int], delay: float) -> None:
    """Each connection in a process of its own (forked), so that eight streams at once are
    not eight streams through one interpreter's lock: a real network costs the two ends no
    CPU, and a relay that does becomes the bottleneck a WAN does not have."""
    import signal
    import socket

    assert isinstance(listener, socket.socket)
    children: set[int] = set()

    def stop(*_: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)  # not the test bed's handler
    while True:
        client, _ = listener.accept()
        with contextlib.suppress(ChildProcessError):
            while (done := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                children.discard(done)
        pid = os.fork()
        if pid:
            children.add(pid)
            client.close()
            continue
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        listener.close()
        upstream = socket.create_connection(target)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threads = [_delayed_pipe(client, upstream, delay), _delayed_pipe(upstream, client, delay)]
        for thread in threads:
            thread.join()
        os._exit(0)


def _delayed_pipe(src: socket.socket, dst: socket.socket, delay: float) -> threading.Thread:
    """Copy src to dst in two threads: a reader stamps each chunk with when it is due, a
    writer sends it then (and passes EOF on as a shutdown)."""
    import collections
    import socket
    import threading
    import time

    chunks: collections.deque[tuple[float, bytes]] = collections.deque()
    ready = threading.Condition()

    def reader() -> None:
        while True:
            try:
                data = src.recv(1 << 18)
            except OSError:
                data = b""
            with ready:
                chunks.append((time.monotonic() + delay, data))
                ready.notify()
            if not data:
                return

    def writer() -> None:
        while True:
            with ready:
                while not chunks:
                    ready.wait()
                due, data = chunks.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    threading.Thread(target=reader, daemon=True).start()
    writing = threading.Thread(target=writer, daemon=True)
    writing.start()
    return writing


def host_block(host: object, identity: Path, rtt_ms: float) -> tuple[str, list[str], object]:
    """The ssh_config block (alias `bench`) every tool reaches `host` by, and the names its
    known_hosts lines need: with `rtt_ms`, through a delay_relay on 127.0.0.1 (returned, to
    terminate() afterwards; None without)."""
    block = host.ssh_config_block(alias="bench", identity=identity)  # type: ignore[attr-defined]
    if not rtt_ms:
        return block, [], None
    target = (host.addr, host.port)  # type: ignore[attr-defined]
    port, relay = delay_relay(target, rtt_ms / 1000)
    block = "".join(
        "    HostName 127.0.0.1\n"
        if ln.strip().startswith("HostName")
        else f"    Port {port}\n"
        if ln.strip().startswith("Port")
        else ln
        for ln in block.splitlines(keepends=True)
    )
    return block, [f"[127.0.0.1]:{port}"], relay
