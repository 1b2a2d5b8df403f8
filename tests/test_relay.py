"""The host-to-host hop (vmrun.transfer.relay): a tree on one test host copied to another over
the hosts' inner network, with a key made for that transfer alone and gone in every ending.
The key line and its removal, and the host script's parts, also run here against a
temporary home (quick tier)."""

from __future__ import annotations

import _thread
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, local_argv, wait_for
from testbed import NetnsBed, TestHost

from vmrun import hostside
from vmrun.errors import VmrunError
from vmrun.hostside import command
from vmrun.ssh.connection import Connection
from vmrun.ssh.hosts import parse_host
from vmrun.transfer.manifest import PART_SUFFIX
from vmrun.transfer.relay import (
    STATE,
    authorized_line,
    known_hosts_line,
    new_tag,
    receive_command,
    relay,
    remove_stale_relay_keys,
)
from vmrun.transfer.types import Progress

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ7c2Y0d0yJYwqzCUR4wA1y8vUxHv7iYH3VvS4L7bN1 x"
HOSTILE = ["with space", "new\nline", "-leading-dash", "sub/dir/deep file", "latin-\udce9"]


# -- quick tier: the key line, and relay.sh run here ------------------------------------


def test_authorized_line_restricts_the_key_to_one_receiver() -> None:
    tag = new_tag()
    line = authorized_line(PUB, tag, "10.0.0.7")
    options, kind, blob, comment = line.split(" ")[0], *line.split(" ")[-3:]
    assert options.startswith('restrict,from="10.0.0.7",command="')
    assert (kind, blob, comment) == (*PUB.split()[:2], tag)
    # sshd reads `\"` as `"`: the command it runs is receive_command's, byte for byte
    quoted = line[line.index('command="') + 9 : line.rindex('" ssh-ed25519')]
    assert quoted.replace('\\"', '"') == receive_command(tag)
    assert "from=" not in authorized_line(PUB, tag, None)
    with pytest.raises(ValueError):
        authorized_line(PUB, tag, "10.0.0.7,0.0.0.0/0")


def test_known_hosts_line_pins_the_key_under_the_address() -> None:
    assert known_hosts_line("10.1.2.3", 22, "ssh-ed25519 AAAA x") == "10.1.2.3 ssh-ed25519 AAAA"
    assert known_hosts_line("10.1.2.3", 2222, "ssh-ed25519 AAAA").startswith("[10.1.2.3]:2222 ")
    with pytest.raises(VmrunError):
        known_hosts_line("10.1.2.3", 22, "AAAA")


def _relay_sh(home: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    argv = local_argv(command("relay.sh", *args), home)
    return subprocess.run(
        argv,
        input=stdin,
        cwd=home,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=False,
    )


def test_grant_adds_one_line_and_revoke_takes_only_it_out(host_home: Path) -> None:
    keys = host_home / ".ssh" / "authorized_keys"
    keys.parent.mkdir(mode=0o700)
    keys.write_text("ssh-ed25519 AAAAmine me@laptop")  # no newline at the end
    keys.chmod(0o640)
    tag, dest = new_tag(), "data/odd\nname"
    line = authorized_line(PUB, tag, "10.0.0.7")
    done = _relay_sh(host_home, "grant", STATE, tag, stdin=line.encode() + b"\n" + dest.encode())
    assert done.returncode == 0, done.stderr
    assert keys.read_text().splitlines() == ["ssh-ed25519 AAAAmine me@laptop", line]
    assert stat.S_IMODE(keys.stat().st_mode) == 0o640
    record = host_home / STATE / tag
    assert (record / "dest").read_text() == dest
    assert stat.S_IMODE(record.stat().st_mode) == 0o700

    (host_home / dest / f".{tag}").mkdir(parents=True)  # a staging folder left behind
    gone = _relay_sh(host_home, "revoke", STATE, tag, "0")
    assert gone.returncode == 0, gone.stderr
    assert keys.read_text() == "ssh-ed25519 AAAAmine me@laptop\n"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o640
    assert not record.exists() and not (host_home / dest / f".{tag}").exists()
    assert sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]


