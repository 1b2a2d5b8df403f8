"""Fan-out's own decisions, without sshd: how many hosts at once, handshakes an sshd dropped
past its MaxStartups tried again, and shared jump connections let go by their last holder."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vmrun.config import Settings, load_settings
from vmrun.errors import UnreachableError, code_of
from vmrun.ssh import connection as connection_module
from vmrun.ssh import jumps
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry


def _settings(tmp_path: Path, **flags: object) -> Settings:
    return load_settings(flags, cwd=tmp_path, environ={"HOME": str(tmp_path)})


def test_map_works_on_at_most_parallel_hosts_at_once_in_host_order(tmp_path: Path) -> None:
    """Each worker holds its place until the limit is reached (or no more can come): the
    peak is the limit exactly, whatever the machine's speed."""
    entries = [HostEntry(parse_host(f"u@host{i}")) for i in range(12)]
    busy, peak, begun, limit = [0], [0], [0], [3]
    changed = threading.Condition()
    started: list[str] = []

    def work(entry: HostEntry, conn: object) -> str:
        with changed:
            busy[0] += 1
            begun[0] += 1
            peak[0] = max(peak[0], busy[0])
            started.append(entry.label)
            changed.notify_all()
            full = changed.wait_for(
                lambda: busy[0] >= limit[0] or begun[0] == len(entries), timeout=30
            )
            busy[0] -= 1
            changed.notify_all()
        assert full
        return entry.label

    with Group(entries, _settings(tmp_path, parallel=3)) as group:
        outcomes = group.map(work)
        assert peak[0] == 3
        assert [o.value for o in outcomes] == [e.label for e in entries]
        assert started[:3] == [e.label for e in entries[:3]]  # taken in host order
        peak[0] = begun[0] = 0
        limit[0] = 5
        group.map(work, at_once=5)
        assert peak[0] == 5


def test_a_hanging_host_holds_only_its_own_place(tmp_path: Path) -> None:
    """With 2 at a time, one host stuck until the other 9 are done: they go through the
    other place (were it held too, the stuck host would wait out its deadline)."""
    entries = [HostEntry(parse_host(f"u@host{i}")) for i in range(10)]
    others_done = threading.Event()
    count = [0]
    lock = threading.Lock()
    released: list[bool] = []

    def work(entry: HostEntry, conn: object) -> None:
        if entry.label == "u@host0":
            released.append(others_done.wait(30))
            return
        with lock:
            count[0] += 1
            if count[0] == 9:
                others_done.set()

    with Group(entries, _settings(tmp_path, parallel=2)) as group:
        group.map(work)
    assert released == [True]


@pytest.fixture
def dropping_server() -> Iterator[tuple[int, list[int], threading.Event]]:
    """127.0.0.1:PORT answering as sshd past MaxStartups does ("Exceeded MaxStartups", then
    close) to the first N connections; N is set by the test (list), and counts down."""
    server = socket.create_server(("127.0.0.1", 0))
    drops = [0]
    stop = threading.Event()
    accepted: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except OSError:
                return
            if drops[0] > 0:
                drops[0] -= 1
                with contextlib.suppress(OSError):
                    sock.sendall(b"Exceeded MaxStartups\r\n")
                sock.close()
            else:
                accepted.append(sock)  # then silence: a banner that never comes

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1], drops, stop
    finally:
        stop.set()
        server.close()
        for sock in accepted:
            sock.close()


