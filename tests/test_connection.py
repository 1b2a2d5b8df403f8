"""connection: real sshd test hosts, real keys, real network faults."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from conftest import Client, error_in, user_commands, wait_for
from testbed import NetnsBed

import vmrun.ssh
from vmrun.config import Settings, load_settings
from vmrun.errors import (
    AuthError,
    ChangedHostKeyError,
    CommandFailed,
    ConnectionLostError,
    ExitCode,
    UnknownHostKeyError,
    UnreachableError,
)
from vmrun.ssh.connection import Connection

SSH_PACKAGE = str(Path(vmrun.ssh.__file__).parent)
TraceFunction = Callable[[FrameType, str, object], object]

HOSTILE = [
    "a b",
    "$HOME",
    "`id`",
    "$(id)",
    "x;y",
    "new\nline",
    "-n",
    "--",
    "ünï ✓",
    "'q'",
    '"dq"',
    "",
    "back\\slash",
    "*",
    "~",
    "!",
]


def test_run_returns_a_value(bed: NetnsBed, bed_client: Client) -> None:
    with Connection("h1", bed_client.settings()) as conn:
        result = conn.run(["sh", "-c", "hostname; echo oops >&2; exit 3"])
    assert result.host == "h1"
    assert result.argv == ("sh", "-c", "hostname; echo oops >&2; exit 3")
    assert result.exit_status == 3 and not result.ok
    assert result.stdout_tail == f"{bed['h1'].hostname}\n"
    assert result.stderr_tail == "oops\n"
    assert result.duration > 0


def test_hostile_arguments_arrive_byte_for_byte(bed_client: Client) -> None:
    script = 'for a in "$@"; do printf "%s\\0" "$a"; done'
    with Connection("h2", bed_client.settings()) as conn:
        result = conn.run(["sh", "-c", script, "argv0", *HOSTILE], check=True)
    assert result.stdout_tail.split("\0")[:-1] == HOSTILE


def test_one_connection_serves_every_command(bed: NetnsBed, bed_client: Client) -> None:
    host = bed["h3"]
    before = host.sshd_log().count("Accepted publickey")
    with Connection("h3", bed_client.settings()) as conn:
        transport = conn.transport
        results = [conn.run(["echo", str(i)]) for i in range(5)]
        # several commands at once share it too (one channel each)
        threads = [threading.Thread(target=conn.run, args=(["sleep", "0.2"],)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert conn.transport is transport
    assert [r.stdout_tail for r in results] == [f"{i}\n" for i in range(5)]
    assert host.sshd_log().count("Accepted publickey") - before == 1


def test_env_values_reach_the_command_but_no_command_line(
    bed: NetnsBed, bed_client: Client
) -> None:
    secret = "hunter2 'quoted' $x\nsecond line"
    script = 'ps -eo args; printf "<%s>" "$TOKEN"'
    with Connection("h1", bed_client.settings()) as conn:
        result = conn.run(["sh", "-c", script], env={"TOKEN": secret}, check=True)
    listing, _, value = result.stdout_tail.rpartition("<")
    assert value == secret + ">"
    assert "hunter2" not in listing
    assert "hunter2" not in bed["h1"].sshd_log()


def test_cwd_and_missing_cwd(bed: NetnsBed, bed_client: Client) -> None:
    home = bed["h2"].home
    (home / "sub dir").mkdir(exist_ok=True)
    with Connection("h2", bed_client.settings()) as conn:
        assert conn.run(["pwd"], cwd=str(home / "sub dir")).stdout_tail == f"{home}/sub dir\n"
        missing = conn.run(["pwd"], cwd=str(home / "missing"))
    assert missing.exit_status == 126


def test_timeout_stops_the_remote_command(bed: NetnsBed, bed_client: Client) -> None:
    host = bed["h1"]
    with Connection("h1", bed_client.settings()) as conn, pytest.raises(CommandFailed) as info:
        conn.run(["sleep", "417"], timeout=1)
    assert info.value.exit_status == 124
    wait_for(
        lambda: not any("sleep 417" in c for c in user_commands(host)),
        15,
        "the timed-out remote sleep to be killed",
    )


def test_proxyjump_reaches_a_host_only_the_bastion_can_see(
    bed: NetnsBed, bed_client: Client
) -> None:
    hidden = bed["hidden"]
    assert not hidden.reachable_from_root
    with Connection("hidden", bed_client.settings()) as conn:
        result = conn.run(["hostname"], check=True)
    assert result.stdout_tail.strip() == hidden.hostname


def test_proxyjump_from_a_spec_chain(bed: NetnsBed, bed_client: Client) -> None:
    """ProxyJump written as user@addr specs (not aliases), through the ssh config."""
    hidden, bastion = bed["hidden"], bed["bastion"]
    key = bed.client_keys.private
    (bed_client.ssh_dir / "config").write_text(
        f"Host target\n  HostName {hidden.addr}\n  User {hidden.user}\n  IdentityFile {key}\n"
        f"  ProxyJump {bastion.user}@{bastion.addr}:22\n"
        f"Host *\n  IdentityFile {key}\n"
    )
    with Connection("target", bed_client.settings()) as conn:
        assert conn.run(["hostname"], check=True).stdout_tail.strip() == hidden.hostname


def _fingerprint(pub_line: str) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", "-"], input=pub_line, capture_output=True, text=True, check=True
    ).stdout
    return out.split()[1]


def test_unknown_host_key_is_refused_with_its_fingerprint(
    bed: NetnsBed, bed_client: Client
) -> None:
    (bed_client.ssh_dir / "known_hosts").write_text("")
    with pytest.raises(UnknownHostKeyError) as info:
        Connection("h1", bed_client.settings()).open()
    message = info.value.one_line()
    offered = re.search(r"SHA256:\S+", message)
    assert offered is not None
    fingerprints = [_fingerprint(line) for line in bed["h1"].host_key_pub_lines]
    assert offered.group(0) in fingerprints
    assert "--accept-new-host-key" in message
    assert info.value.exit_code == ExitCode.HOST_KEY


def test_accept_new_trusts_on_first_use_then_is_strict(bed: NetnsBed, bed_client: Client) -> None:
    (bed_client.ssh_dir / "known_hosts").write_text("")
    settings = bed_client.settings(accept_new_host_key=True)
    with Connection("h2", settings) as conn:
        conn.run(["true"], check=True)
    managed = settings.known_hosts
    lines = managed.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(bed["h2"].addr + " ")
    assert oct(managed.stat().st_mode & 0o777) == "0o600"
    # remembered: a strict connection now succeeds without touching ~/.ssh
    with Connection("h2", bed_client.settings(accept_new_host_key=False)) as conn:
        conn.run(["true"], check=True)
    assert (bed_client.ssh_dir / "known_hosts").read_text() == ""


def test_changed_host_key_is_always_refused(bed: NetnsBed, bed_client: Client, tmp_path) -> None:
    """known_hosts holds another key of the same type for h3: refuse, even with TOFU on."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True
    )
    impostor = (tmp_path / "k.pub").read_text().split()[:2]
    (bed_client.ssh_dir / "known_hosts").write_text(f"{bed['h3'].addr} {' '.join(impostor)}\n")
    for accept in (False, True):
        with pytest.raises(ChangedHostKeyError) as info:
            Connection("h3", bed_client.settings(accept_new_host_key=accept)).open()
        assert info.value.code == "host-key-changed"
        assert "ssh-keygen -R" in info.value.one_line()
    assert not bed_client.settings().known_hosts.exists()  # nothing was trusted