def test_grants_at_the_same_time_keep_every_line(host_home: Path) -> None:
    (host_home / ".ssh").mkdir(mode=0o700)
    tags = [new_tag() for _ in range(12)]
    argvs = [local_argv(command("relay.sh", "grant", STATE, t), host_home) for t in tags]
    env = {"HOME": str(host_home), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen(a, stdin=subprocess.PIPE, cwd=host_home, env=env) for a in argvs]
    for proc, tag in zip(procs, tags, strict=True):  # all waiting on stdin: then all at once
        assert proc.stdin is not None
        proc.stdin.write(authorized_line(PUB, tag, None).encode() + b"\nd")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
    assert [proc.wait() for proc in procs] == [0] * len(procs)
    lines = (host_home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert sorted(line.split()[-1] for line in lines) == sorted(tags)
    assert not (host_home / ".ssh" / ".vmrun-relay.lock").exists()


def test_the_stale_sweep_removes_old_transfers_and_leaves_young_ones(host_home: Path) -> None:
    (host_home / ".ssh").mkdir(mode=0o700)
    old, young = new_tag(now=1_000_000), new_tag()
    for tag in (old, young):
        assert (
            _relay_sh(
                host_home,
                "key",
                STATE,
                tag,
                "10.0.0.1 ssh-ed25519 AAAA",
                "10.0.0.1",
                stdin=b"PRIVATE\n",
            ).returncode
            == 0
        )
        line = authorized_line(PUB, tag, None)
        assert (
            _relay_sh(host_home, "grant", STATE, tag, stdin=line.encode() + b"\nd").returncode == 0
        )
    key = host_home / STATE / old / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_bytes() == b"PRIVATE\n"

    swept = _relay_sh(host_home, "revoke", STATE, "", "3600")
    assert swept.stdout.split() == [b"removed", b"2"]  # the line, the folder
    assert old not in (host_home / ".ssh" / "authorized_keys").read_text()
    assert young in (host_home / ".ssh" / "authorized_keys").read_text()
    assert sorted(p.name for p in (host_home / STATE).iterdir()) == [young]
    swept = _relay_sh(host_home, "revoke", STATE, "", "0")
    assert swept.stdout.split() == [b"removed", b"2"]
    assert "vmrun-relay" not in (host_home / ".ssh" / "authorized_keys").read_text()


def test_the_hop_places_each_file_verified_and_only_while_granted(
    host_home: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    for rel in HOSTILE:
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.fsencode(rel) * 1000)
    (src / "sub" / "link-in").symlink_to("dir")
    names = [*HOSTILE, "sub/link-in"]
    listing = tmp_path / "list"
    listing.write_bytes(b"".join(os.fsencode(r) + b"\0" for r in names))
    pack = [sys.executable, str(hostside.HERE / "transfer_pack.py"), str(src), str(listing)]
    stream = subprocess.run(pack, capture_output=True, check=True).stdout
    tag = new_tag()
    line = authorized_line(PUB, tag, None).encode()
    assert _relay_sh(host_home, "grant", STATE, tag, stdin=line + b"\nto").returncode == 0
    got = _relay_sh(host_home, "receive", STATE, tag, stdin=stream)
    assert got.returncode == 0, got.stderr
    said = got.stdout.split(b"\0")[:-1]
    assert sorted(said) == sorted(b"+" + os.fsencode(r) for r in names)
    for rel in HOSTILE:
        assert (host_home / "to" / rel).read_bytes() == os.fsencode(rel) * 1000
        assert (host_home / "to" / rel).stat().st_mtime_ns == (src / rel).stat().st_mtime_ns
    assert os.readlink(host_home / "to" / "sub" / "link-in") == "dir"
    assert not [p for p in (host_home / "to").rglob("*") if p.name.endswith(".vmrun-part")]
    # a transfer that was revoked receives nothing
    assert _relay_sh(host_home, "revoke", STATE, tag, "0").returncode == 0
    shutil.rmtree(host_home / "to")
    refused = _relay_sh(host_home, "receive", STATE, tag, stdin=stream)
    assert refused.returncode != 0 and not (host_home / "to").exists()


# -- netns tier: two test hosts on an inner network -------------------------------------


@pytest.fixture
def hosts(
    cluster: dict[str, TestHost], bed: NetnsBed, bed_client: Client
) -> Iterator[dict[str, Connection]]:
    """n1 (A) and n2 (B), both on main and inner; h1 on main only."""
    settings = bed_client.settings()
    conns = {n: Connection(parse_host(n), settings) for n in ("n1", "n2", "h1")}
    yield conns
    for conn in conns.values():
        conn.close()
    for host in (cluster["n1"], cluster["n2"], bed.host("h1")):
        for path in (host.home / "src", host.home / "copy"):
            subprocess.run(["rm", "-rf", str(path)], check=True)


def _host_key(host: TestHost) -> str:
    return next(k for k in host.host_key_pub_lines if k.startswith("ssh-ed25519"))


def _own(host: TestHost, root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.lchown(Path(folder) / name, host.uid, host.gid)
    os.lchown(root, host.uid, host.gid)


def _tree(root: Path) -> dict[str, object]:
    """rel -> bytes (file), ("link", target), or "dir"."""
    found: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = "dir"
            else:
                found[rel] = path.read_bytes()
    return found


class _Counted(Progress):
    def __init__(self) -> None:
        self.begun: list[tuple[str, int, int, str]] = []
        self.advances: list[int] = []

    def begin(self, host: str, files: int, nbytes: int, via: str = "") -> None:
        self.begun.append((host, files, nbytes, via))

    def advance(self, host: str, nbytes: int) -> None:
        self.advances.append(nbytes)


def _make_source(host: TestHost, big: int = 3 << 20) -> Path:
    src = host.home / "src"
    for rel in HOSTILE:
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.fsencode(rel) * 100)
    (src / "big.bin").write_bytes(os.urandom(big))
    (src / "empty-dir").mkdir()
    (src / "link-in").symlink_to("sub/dir")
    (src / "sub" / "link-up").symlink_to("../big.bin")
    (src / "link-out").symlink_to("/etc/passwd")
    _own(host, src)
    return src


def _no_key_left(a: TestHost, b: TestHost) -> None:
    keys = (b.home / ".ssh" / "authorized_keys").read_text()
    assert "vmrun-relay-" not in keys
    for host in (a, b):
        state = host.home / STATE
        assert not state.exists() or os.listdir(state) == []
    copy = b.home / "copy"
    if copy.exists():
        assert not [n for n in os.listdir(copy) if n.startswith(".vmrun-relay-")]


def test_a_tree_goes_host_to_host_exact_and_only_what_changed_again(
    cluster: dict[str, TestHost], hosts: dict[str, Connection]
) -> None:
    a, b = cluster["n1"], cluster["n2"]
    src = _make_source(a, big=20 << 20)
    progress = _Counted()
    report = relay(
        hosts["n1"],
        hosts["n2"],
        b.addr_on("inner"),
        "src",
        "copy",
        dst_host_key=_host_key(b),
        progress=progress,
    )
    sizes = sum(len(v) for v in _tree(src).values() if isinstance(v, bytes))
    assert progress.begun == [("n2", len(HOSTILE) + 1 + 2, sizes, "n1")]  # files, inside links
    assert sum(progress.advances) == sizes and len(progress.advances) > 1
    expected = _tree(src)
    del expected["link-out"]
    assert _tree(b.home / "copy") == expected
    assert report.skipped == ["link-out: a symlink that leads out of the tree"]
    assert report.from_addr == a.addr_on("inner")
    # B's sshd let the transfer key in from A's inner address: the bytes went A -> B
    assert f"Accepted publickey for {b.user} from {a.addr_on('inner')}" in b.sshd_log()
    _no_key_left(a, b)
    mtime = os.stat(src / "big.bin").st_mtime_ns
    assert os.stat(b.home / "copy" / "big.bin").st_mtime_ns == mtime

    again = relay(
        hosts["n1"], hosts["n2"], b.addr_on("inner"), "src", "copy", dst_host_key=_host_key(b)
    )
    assert again.sent == [] and again.unchanged == len(HOSTILE) + 1
    (src / "with space").write_bytes(b"changed")
    third = relay(
        hosts["n1"], hosts["n2"], b.addr_on("inner"), "src", "copy", dst_host_key=_host_key(b)
    )
    assert third.sent == ["with space"]
    assert (b.home / "copy" / "with space").read_bytes() == b"changed"
    _no_key_left(a, b)


def test_a_failure_on_the_receiver_leaves_no_key(
    cluster: dict[str, TestHost], hosts: dict[str, Connection]
) -> None:
    a, b = cluster["n1"], cluster["n2"]
    _make_source(a, big=1024)
    (b.home / "copy").mkdir()
    _own(b, b.home / "copy")
    (b.home / "copy").chmod(0o500)  # the staging folder cannot be made
    with pytest.raises(VmrunError) as caught:
        relay(
            hosts["n1"], hosts["n2"], b.addr_on("inner"), "src", "copy", dst_host_key=_host_key(b)
        )
    assert caught.value.code == "transfer-failed"
    (b.home / "copy").chmod(0o700)
    _no_key_left(a, b)
    assert os.listdir(b.home / "copy") == []


def test_ctrl_c_mid_copy_leaves_no_key_and_nothing_running(
    cluster: dict[str, TestHost], hosts: dict[str, Connection]
) -> None:
    a, b = cluster["n1"], cluster["n2"]
    src = a.home / "src"
    src.mkdir()
    with open(src / "huge.bin", "wb") as fh:
        fh.truncate(4 << 30)  # sparse on A; B writes what arrives before the interrupt
    _own(a, src)
    fired = threading.Event()

    def interrupt_once_bytes_arrive() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for part in (b.home / "copy").glob(f".huge.bin.*{PART_SUFFIX}"):
                try:
                    if part.stat().st_size > 0:
                        fired.set()
                        _thread.interrupt_main()
                        return
                except OSError:
                    pass
            time.sleep(0.01)

    watcher = threading.Thread(target=interrupt_once_bytes_arrive, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        relay(
            hosts["n1"], hosts["n2"], b.addr_on("inner"), "src", "copy", dst_host_key=_host_key(b)
        )
    watcher.join()
    assert fired.is_set()
    _no_key_left(a, b)
    wait_for(
        lambda: not _relay_processes(a) and not _relay_processes(b),
        15,
        "the sender and receiver to end",
    )
    assert not (b.home / "copy" / "huge.bin").exists()


_RELAY_WORDS = (b"relay.sh", b"vmrun-relay", b"transfer_recv", b"transfer_pack")


def _relay_processes(host: TestHost) -> list[int]:
    found = []
    for pid in host.user_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(w in cmdline for w in _RELAY_WORDS):
            found.append(pid)
    return found


def test_a_killed_transfer_is_swept_by_remove_stale_relay_keys(
    cluster: dict[str, TestHost], hosts: dict[str, Connection]
) -> None:
    """What a SIGKILL of vmrun leaves (the key on A, its line and record on B, a staging
    folder) goes with the next sweep."""
    from vmrun.transfer import relay as mod

    a, b = cluster["n1"], cluster["n2"]
    tag = new_tag()
    mod._relay_sh(
        hosts["n1"], "key", tag, "x ssh-ed25519 AAAA", "10.0.0.1", stdin=b"PRIVATE\n", what="k"
    )
    line = authorized_line(PUB, tag, None).encode()
    mod._relay_sh(hosts["n2"], "grant", tag, stdin=line + b"\ncopy", what="g")
    (b.home / "copy" / f".{tag}").mkdir(parents=True)
    _own(b, b.home / "copy")
    assert remove_stale_relay_keys(hosts["n2"], older_than=3600) == 0
    assert tag in (b.home / ".ssh" / "authorized_keys").read_text()
    assert remove_stale_relay_keys(hosts["n2"]) == 2
    assert remove_stale_relay_keys(hosts["n1"]) == 1
    _no_key_left(a, b)


def test_a_private_address_the_sender_cannot_reach_fails_fast_with_its_code(
    cluster: dict[str, TestHost], bed: NetnsBed, hosts: dict[str, Connection]
) -> None:
    a, b = cluster["n1"], cluster["n2"]
    _make_source(a, big=1024)
    _make_source(bed.host("h1"), big=1024)
    started = time.monotonic()
    with pytest.raises(VmrunError) as caught:  # h1 is on main only: no route to inner
        relay(
            hosts["h1"],
            hosts["n2"],
            b.addr_on("inner"),
            "src",
            "copy",
            dst_host_key=_host_key(b),
            connect_timeout=2,
        )
    assert caught.value.code == "relay-unreachable"
    assert time.monotonic() - started < 10
    b.cut_link("inner")  # silent: the connect times out
    try:
        started = time.monotonic()
        with pytest.raises(VmrunError) as caught:
            relay(
                hosts["n1"],
                hosts["n2"],
                b.addr_on("inner"),
                "src",
                "copy",
                dst_host_key=_host_key(b),
                connect_timeout=2,
            )
        assert caught.value.code == "relay-unreachable"
        assert time.monotonic() - started < 15
    finally:
        b.heal_link("inner")
    _no_key_left(a, b)


def test_a_wrong_host_key_is_refused(
    cluster: dict[str, TestHost], hosts: dict[str, Connection]
) -> None:
    a, b = cluster["n1"], cluster["n2"]
    _make_source(a, big=1024)
    with pytest.raises(VmrunError) as caught:
        relay(
            hosts["n1"],
            hosts["n2"],
            b.addr_on("inner"),
            "src",
            "copy",
            dst_host_key=_host_key(cluster["n1"]),
        )
    assert caught.value.code == "host-key-rejected"
    _no_key_left(a, b)