def test_dropped_handshakes_are_tried_again_then_named(
    dropping_server: tuple[int, list[int], threading.Event],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dropped every time: the error says so (handshake-refused, not a dead host) after the
    tries, well within the deadline; dropped 3 times then silent: the dial went on to a 4th
    connection and waited there, so it ends at the deadline instead."""
    port, drops, _ = dropping_server
    monkeypatch.setattr(connection_module, "_REFUSED_BACKOFF_S", 0.001)
    settings = _settings(tmp_path, connect_timeout=1, accept_new_host_key=True)
    drops[0] = 1000
    with pytest.raises(UnreachableError) as info:
        Connection(f"u@127.0.0.1:{port}", settings).open()
    # not the deadline (that one says host-unreachable, as below): the tries ran out
    assert code_of(info.value) == "handshake-refused"
    assert 1000 - drops[0] == connection_module._REFUSED_TRIES
    drops[0] = 3
    with pytest.raises(UnreachableError) as info:
        Connection(f"u@127.0.0.1:{port}", settings).open()
    assert drops[0] == 0
    assert code_of(info.value) == "host-unreachable"


def test_waiting_to_try_a_dropped_handshake_again_is_not_connect_timeouts(
    dropping_server: tuple[int, list[int], threading.Event],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five drops cost at least 0.78 s of backoff, more than the 0.5 s connect_timeout: every
    drop is still tried again (the host answered; it was busy), and only the silent sixth
    connection spends the time."""
    port, drops, _ = dropping_server
    monkeypatch.setattr(connection_module, "_REFUSED_BACKOFF_S", 0.05)
    settings = _settings(tmp_path, connect_timeout=0.5, accept_new_host_key=True)
    drops[0] = 5
    with pytest.raises(UnreachableError) as info:
        Connection(f"u@127.0.0.1:{port}", settings).open()
    assert drops[0] == 0
    assert code_of(info.value) == "host-unreachable"


class _FakeConn:
    def __init__(self) -> None:
        self.closed = 0
        self.broken = False

    def close(self) -> None:
        self.closed += 1


def test_a_shared_jump_closes_with_its_last_holder_and_turns_are_bounded() -> None:
    made: list[_FakeConn] = []

    def make() -> _FakeConn:
        made.append(_FakeConn())
        return made[-1]

    first = jumps.lease("bastion", 2, make)
    second = jumps.lease("bastion", 2, make)
    assert len(made) == 1 and first.conn is second.conn
    assert first.take_turn(lambda: False) and second.take_turn(lambda: False)
    third = jumps.lease("bastion", 2, make)
    asked = [0]

    def give_up() -> bool:  # asked while it waits: both turns are taken
        asked[0] += 1
        return asked[0] > 2

    assert not third.take_turn(give_up) and asked[0] == 3
    first.end_turn()
    assert third.take_turn(lambda: False)
    first.close()
    first.close()  # letting go twice counts once
    second.close()
    assert made[0].closed == 0  # `third` still holds it
    third.close()
    assert made[0].closed == 1 and jumps.open_count() == 0
    broken = jumps.lease("bastion", 2, make)
    made[-1].broken = True
    fresh = jumps.lease("bastion", 2, make)  # a broken one is dialed anew
    assert fresh.conn is not broken.conn
    broken.close()
    fresh.close()
    assert [c.closed for c in made] == [1, 1, 1] and jumps.open_count() == 0


class _Relayed:
    """What the engine choice reads of a connection: reached through a jump host."""

    def __init__(self, fan_out: int) -> None:
        from vmrun.ssh.sshconfig import Target

        self.fan_out = fan_out
        self.label = "b1"
        self.settings = load_settings({}, environ={"HOME": "/nonexistent"})
        self.target = Target(
            label="b1",
            hostname="10.0.0.5",
            port=22,
            user="u",
            identity_files=(),
            identities_only=False,
            proxy_jump=(parse_host("bastion"),),
            proxy_command=None,
            known_hosts_files=(),
            key_host="10.0.0.5",
            key_port=22,
        )

    def open(self) -> _Relayed:
        return self

    def ensure_lib(self) -> None:
        """(the engines make sure of the host-side files: nothing to do here)"""


def test_hosts_sharing_a_jump_host_never_get_an_openssh_process_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A big transfer through a jump host: OpenSSH when the command works on that host alone
    (it is faster there), vmrun's shared connection when it works on several (each OpenSSH
    process would log in to the jump host again, past its MaxStartups)."""
    from vmrun.transfer import streams

    monkeypatch.setattr(streams, "measure_rtt", lambda conn: 0.001)
    alone = streams.choose_engine(_Relayed(1), wanted="auto", nbytes=1 << 30)  # type: ignore[arg-type]
    shared = streams.choose_engine(_Relayed(16), wanted="auto", nbytes=1 << 30)  # type: ignore[arg-type]
    assert isinstance(alone, streams.OpenSshEngine)
    assert isinstance(shared, streams.ParamikoEngine)
    forced = streams.choose_engine(_Relayed(16), wanted="openssh", nbytes=1 << 30)  # type: ignore[arg-type]
    assert isinstance(forced, streams.OpenSshEngine)  # asked for by name: as asked


def test_a_big_ssh_config_is_looked_up_over_the_blocks_that_apply_with_the_same_answer(
    tmp_path: Path,
) -> None:
    """Per host, only the blocks whose Host patterns match it (and Match blocks) are walked:
    the answer is paramiko's own over the whole file, negations, wildcards and Match kept."""
    import paramiko

    from vmrun.ssh import sshconfig

    text = "".join(
        f"Host h{i}\n    HostName 10.0.{i // 250}.{i % 250}\n    User u\n" for i in range(300)
    )
    text += (
        "Host !h3 h*\n    ProxyJump bastion\nHost *.lab x?y\n    User lab\n"
        "Match host h5\n    Port 2222\nHost *\n    IdentityFile ~/k\n    UserKnownHostsFile /k\n"
    )
    path = tmp_path / "config"
    path.write_text(text)
    whole = paramiko.SSHConfig.from_path(str(path))
    for host in ("h1", "h3", "h5", "a.lab", "xzy", "elsewhere", "h299"):
        assert dict(sshconfig._lookup(whole, host)) == dict(whole.lookup(host)), host
    canon = paramiko.SSHConfig.from_text(
        "Host *\n    CanonicalizeHostname yes\n    CanonicalDomains example.org\n"
        "    CanonicalizeMaxDots 0\n"
    )  # (a name with a dot is never looked up: no DNS here)
    assert sshconfig._lookup(canon, "a.b") == canon.lookup("a.b")  # the whole file, then