def test_auth_failure_is_clear(bed: NetnsBed, bed_client: Client, tmp_path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    h1 = bed["h1"]
    (bed_client.ssh_dir / "config").write_text(
        f"Host h1\n  HostName {h1.addr}\n  User {h1.user}\n  IdentityFile {stranger}\n"
        "  IdentitiesOnly yes\n"
    )
    with pytest.raises(AuthError) as info:
        Connection("h1", bed_client.settings()).open()
    assert f"user {h1.user!r}" in info.value.one_line()
    assert "authorized_keys" in info.value.one_line()
    assert info.value.exit_code == ExitCode.AUTH


def test_no_key_at_all_is_an_auth_error(bed: NetnsBed, bed_client: Client) -> None:
    """No IdentityFile, no ~/.ssh/id_*, no ssh-agent: paramiko has nothing to offer. That is
    for the user to fix here (exit 11), not an unreachable host (12)."""
    h1 = bed["h1"]
    (bed_client.ssh_dir / "config").write_text(f"Host h1\n  HostName {h1.addr}\n  User {h1.user}\n")
    assert not list(bed_client.ssh_dir.glob("id_*"))
    assert "SSH_AUTH_SOCK" not in os.environ
    with pytest.raises(AuthError) as info:
        Connection("h1", bed_client.settings()).open()
    line = info.value.one_line()
    assert line.startswith(f"h1: no SSH key to log in as {h1.user!r} with (no ~/.ssh/id_* key,")
    assert "ssh-agent offered none" in line and "authorized_keys" in line and "ssh-add" in line
    assert info.value.exit_code == ExitCode.AUTH
    # an IdentityFile that is not there, with IdentitiesOnly: said so
    missing = bed_client.home / "gone"
    (bed_client.ssh_dir / "config").write_text(
        f"Host h1\n  HostName {h1.addr}\n  User {h1.user}\n  IdentityFile {missing}\n"
        "  IdentitiesOnly yes\n"
    )
    with pytest.raises(AuthError) as info:
        Connection("h1", bed_client.settings()).open()
    assert info.value.code == "auth-failed" and f"IdentityFile {missing}" in info.value.message


def test_ssh_agent_keys_are_used(bed: NetnsBed, bed_client: Client, tmp_path) -> None:
    """No IdentityFile anywhere: the key comes from a real ssh-agent."""
    h2 = bed["h2"]
    (bed_client.ssh_dir / "config").write_text(f"Host h2\n  HostName {h2.addr}\n  User {h2.user}\n")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, 10, "ssh-agent's socket")
        env = {"SSH_AUTH_SOCK": str(sock), "HOME": bed_client.env["HOME"]}
        subprocess.run(
            ["ssh-add", str(bed.client_keys.private)], env=env, check=True, capture_output=True
        )
        os.environ["SSH_AUTH_SOCK"] = str(sock)
        try:
            with Connection("h2", bed_client.settings()) as conn:
                assert conn.run(["hostname"], check=True).stdout_tail.strip() == h2.hostname
        finally:
            del os.environ["SSH_AUTH_SOCK"]
    finally:
        agent.kill()
        agent.wait(timeout=10)


