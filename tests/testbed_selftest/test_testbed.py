"""Self-test of the test bed: real sshd hosts, real ssh client, real cleanup.

These tests exercise only tests/testbed; if they fail, every vmrun test built on
the bed is suspect.  NetnsBed tests need root + ``ip netns``; they skip otherwise.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from conftest import slow_fixture  # noqa: E402
from testbed import (  # noqa: E402
    ClientKeys,
    LoopbackHost,
    NetnsBed,
    TestbedError,
    TestHost,
    can_connect,
    cleanup_stale,
    offline_argv,
    skip_reason_no_netns,
    skip_reason_no_offline,
)
from testbed.layout import ETC_NETNS, NETNS_RUN_DIR  # noqa: E402
from testbed.procs import ns_ident, pids_in_netns_idents, uid_pids  # noqa: E402
from testbed.registry import STATE_DIR  # noqa: E402

SSH = "/usr/bin/ssh"
_NO_NETNS = skip_reason_no_netns()
needs_netns = pytest.mark.skipif(_NO_NETNS is not None, reason=_NO_NETNS or "")
F = TypeVar("F", bound=Callable[..., object])


def netns_test(fn: F) -> F:
    """Marked ``netns`` (selectable with -m) and skipped without root/ip netns."""
    return pytest.mark.netns(needs_netns(fn))


def ssh_argv(keys: ClientKeys, known_hosts: Path, *extra: str) -> list[str]:
    """The system ssh client: our key only, strict checking against ``known_hosts``."""
    return [
        SSH,
        "-F",
        "none",
        "-i",
        str(keys.private),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        *extra,
    ]


def settle(predicate: Callable[[], object], timeout: float = 10) -> None:
    """Poll ``predicate`` until it is truthy or ``timeout`` passed (the caller asserts)."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


