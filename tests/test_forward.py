"""vmrun.ssh.forward on real sshd test hosts: a local port carried over vmrun's own connection
(ProxyJump included) to a real HTTP server bound to the host's 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Client, wait_for
from testbed import NetnsBed, TestHost
from web_helpers import PAGE, get, http_server

from vmrun.errors import ConnectionLostError
from vmrun.reporting import Recorder
from vmrun.ssh.connection import Connection
from vmrun.ssh.forward import Forward, bind_free, moved_line


def established(host: TestHost, port: int) -> int:
    """TCP connections to `port` inside the host (what sshd opened for the forward)."""
    out = host.run(["ss", "-Htn", "state", "established", f"( sport = :{port} )"], text=True)
    return len(out.stdout.strip().splitlines())


def test_parallel_requests_through_the_forward_then_a_clean_stop(
    bed: NetnsBed, bed_client: Client
) -> None:
    h1 = bed["h1"]
    with http_server(h1, 18080) as path, Connection("h1", bed_client.settings()) as conn:
        fwd = Forward(conn, "127.0.0.1", 18080, local_port=0).start()
        assert fwd.probe()
        with ThreadPoolExecutor(8) as pool:
            bodies = list(pool.map(lambda _: get(fwd.port, path), range(32)))
        assert bodies == [PAGE] * 32
        assert fwd.connections >= 32
        # the transport is vmrun's one connection: no second login was made
        assert conn.transport.is_active()
        fwd.stop()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", fwd.port), timeout=2).close()
        wait_for(lambda: established(h1, 18080) == 0, 10, "no forwarded connection left on h1")


def test_busy_local_port_moves_to_the_next_free_one(bed: NetnsBed, bed_client: Client) -> None:
    h1 = bed["h1"]
    with bind_free(0) as holder:
        busy = holder.getsockname()[1]
        with (
            http_server(h1, 18081) as path,
            Connection("h1", bed_client.settings()) as conn,
            Forward(conn, "127.0.0.1", 18081, local_port=busy).start() as fwd,
        ):
            assert fwd.port != busy and busy < fwd.port < busy + 100
            assert moved_line(busy, fwd.port) == (f"local port {busy} is in use; using {fwd.port}")
            assert get(fwd.port, path) == PAGE
    assert moved_line(8080, 8080) is None


def test_a_refused_destination_is_noted_not_fatal(bed: NetnsBed, bed_client: Client) -> None:
    notes = Recorder()
    with (
        Connection("h2", bed_client.settings()) as conn,
        Forward(conn, "127.0.0.1", 18089, local_port=0).start(notes) as fwd,
    ):
        assert not fwd.probe()
        with pytest.raises(OSError):  # the browser sees the connection closed
            get(fwd.port, "/", timeout=10)
        wait_for(lambda: notes.lines, 10, "a note about the refused connection")
        assert notes.lines == ["nothing answers at h2's 127.0.0.1:18089 (is the server running?)"]
        with http_server(bed["h2"], 18089) as path:  # started later: now it works
            assert get(fwd.port, path) == PAGE


def test_idle_beyond_the_keepalive_deadline_then_still_works(
    bed: NetnsBed, bed_client: Client
) -> None:
    """The client's settings declare a link dead after 3 s without answers; 8 s idle are
    answered keepalives, so the forward is still there."""
    h1 = bed["h1"]
    settings = bed_client.settings()
    assert settings.keepalive_interval * settings.keepalive_count_max == 3
    with (
        http_server(h1, 18082) as path,
        Connection("h1", settings) as conn,
        Forward(conn, "127.0.0.1", 18082, local_port=0).start() as fwd,
    ):
        assert get(fwd.port, path) == PAGE
        assert not fwd.wait(8)
        assert get(fwd.port, path) == PAGE


def test_a_dropped_link_ends_the_forward_with_the_connection_error(
    bed: NetnsBed, bed_client: Client
) -> None:
    h3 = bed["h3"]
    with http_server(h3, 18083) as path, Connection("h3", bed_client.settings()) as conn:
        fwd = Forward(conn, "127.0.0.1", 18083, local_port=0).start()
        assert get(fwd.port, path) == PAGE
        h3.cut_link()
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionLostError) as info:
                fwd.wait(30)
            took = time.monotonic() - started
        finally:
            h3.heal_link()
    assert took < 15, took
    said = info.value.message
    assert info.value.code == "connection-lost" and "3 s" in said, said  # the keepalive's wait
    assert f"port {fwd.port}" in said and "h3's 127.0.0.1:18083" in said, said
    with pytest.raises(OSError):  # the listener is closed too
        socket.create_connection(("127.0.0.1", fwd.port), timeout=2).close()


def test_forward_through_a_proxyjump_chain(bed: NetnsBed, bed_client: Client) -> None:
    hidden = bed["hidden"]
    assert not hidden.reachable_from_root
    with (
        http_server(hidden, 18084) as path,
        Connection("hidden", bed_client.settings()) as conn,
        Forward(conn, "127.0.0.1", 18084, local_port=0).start() as fwd,
        ThreadPoolExecutor(8) as pool,
    ):
        bodies = list(pool.map(lambda _: get(fwd.port, path), range(8)))
    assert bodies == [PAGE] * 8


def test_the_listener_is_loopback_only(bed: NetnsBed, bed_client: Client) -> None:
    """This machine's other addresses (the bed's bridge among them) do not reach it."""
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    others = [w.split("/")[0] for w in listed.stdout.split() if w.count(".") == 3 and "/" in w]
    others = [a for a in others if not a.startswith("127.")]
    assert others, listed.stdout
    with (
        Connection("h1", bed_client.settings()) as conn,
        Forward(conn, "127.0.0.1", 18085, local_port=0).start() as fwd,
    ):
        socket.create_connection(("127.0.0.1", fwd.port), timeout=2).close()
        for addr in others:
            with pytest.raises(OSError):
                socket.create_connection((addr, fwd.port), timeout=2).close()