def test_unreachable_address_fails_within_the_timeout(bed: NetnsBed, bed_client: Client) -> None:
    empty = bed["h1"].addr.rsplit(".", 1)[0] + ".250"  # on the bridge, nobody home
    started = time.monotonic()
    with pytest.raises(UnreachableError) as info:
        Connection(f"nobody@{empty}", bed_client.settings(connect_timeout=2)).open()
    # ARP for an empty address gives up after about 3 s: the 2 s timeout comes first, as the
    # message below says; this bound only rules out a hang (8 s: room for a loaded machine)
    assert time.monotonic() - started < 2 + 8
    assert info.value.one_line() == (
        f"nobody@{empty}: no answer from {empty} port 22 within 2 s; check the address and"
        " any firewall or security group, or raise --connect-timeout"
    )
    assert info.value.exit_code == ExitCode.UNREACHABLE


def test_refused_port_and_dns_failure(bed: NetnsBed, bed_client: Client) -> None:
    with pytest.raises(UnreachableError) as refused:
        Connection(f"u@{bed['h1'].addr}:2222", bed_client.settings()).open()
    assert refused.value.code == "host-unreachable" and "refused" in refused.value.message
    # offline: the made-up name fails to resolve in an empty network namespace (the CLI in a
    # child process there), never via the machine's DNS
    done = bed_client.vmrun("exec", "-H", "u@no-such-host.invalid", "--", "true", offline=True)
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    code, said = error_in(done.stderr)
    assert code == "host-unreachable" and "'no-such-host.invalid'" in said, done.stderr