class Ctx:
    """What the module-scoped bed fixture hands to the tests."""

    def __init__(self, bed: NetnsBed, keys: ClientKeys, tmp: Path, create_s: float) -> None:
        self.bed = bed
        self.keys = keys
        self.tmp = tmp
        self.create_s = create_s
        self.known_hosts = tmp / "known_hosts"
        self.config = tmp / "ssh_config"
        self.refresh()

    def refresh(self) -> None:
        self.known_hosts.write_text(self.bed.known_hosts_text())
        self.config.write_text(
            self.bed.ssh_config_text(known_hosts=self.known_hosts)
            + f"\nHost *\n    BatchMode yes\n    ConnectTimeout 5\n"
            f"    IdentityFile {self.keys.private}\n    IdentitiesOnly yes\n"
        )

    def ssh(
        self,
        host: TestHost | str,
        *command: str,
        config: bool = False,
        extra: tuple[str, ...] = (),
        timeout: float = 20,
    ) -> subprocess.CompletedProcess[str]:
        """The system ssh client from the root namespace, strict host key checking."""
        if config:
            argv = [SSH, "-F", str(self.config), *extra]
        else:
            argv = ssh_argv(self.keys, self.known_hosts, *extra)
        target = host if isinstance(host, str) else f"{host.user}@{host.addr}"
        return subprocess.run(
            [*argv, target, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


def connect_error(addr: str, port: int, timeout: float) -> str:
    """'ok', 'timeout' or the errno name: tells a silent drop from RST/unreachable."""
    s = socket.socket()
    s.settimeout(timeout)
    try:
        s.connect((addr, port))
        return "ok"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return os.strerror(exc.errno or 0)
    finally:
        s.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> ClientKeys:
    return ClientKeys.generate(tmp_path_factory.mktemp("client-keys"))


@pytest.fixture(scope="module")
@slow_fixture
def ctx(tmp_path_factory: pytest.TempPathFactory, keys: ClientKeys) -> Iterator[Ctx]:
    if _NO_NETNS:
        pytest.skip(_NO_NETNS)
    tmp = tmp_path_factory.mktemp("bed")
    bed = NetnsBed(tmp / "work", keys)
    try:
        t0 = time.monotonic()
        for name in ("h1", "h2", "h3"):
            bed.add_host(name)
        create_s = time.monotonic() - t0
        bed.add_host("bastion", networks=("main", "inner"))
        bed.add_host("inner1", networks=("inner",), hosts_file_loopback_hostname=True)
        yield Ctx(bed, keys, tmp, create_s)
    finally:
        bed.close()


# --------------------------------------------------------------------------- NetnsBed


@netns_test
@pytest.mark.parametrize("name", ["h1", "h2", "h3"])
def test_ssh_hostname_and_user(ctx: Ctx, name: str) -> None:
    host = ctx.bed[name]
    proc = ctx.ssh(host, "hostname; id -un; pwd")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [host.hostname, host.user, str(host.home)]


@netns_test
def test_three_hosts_are_fast(ctx: Ctx) -> None:
    print(f"creating 3 hosts took {ctx.create_s:.3f}s")
    # ~0.25 s on an idle 2-core machine; a per-host wait such as IPv6 duplicate address
    # detection (~2 s each) would take 6 s or more. 5 s: 20x room for a loaded machine
    assert ctx.create_s < 5.0


@netns_test
def test_ssh_config_alias(ctx: Ctx) -> None:
    proc = ctx.ssh("h2", "hostname", config=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "vmt-h2"


@netns_test
def test_run_inside_host(ctx: Ctx) -> None:
    h1, inner = ctx.bed["h1"], ctx.bed["inner1"]
    assert h1.run(["hostname"], text=True).stdout.strip() == "vmt-h1"
    assert h1.run(["id", "-un"], as_user=True, text=True).stdout.strip() == h1.user
    assert f"{h1.addr}\tvmt-h1" in h1.run(["cat", "/etc/hosts"], text=True).stdout
    assert "127.0.1.1\tvmt-inner1" in inner.run(["cat", "/etc/hosts"], text=True).stdout
    assert h1.run(["cat", "/etc/resolv.conf"], text=True).stdout.startswith("nameserver 127.0.0.1")
    routes = h1.run(["ip", "-4", "route"], text=True).stdout
    assert "default" not in routes
    assert h1.sshd_pid() in h1.pids()
    # a timeout kills the command (the exec chain keeps one pid), nothing lingers
    with pytest.raises(subprocess.TimeoutExpired):
        h1.run(["sleep", "30"], as_user=True, timeout=0.3)
    assert h1.user_pids() == []


@netns_test
def test_homes_are_separate(ctx: Ctx) -> None:
    h1, h2 = ctx.bed["h1"], ctx.bed["h2"]
    proc = ctx.ssh(h1, "echo from-h1 > marker.txt")
    assert proc.returncode == 0, proc.stderr
    marker = h1.home / "marker.txt"
    assert marker.read_text() == "from-h1\n"
    assert marker.stat().st_uid == h1.uid
    assert not (h2.home / "marker.txt").exists()


@netns_test
def test_host_to_host_tcp(ctx: Ctx) -> None:
    h1, h2 = ctx.bed["h1"], ctx.bed["h2"]
    proc = h1.run(["bash", "-c", f"exec 3<>/dev/tcp/{h2.addr}/22"], check=False, timeout=5)
    assert proc.returncode == 0, proc.stderr


@netns_test
def test_inner_network_only_via_bastion(ctx: Ctx) -> None:
    bastion, inner = ctx.bed["bastion"], ctx.bed["inner1"]
    # the guard route makes it fail at once instead of leaking out of the default route
    assert connect_error(inner.addr, 22, 1.0) == "No route to host"
    assert bastion.can_connect(inner.addr)
    jump = f"{bastion.user}@{bastion.addr}"
    proc = ctx.ssh(f"{inner.user}@{inner.addr}", "hostname", config=True, extra=("-J", jump))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "vmt-inner1"
    proc = ctx.ssh("inner1", "hostname", config=True)  # ProxyJump from ssh_config_text
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "vmt-inner1"


@netns_test
def test_cut_link_is_silent_and_heals(ctx: Ctx) -> None:
    h1, h3 = ctx.bed["h1"], ctx.bed["h3"]
    # permanent neighbour entries: a cut never turns into ARP failure (EHOSTUNREACH)
    assert "PERMANENT" in h1.run(["ip", "neigh", "show", h3.addr], text=True).stdout
    root_neigh = subprocess.run(["ip", "neigh", "show", h3.addr], capture_output=True, text=True)
    assert "PERMANENT" in root_neigh.stdout
    h3.cut_link()
    try:
        assert connect_error(h3.addr, 22, 0.5) == "timeout"
        t0 = time.monotonic()
        assert not h1.can_connect(h3.addr, timeout=0.5)  # timeout, not EHOSTUNREACH
        assert time.monotonic() - t0 >= 0.45
        assert not h3.can_connect(h1.addr, timeout=0.3)
    finally:
        h3.heal_link()
    assert connect_error(h3.addr, 22, 2.0) == "ok"
    assert h1.can_connect(h3.addr)
    proc = ctx.ssh(h3, "hostname")
    assert proc.returncode == 0, proc.stderr


@netns_test
def test_stop_start_sshd_keeps_host_key(ctx: Ctx) -> None:
    h2 = ctx.bed["h2"]
    keys_before = list(h2.host_key_pub_lines)
    session = subprocess.Popen(
        [*ssh_argv(ctx.keys, ctx.known_hosts), f"{h2.user}@{h2.addr}", "sleep 300"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # a login under the full suite's load can take longer than 10 s
        settle(lambda: h2.user_pids() or session.poll() is not None, timeout=60)
        if not h2.user_pids():
            gone = session.poll() is not None
            why = session.stderr.read().decode(errors="replace") if gone else "still logging in"
            raise AssertionError(f"remote session never started: {why}")
        h2.stop_sshd()
        assert h2.pids() == [] and h2.user_pids() == []
        assert connect_error(h2.addr, 22, 1.0) == "Connection refused"
        assert session.wait(timeout=10) == 255  # the connection dropped
    finally:
        session.kill()
        session.wait()
        h2.start_sshd()
    assert h2.host_key_pub_lines == keys_before
    proc = ctx.ssh(h2, "true")  # strict checking against the old known_hosts
    assert proc.returncode == 0, proc.stderr


@netns_test
def test_reboot_later(ctx: Ctx) -> None:
    h3 = ctx.bed["h3"]
    thread = h3.reboot_later(0.3)
    assert connect_error(h3.addr, 22, 1.0) == "Connection refused"
    thread.join(timeout=10)
    assert can_connect(h3.addr)
    assert ctx.ssh(h3, "true").returncode == 0


@netns_test
def test_block_port(ctx: Ctx) -> None:
    h1, h2 = ctx.bed["h1"], ctx.bed["h2"]
    listener = h2.popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import socket, time
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 8022)); s.listen(16); time.sleep(300)
    """),
        ]
    )
    try:
        settle(lambda: h1.can_connect(h2.addr, 8022))
        assert h1.can_connect(h2.addr, 8022)
        h2.block_port(8022)
        try:
            assert not h1.can_connect(h2.addr, 8022, timeout=0.5)
            assert connect_error(h2.addr, 8022, 0.5) == "timeout"  # DROP, not reject
            assert h1.can_connect(h2.addr, 22)
            assert ctx.ssh(h2, "true").returncode == 0
        finally:
            h2.unblock_port(8022)
        assert h1.can_connect(h2.addr, 8022)
    finally:
        listener.kill()
        listener.wait()


@netns_test
def test_replace_host_keys(ctx: Ctx) -> None:
    h3 = ctx.bed["h3"]
    old = list(h3.host_key_pub_lines)
    h3.replace_host_keys()
    try:
        assert set(old).isdisjoint(h3.host_key_pub_lines)
        proc = ctx.ssh(h3, "true")
        assert proc.returncode == 255
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in proc.stderr
    finally:
        ctx.refresh()
    assert ctx.ssh(h3, "true").returncode == 0


def _bed_leftovers(prefix: str, uids: set[int], idents: set[tuple[int, int]]) -> list[str]:
    left = []
    if ns := [n for n in os.listdir(NETNS_RUN_DIR) if n.startswith(prefix + "-")]:
        left.append(f"namespaces {ns}")
    if links := [n for n in os.listdir("/sys/class/net") if n.startswith(prefix)]:
        left.append(f"links {links}")
    users = subprocess.run(["getent", "passwd"], capture_output=True, text=True).stdout
    if us := [u for u in users.splitlines() if u.startswith(prefix + "-")]:
        left.append(f"users {us}")
    if pids := uid_pids(uids) + pids_in_netns_idents(idents):
        left.append(f"processes {pids}")
    if ETC_NETNS.exists() and (e := [n for n in os.listdir(ETC_NETNS) if n.startswith(prefix)]):
        left.append(f"/etc/netns {e}")
    if Path(f"/home/vmt-testbed/{prefix}").exists():
        left.append("home dir")
    if (STATE_DIR / f"{prefix}.json").exists():
        left.append("state file")
    return left


@netns_test
def test_close_leaves_nothing(tmp_path: Path, keys: ClientKeys) -> None:
    bed = NetnsBed(tmp_path / "work", keys)
    a = bed.add_host("a", networks=("main", "side"))
    b = bed.add_host("b", networks=("side",))
    prefix = bed.prefix
    uids = {a.uid, b.uid}
    idents = {i for h in (a, b) if (i := ns_ident(NETNS_RUN_DIR / h.netns))}
    idents.add(ns_ident(NETNS_RUN_DIR / bed.switch_ns))  # type: ignore[arg-type]
    kh = tmp_path / "kh"
    kh.write_text(bed.known_hosts_text())
    # a remote command that outlives its ssh client, a detached daemon, and a user
    # process outside any namespace: close() must get all of them
    client = subprocess.Popen(
        [*ssh_argv(keys, kh), f"{a.user}@{a.addr}", "sleep 300"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # (a daemon must not keep run()'s output pipes open, or run() waits for it)
    b.run(["bash", "-c", "setsid -f sleep 300 </dev/null >/dev/null 2>&1"], as_user=True)
    outside = subprocess.Popen(
        ["setpriv", f"--reuid={a.uid}", f"--regid={a.gid}", "--init-groups", "sleep", "300"]
    )
    settle(lambda: len(a.user_pids()) >= 3)
    client.kill()
    client.wait()
    assert len(a.user_pids()) >= 2 and b.user_pids()
    bed.close()
    outside.wait(timeout=5)
    assert _bed_leftovers(prefix, uids, idents) == []
    bed.close()  # idempotent


@netns_test
def test_cleanup_stale_after_crash(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(TESTS_DIR)!r})
        from pathlib import Path
        from testbed import ClientKeys, NetnsBed
        tmp = Path({str(tmp_path)!r})
        bed = NetnsBed(tmp / "work", ClientKeys.generate(tmp / "keys"))
        bed.add_host("x", networks=("main", "other"))
        print(bed.prefix, flush=True)
        os._exit(0)  # a crash: no close(), no atexit
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    prefix = proc.stdout.strip()
    assert (NETNS_RUN_DIR / f"{prefix}-x").exists()
    ident = ns_ident(NETNS_RUN_DIR / f"{prefix}-x")
    assert ident and pids_in_netns_idents({ident}), "orphaned sshd should still run"
    assert prefix in cleanup_stale()
    assert _bed_leftovers(prefix, set(), {ident}) == []


# --------------------------------------------------------------------------- LoopbackHost


@pytest.mark.skipif(not os.access("/usr/sbin/sshd", os.X_OK), reason="needs /usr/sbin/sshd")
@pytest.mark.netns  # starts its own sshd (in the body, so no fixture says so)
def test_loopback_host(tmp_path: Path, keys: ClientKeys) -> None:
    with LoopbackHost(tmp_path, keys) as host:
        kh = tmp_path / "known_hosts"
        kh.write_text("".join(line + "\n" for line in host.known_hosts_lines()))
        argv = [
            *ssh_argv(keys, kh, "-p", str(host.port)),
            f"{host.user}@{host.addr}",
            "echo ok; id -un",
        ]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
        )
        assert proc.returncode == 0, proc.stderr + host.sshd_log()[-2000:]
        assert proc.stdout.split() == ["ok", host.user]
        host.stop_sshd()
        assert not can_connect(host.addr, host.port)
        host.start_sshd()
        assert (
            subprocess.run(
                argv, capture_output=True, timeout=20, stdin=subprocess.DEVNULL
            ).returncode
            == 0
        )
        with pytest.raises(NotImplementedError):
            host.cut_link()
    assert not can_connect(host.addr, host.port)


def test_a_quick_tier_test_cannot_start_sshd(tmp_path: Path, keys: ClientKeys) -> None:
    """No fixture of this test starts a host, so it is in the quick tier, where conftest's
    guard makes starting an sshd fail with the fix rather than slow the tier down."""
    with pytest.raises(TestbedError, match="not in the netns tier: give the fixture"):
        LoopbackHost(tmp_path, keys)
    started = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and str(tmp_path).encode() in _cmdline(int(pid))
    ]
    assert started == []  # refused before any sshd ran


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


OFFLINE_PROBE = """
import errno, socket
local = socket.getaddrinfo("localhost", 22, type=socket.SOCK_STREAM)[0][4][0]  # /etc/hosts
print("localhost", local in ("127.0.0.1", "::1"))
try:
    socket.getaddrinfo("no-such-host.invalid", 22)
except socket.gaierror as exc:
    print("lookup failed", exc.errno in (socket.EAI_AGAIN, socket.EAI_NONAME))
try:
    socket.create_connection(("127.0.0.1", 22), timeout=5)
except OSError as exc:
    print("connect failed", errno.errorcode.get(exc.errno))
"""


def test_offline_argv_has_no_network() -> None:
    """What Client.vmrun(offline=True) relies on: /etc/hosts answers, a made-up name fails
    to resolve at once, and nothing can be reached, not even loopback."""
    reason = skip_reason_no_offline()
    if reason:
        pytest.skip(reason)
    argv = offline_argv([sys.executable, "-c", OFFLINE_PROBE])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "localhost True",
        "lookup failed True",
        "connect failed ENETUNREACH",
    ]
