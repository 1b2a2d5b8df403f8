"""`vmrun forward` on real sshd test hosts: a real HTTP server bound to a host's 127.0.0.1 (or
to a Slurm compute node, reached through the login node) opened from here; Ctrl-C ends it
cleanly, a lost link ends it with one line and exit 13."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

from conftest import Client, error_in, wait_for
from testbed import NetnsBed, SlurmCluster
from web_helpers import PAGE, Lines, get, http_server, port_of

from vmrun.ssh.forward import bind_free


def _markers(bed: NetnsBed, host: str) -> set[str]:
    """vmrun commands at work on the host (~/.vmrun/active): what its autostop counts."""
    folder = bed[host].home / ".vmrun" / "active"
    return {p.name for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def test_forward_a_port_of_the_host_until_ctrl_c(bed: NetnsBed, bed_client: Client) -> None:
    before = _markers(bed, "h1")
    with http_server(bed["h1"], 18090) as path, bind_free(0) as holder:
        busy = holder.getsockname()[1]
        lines = Lines(bed_client.popen("forward", "18090", "-H", "h1", "--local-port", str(busy)))
        url = lines.url(60)
        port = port_of(url)
        assert port != busy and url == f"http://127.0.0.1:{port}/"
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(lambda _: get(port, path), range(16))) == [PAGE] * 16
        assert _markers(bed, "h1") - before, "the forward holds a marker while it lasts"
        code, err = lines.finish(signal.SIGINT)
    assert code == 0, err
    wait_for(lambda: not _markers(bed, "h1") - before, 10, "the forward's marker to go")
    assert err.splitlines() == [
        f"vmrun: local port {busy} is in use; using {port}",
        "vmrun: forwarding to h1's 127.0.0.1:18090; Ctrl-C to stop",
        f"vmrun: stopped forwarding port {port}",
    ]


def test_a_lost_link_ends_the_forward_in_one_line(bed: NetnsBed, bed_client: Client) -> None:
    h3 = bed["h3"]
    with http_server(h3, 18091) as path:
        lines = Lines(bed_client.popen("forward", "18091", "-H", "h3", "--local-port", "0"))
        port = port_of(lines.url(60))
        assert get(port, path) == PAGE
        h3.cut_link()
        try:
            code, err = lines.finish(None, timeout=30)
        finally:
            h3.heal_link()
    assert code == 13, err
    code, last = error_in(err)
    assert code == "connection-lost" and last.startswith("h3: "), err
    assert f"while forwarding port {port} to h3's 127.0.0.1:18091" in last


def test_nothing_listening_yet_is_said_and_the_forward_waits(
    bed: NetnsBed, bed_client: Client
) -> None:
    """LOCAL:PORT, as ssh -L takes it: the page of the host's 18092 at the LOCAL asked for."""
    with bind_free(0) as probe:
        local = probe.getsockname()[1]  # free a moment ago
    lines = Lines(bed_client.popen("forward", f"{local}:18092", "-H", "h2"))
    port = port_of(lines.url(60))
    assert port == local
    with http_server(bed["h2"], 18092) as path:
        assert get(local, path) == PAGE
    code, err = lines.finish(signal.SIGINT)
    assert code == 0, err
    assert "vmrun: nothing answers at h2's 127.0.0.1:18092 yet; forwarding anyway" in err


def test_forward_to_a_compute_node_through_the_login_node(
    slurm_cluster: SlurmCluster, slurm_client: Client
) -> None:
    """Jupyter in a job: a server on compute node c1, opened here through the cluster's login
    node (-C), which reaches vmt-c1 by its name; c1 is never logged into."""
    c1 = slurm_cluster.computes[0]
    with http_server(c1, 18093, bind="0.0.0.0") as path:
        args = ("forward", "18093", "-C", "bed", "--node", c1.hostname, "--local-port", "0")
        lines = Lines(slurm_client.popen(*args))
        port = port_of(lines.url(60))
        assert get(port, path) == PAGE
        code, err = lines.finish(signal.SIGINT)
    assert code == 0, err
    assert f"vmrun: forwarding to bed's {c1.hostname}:18093; Ctrl-C to stop" in err