def test_cut_link_mid_command_is_a_clear_error_and_leaves_no_process(
    bed: NetnsBed, bed_client: Client
) -> None:
    host = bed["h3"]
    started = threading.Event()
    outcome: dict[str, BaseException | None] = {}

    def watch(stream: str, line: bytes) -> None:
        if b"started" in line:
            started.set()

    conn = Connection("h3", bed_client.settings())

    def work() -> None:
        try:
            conn.run(["sh", "-c", "echo started; exec sleep 433"], on_output=watch)
            outcome["error"] = None
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        assert started.wait(20), "the remote command never started"
        cut_at = time.monotonic()
        host.cut_link()
        worker.join(20)
        assert not worker.is_alive(), "run() hung after the link was cut"
        lost_after = time.monotonic() - cut_at
    finally:
        host.heal_link()
        conn.close()
    error = outcome["error"]
    assert isinstance(error, ConnectionLostError), error
    assert "stopped answering" in error.one_line()
    # keepalive 1 s x 3 (the tests' settings): ~4 s; unnoticed, TCP retransmits for ~15 min.
    # 15 s: room for a loaded 2-core machine
    assert lost_after < 15
    # once the host notices the drop, the command's process group is killed
    wait_for(
        lambda: not any("sleep 433" in c for c in user_commands(host)),
        60,
        "the orphaned remote sleep to be killed after the link healed",
    )


def test_loopback_sshd_without_namespaces(loopback, client: Client) -> None:
    (client.ssh_dir / "config").write_text(loopback.ssh_config_block())
    (client.ssh_dir / "known_hosts").write_text("\n".join(loopback.known_hosts_lines()) + "\n")
    with Connection("loopback", client.settings()) as conn:
        result = conn.run(["sh", "-c", 'printf "%s" "$1"', "x", "a b $c"], check=True)
    assert result.stdout_tail == "a b $c"


def _yield_at_every_line(frame: FrameType, event: str, arg: object) -> TraceFunction | None:
    """A tracer that hands the GIL over at every line of vmrun.ssh code: the thread it runs
    in is interrupted everywhere a race could sit, not only where the interpreter happens to
    switch, so an unlocked read of shared state is caught in a few tries."""
    if not frame.f_code.co_filename.startswith(SSH_PACKAGE):
        return None

    def local(frame: FrameType, event: str, arg: object) -> TraceFunction:
        if event == "line":
            time.sleep(0)
        return local

    return local


def test_transport_read_while_another_thread_closes(loopback, client: Client) -> None:
    """One thread reads `conn.transport` (reopening after each close) while another closes the
    connection again and again: the reader gets a transport or a ConnectionLostError, never
    a half-closed connection's AssertionError or AttributeError."""
    (client.ssh_dir / "config").write_text(loopback.ssh_config_block())
    (client.ssh_dir / "known_hosts").write_text("\n".join(loopback.known_hosts_lines()) + "\n")
    conn = Connection("loopback", client.settings())
    conn.open()
    reads = [0]
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        sys.settrace(_yield_at_every_line)
        while not stop.is_set():
            try:
                conn.transport  # noqa: B018  (the read under test)
                reads[0] += 1
            except ConnectionLostError:
                pass
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        for _ in range(30):
            before = reads[0]
            conn.close()
            wait_for(lambda b=before: reads[0] > b + 10 or errors, 20, "the reader to reopen")
            if errors:
                break
    finally:
        stop.set()
        thread.join(20)
        conn.close()
    assert not thread.is_alive()
    assert not errors, errors


# -- the dial: one deadline, and close() never waits for it (quick tier: local fakes) -----


@pytest.fixture
def quiet_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A local TCP port that accepts and then never says a word (no SSH banner); and the
    connections it has accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], held
    stop.set()
    thread.join(5)
    for sock in [*held, server]:
        sock.close()


def _local_settings(tmp_path: Path, **flags: object) -> Settings:
    return load_settings(flags, cwd=tmp_path, environ={"HOME": str(tmp_path)})


def test_close_during_a_dial_returns_at_once_and_the_dial_fails(
    quiet_port: tuple[int, list[socket.socket]], tmp_path: Path
) -> None:
    """close() from another thread while the connection is being opened (here: waiting for
    a banner that never comes) neither waits for the dial nor lets it go on: the dial ends
    with the connection error at once, not at the end of connect_timeout."""
    port, accepted = quiet_port
    conn = Connection(f"u@127.0.0.1:{port}", _local_settings(tmp_path, connect_timeout=30))
    outcome: list[BaseException | None] = []
    opener = threading.Thread(target=lambda: outcome.append(_error_of(conn.open)), daemon=True)
    opener.start()
    wait_for(lambda: accepted, 10, "the dial to reach the server")
    time.sleep(0.2)  # into the wait for the banner (an early close is aborted as well)
    started = time.monotonic()
    conn.close()
    closed_in = time.monotonic() - started
    opener.join(10)
    assert closed_in < 1, closed_in  # the old lock made it wait out the whole connect
    assert not opener.is_alive() and time.monotonic() - started < 5  # not 30 s
    (error,) = outcome
    assert isinstance(error, ConnectionLostError), error
    assert "while connecting" in error.message


def _error_of(fn: Callable[[], object]) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


class _SlowLogin:
    """A paramiko server whose every login attempt takes `delay` seconds and fails."""

    def __init__(self, delay: float):
        import paramiko

        self.delay = delay
        self.base = paramiko.ServerInterface

    def interface(self) -> object:
        delay = self.delay

        class Slow(self.base):  # type: ignore[name-defined, misc]
            def get_allowed_auths(self, username: str) -> str:
                return "publickey"

            def check_auth_publickey(self, username: str, key: object) -> int:
                time.sleep(delay)
                return 2  # paramiko.AUTH_FAILED

        return Slow()


def test_the_whole_dial_fits_in_one_connect_timeout(tmp_path: Path) -> None:
    """Banner and key exchange come at once, then each of three keys takes 1.5 s to be
    refused: with a timeout per phase (and per key) that was 4.5 s and more for a 2 s
    connect_timeout; it is one deadline for the whole dial."""
    import paramiko

    host_key = paramiko.RSAKey.generate(1024)
    keys = []
    for i in range(3):
        path = tmp_path / f"key{i}"
        paramiko.RSAKey.generate(1024).write_private_key_file(str(path))
        keys.append(path)
    server = socket.create_server(("127.0.0.1", 0))
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            sock, _ = server.accept()
            transport = paramiko.Transport(sock)
            transports.append(transport)
            transport.add_server_key(host_key)
            transport.start_server(server=_SlowLogin(1.5).interface())  # type: ignore[arg-type]

    threading.Thread(target=serve, daemon=True).start()
    port = server.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host slow\n  HostName 127.0.0.1\n  Port {port}\n  User u\n  IdentitiesOnly yes\n"
        + "".join(f"  IdentityFile {k}\n" for k in keys)
    )
    settings = _local_settings(
        tmp_path, connect_timeout=2, ssh_config=str(config), accept_new_host_key=True
    )
    started = time.monotonic()
    try:
        error = _error_of(Connection("slow", settings).open)
        took = time.monotonic() - started
    finally:
        server.close()
        for transport in transports:
            transport.close()
    # each phase alone (1.5 s) is within 2 s: only one deadline for them all ends the dial
    assert took >= 1.9, (took, error)
    assert isinstance(error, UnreachableError), error
    assert "within 2 s" in error.message and "connect_timeout" in error.message
    assert error.exit_code == ExitCode.UNREACHABLE
