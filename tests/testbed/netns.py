"""Real OpenSSH servers as test hosts, one network namespace per host.

Why namespaces: vmrun drives machines over SSH, and the only honest way to test
that is against real ``sshd`` processes with real users, homes, host keys and a
real network that can be cut, blocked and rebooted.  Everything a bed creates
is named ``<prefix>-...`` (prefix like ``vmt1a2b``) and recorded in
``/run/vmrun-testbed/<prefix>.json`` together with the creating pid, so
leftovers of a crashed run can always be recognised and removed
(:func:`cleanup_stale`).  See README.md for the layout.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "ClientKeys",
    "NetnsBed",
    "TestHost",
    "TestbedError",
    "can_connect",
    "cleanup_on_sigterm",
    "cleanup_stale",
    "have_root_netns",
    "skip_reason_no_netns",
    "wait_until",
]

T = TypeVar("T")

STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


def _which(name: str, fallback: str) -> str:
    return shutil.which(name, path=STD_PATH) or fallback


IP = _which("ip", "/usr/sbin/ip")
NFT = _which("nft", "/usr/sbin/nft")
UNSHARE = _which("unshare", "/usr/bin/unshare")
SETPRIV = _which("setpriv", "/usr/bin/setpriv")
HOSTNAME = _which("hostname", "/usr/bin/hostname")
SSH_KEYGEN = _which("ssh-keygen", "/usr/bin/ssh-keygen")
USERADD = _which("useradd", "/usr/sbin/useradd")
USERDEL = _which("userdel", "/usr/sbin/userdel")
SSHD = "/usr/sbin/sshd"  # sshd insists on an absolute path (it re-execs itself)
SFTP_SERVER = "/usr/lib/openssh/sftp-server"

STATE_DIR = Path("/run/vmrun-testbed")
NETNS_RUN_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
DEFAULT_HOME_ROOT = Path("/home/vmt-testbed")
SUPERNET = "10.231"  # every bed network is a /24 out of 10.231.0.0/16
DEFAULT_PREFIX_PATTERN = r"vmt[0-9a-f]{4}"
NFT_TABLE = "vmt_testbed"
ROUTE_PROTO = 231  # marks the bed's root-namespace "unreachable 10.231.0.0/16" routes
FIRST_HOST_OCTET = 11
SWITCH_SUFFIX = "sw"

_HOST_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,22}$")  # user name <prefix>-<name> stays <= 32
_NET_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{2,9}$")  # no '-': "<prefix>-" must be unambiguous


class TestbedError(RuntimeError):
    """The test bed itself failed (not the code under test)."""

    __test__ = False  # not a pytest test class despite the name


# --------------------------------------------------------------------------- helpers


def _cmd(
    argv: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """Run a bed-internal command; failures carry stderr so they can be diagnosed."""
    env = {"PATH": STD_PATH, "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run(
            list(argv), input=input, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"timed out after {timeout}s: {' '.join(argv)}") from exc
    if check and proc.returncode != 0:
        raise TestbedError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n"
            f"{proc.stderr.strip()}\n{proc.stdout.strip()}".rstrip()
        )
    return proc


def _ip_batch(lines: Iterable[str], *, netns: str | None = None, force: bool = False) -> None:
    """Run many ``ip`` commands in one process: one exec instead of dozens keeps beds fast."""
    text = "\n".join(lines)
    if not text:
        return
    argv = [IP]
    if netns:
        argv += ["-n", netns]
    if force:
        argv.append("-force")
    argv += ["-batch", "-"]
    _cmd(argv, input=text + "\n", check=not force)


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy; never sleep-and-hope."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TestbedError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def can_connect(addr: str, port: int = 22, timeout: float = 1.0) -> bool:
    """TCP connect from the calling process's namespace (the root namespace)."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def _write_text(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def _mkdir(path: Path, mode: int = 0o755) -> None:
    """mkdir -p that survives a concurrent bed rmdir'ing an (empty) shared parent."""
    for _ in range(20):
        try:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    path.mkdir(mode=mode, parents=True, exist_ok=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


# --------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the comm field (index 0 = state)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """True for a live process; zombies count as dead (nobody may ever reap them)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X", "x")


def _pid_starttime(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def _all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _ns_ident(path: Path | str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def netns_pids(netns: str) -> list[int]:
    """Live pids whose network namespace is ``/run/netns/<netns>`` (like ``ip netns pids``)."""
    ident = _ns_ident(NETNS_RUN_DIR / netns)
    return [] if ident is None else _pids_in_netns_idents({ident})


def _pids_in_netns_idents(idents: set[tuple[int, int]]) -> list[int]:
    if not idents:
        return []
    found = []
    for pid in _all_pids():
        if _ns_ident(f"/proc/{pid}/ns/net") in idents and pid_alive(pid):
            found.append(pid)
    return found


def uid_pids(uids: Iterable[int]) -> list[int]:
    """Live pids whose real or effective uid is one of ``uids``."""
    wanted = set(uids)
    if not wanted:
        return []
    found = []
    for pid in _all_pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                real, effective = (int(x) for x in line.split()[1:3])
                if (real in wanted or effective in wanted) and pid_alive(pid):
                    found.append(pid)
                break
    return found


def _kill_until_gone(
    list_pids: Callable[[], list[int]],
    *,
    timeout: float = 10.0,
    reap: Callable[[], None] | None = None,
) -> None:
    """SIGKILL by pid, repeatedly, until the listing is empty (processes may fork meanwhile)."""
    protected = {0, 1, os.getpid(), os.getppid()}
    deadline = time.monotonic() + timeout
    while True:
        if reap:
            reap()
        pids = [p for p in list_pids() if p not in protected]
        if not pids:
            return
        if time.monotonic() >= deadline:
            raise TestbedError(f"processes survived SIGKILL for {timeout}s: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _run_process(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    input: bytes | str | None,
    timeout: float | None,
    check: bool,
    text: bool,
) -> subprocess.CompletedProcess[Any]:
    """Like subprocess.run, but a timeout kills the whole process group, not just the leader."""
    if isinstance(input, str) and not text:
        input = input.encode()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        text=text,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            # something that left our process group (setsid) still holds the pipes
            out, err = None, None
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            proc.wait()
        raise subprocess.TimeoutExpired(argv, timeout or 0, out, err) from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result


# --------------------------------------------------------------------------- keys


def _keygen_popen(path: Path, key_type: str, comment: str) -> subprocess.Popen[bytes]:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    argv = [SSH_KEYGEN, "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)]
    if key_type == "ecdsa":
        argv[4:4] = ["-b", "256"]
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _keygen_wait(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise TestbedError(f"ssh-keygen failed: {proc.args}: {out.decode(errors='replace')}")


def _pub_line(pub_path: Path) -> str:
    """'TYPE BASE64' of a .pub file, comment dropped (known_hosts lines add their own name)."""
    key_type, b64 = pub_path.read_text().split()[:2]
    return f"{key_type} {b64}"


@dataclass(frozen=True)
class ClientKeys:
    """An ed25519 client key pair for the test process (made with ssh-keygen, no passphrase)."""

    private: Path
    public: Path

    @classmethod
    def generate(cls, directory: Path, name: str = "id_ed25519") -> ClientKeys:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        private = directory / name
        _keygen_wait([_keygen_popen(private, "ed25519", "vmrun-testbed-client")])
        private.chmod(0o600)
        return cls(private=private, public=private.with_name(name + ".pub"))

    @property
    def public_line(self) -> str:
        """The authorized_keys line for this key."""
        return self.public.read_text().strip()


# --------------------------------------------------------------------------- registry


def _ensure_state_dir() -> None:
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    """Serialise prefix/subnet allocation and sweeping between concurrent beds (and processes)."""
    _ensure_state_dir()
    fd = os.open(STATE_DIR / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_states() -> dict[str, dict[str, Any]]:
    states: dict[str, dict[str, Any]] = {}
    if not STATE_DIR.is_dir():
        return states
    for path in STATE_DIR.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        states[path.stem] = data
    return states


def _state_owner_alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    return _pid_starttime(pid) == state.get("starttime")


def _root_ns_subnets() -> set[int]:
    """Third octets of 10.231.x.y addresses already used in the root namespace."""
    out = _cmd([IP, "-4", "-o", "addr", "show"], check=False).stdout
    used = set()
    for m in re.finditer(r"inet 10\.231\.(\d+)\.\d+/", out):
        used.add(int(m.group(1)))
    return used


def _names_with_prefix(names: Iterable[str], pattern: str) -> set[str]:
    rx = re.compile(rf"^({pattern})-")
    return {m.group(1) for n in names if (m := rx.match(n))}


def _route_metric(prefix: str) -> int:
    """Per-bed metric of its ``unreachable 10.231.0.0/16`` route, derived from the prefix
    so that cleanup needs no memory (unique for the default ``vmt<4 hex>`` prefixes)."""
    m = re.fullmatch(r"vmt([0-9a-f]{4})", prefix)
    if m:
        return 231_000_000 + int(m.group(1), 16)
    return 231_065_536 + zlib.crc32(prefix.encode()) % 900_000


def _guard_routes() -> dict[int, str]:
    """metric -> route line of every guard route in the root namespace."""
    out = _cmd([IP, "-4", "-o", "route", "show", "type", "unreachable"], check=False).stdout
    found = {}
    for line in out.splitlines():
        m = re.search(rf"{SUPERNET}\.0\.0/16 .*proto {ROUTE_PROTO} .*metric (\d+)", line)
        if m:
            found[int(m.group(1))] = line.strip()
    return found


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _prefix_resources(prefix: str, home_root: Path) -> dict[str, list[Any]]:
    """Everything on the machine that belongs to ``prefix`` (found by name, not by memory)."""
    head = prefix + "-"
    namespaces = sorted(n for n in _listdir(NETNS_RUN_DIR) if n.startswith(head))
    # host namespaces first, the switch last (it holds the bridges the hosts plug into)
    namespaces.sort(key=lambda n: n == f"{head}{SWITCH_SUFFIX}")
    users = [pw for pw in pwd.getpwall() if pw.pw_name.startswith(head)]
    links = [n for n in _listdir(Path("/sys/class/net")) if n.startswith(head)]
    etc_dirs = [ETC_NETNS / n for n in _listdir(ETC_NETNS) if n.startswith(head)]
    homes = [home_root / prefix] if (home_root / prefix).exists() else []
    homes += [Path(pw.pw_dir) for pw in users if Path(pw.pw_dir).exists()]
    return {
        "namespaces": namespaces,
        "users": users,
        "links": links,
        "etc_dirs": etc_dirs,
        "homes": homes,
    }


def _userdel(name: str) -> None:
    """userdel, retrying while another process holds the passwd lock."""
    for attempt in range(50):
        proc = _cmd([USERDEL, name], check=False)
        if proc.returncode in (0, 6):  # 6: no such user
            return
        if proc.returncode == 8:  # user logged in: kill raced a fork; force it
            _cmd([USERDEL, "-f", name], check=False)
            return
        if attempt == 49:
            raise TestbedError(f"userdel {name} failed: {proc.stderr.strip()}")
        time.sleep(0.05)


def _destroy_prefix(
    prefix: str, home_root: Path, reap: Callable[[], None] | None = None
) -> list[str]:
    """Remove every trace of ``prefix``; tolerant of half-made beds.  Returns what survived."""
    res = _prefix_resources(prefix, home_root)
    idents = {i for n in res["namespaces"] if (i := _ns_ident(NETNS_RUN_DIR / n))}
    uids = {pw.pw_uid for pw in res["users"]}

    def everything() -> list[int]:
        return sorted(set(_pids_in_netns_idents(idents)) | set(uid_pids(uids)))

    problems: list[str] = []
    try:
        _kill_until_gone(everything, reap=reap)
    except TestbedError as exc:
        problems.append(str(exc))
    # Root-namespace links first and explicitly: namespace teardown in the kernel is
    # asynchronous, an explicit delete is not.
    _ip_batch((f"link del {n}" for n in res["links"]), force=True)
    if (metric := _route_metric(prefix)) in _guard_routes():
        _ip_batch([f"route del unreachable {SUPERNET}.0.0/16 metric {metric}"], force=True)
    _ip_batch((f"netns del {n}" for n in res["namespaces"]), force=True)
    for pw in res["users"]:
        try:
            _userdel(pw.pw_name)
        except TestbedError as exc:
            problems.append(str(exc))
    for path in res["homes"] + res["etc_dirs"]:
        shutil.rmtree(path, ignore_errors=True)
    for empty_dir in (home_root, ETC_NETNS):
        with contextlib.suppress(OSError):
            empty_dir.rmdir()  # only succeeds when no other bed uses it
    (STATE_DIR / f"{prefix}.json").unlink(missing_ok=True)

    left = _prefix_resources(prefix, home_root)
    for kind, items in left.items():
        if items:
            problems.append(f"{kind} left: {items}")
    if _route_metric(prefix) in _guard_routes():
        problems.append("guard route left")
    if idents and (pids := _pids_in_netns_idents(idents)):
        problems.append(f"processes left in namespaces: {pids}")
    return problems


def cleanup_stale(
    prefix_pattern: str = DEFAULT_PREFIX_PATTERN, home_root: Path = DEFAULT_HOME_ROOT
) -> list[str]:
    """Remove leftovers of beds whose creating process is dead; returns the prefixes removed.

    A prefix counts as live only while its state file names a running pid with the
    same start time (so pid reuse cannot keep garbage alive).  Resources matching
    ``<prefix_pattern>-`` with no state file at all are leftovers too.
    """
    if os.geteuid() != 0:
        return []
    with _registry_lock():
        return _cleanup_stale_locked(prefix_pattern, home_root)


def _cleanup_stale_locked(prefix_pattern: str, home_root: Path) -> list[str]:
    rx = re.compile(rf"^(?:{prefix_pattern})$")
    states = {p: s for p, s in _read_states().items() if rx.match(p)}
    live = {p for p, s in states.items() if _state_owner_alive(s)}
    candidates = set(states)
    candidates |= _names_with_prefix(_listdir(NETNS_RUN_DIR), prefix_pattern)
    candidates |= _names_with_prefix((pw.pw_name for pw in pwd.getpwall()), prefix_pattern)
    candidates |= _names_with_prefix(_listdir(Path("/sys/class/net")), prefix_pattern)
    candidates |= _names_with_prefix(_listdir(ETC_NETNS), prefix_pattern)
    candidates |= {n for n in _listdir(home_root) if rx.match(n)}
    removed = []
    for prefix in sorted(candidates - live):
        state_home = states.get(prefix, {}).get("home_root")
        _destroy_prefix(prefix, Path(state_home) if state_home else home_root)
        removed.append(prefix)
    # probe namespaces of skip_reason_no_netns() whose process died mid-probe
    for name in _listdir(NETNS_RUN_DIR):
        m = re.fullmatch(r"vmtprobe(\d+)", name)
        if m and not pid_alive(int(m.group(1))):
            _ip_batch([f"netns del {name}"], force=True)
    # guard routes nobody owns any more (their bed's prefix no longer known at all)
    live_metrics = {_route_metric(p) for p, s in _read_states().items() if _state_owner_alive(s)}
    orphans = set(_guard_routes()) - live_metrics
    _ip_batch((f"route del unreachable {SUPERNET}.0.0/16 metric {m}" for m in orphans), force=True)
    return removed


def cleanup_on_sigterm() -> bool:
    """Opt-in: turn SIGTERM into KeyboardInterrupt so pytest still runs its teardown.

    ``timeout 900 pytest`` ends with SIGTERM, which skips atexit and fixture teardown;
    the next bed would sweep the leftovers, but this removes them at once.  Only
    installs itself over the default handler, in the main thread.  Returns whether it did.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    return True


# --------------------------------------------------------------------------- capability


_netns_probe: dict[str, str | None] = {}  # "reason" -> None (usable) or why not; probed once


def skip_reason_no_netns() -> str | None:
    """Why NetnsBed cannot run here (a pytest skip reason), or None if it can."""
    if "reason" in _netns_probe:
        return _netns_probe["reason"]
    reason: str | None = None
    if os.geteuid() != 0:
        reason = "NetnsBed needs root (network namespaces, useradd)"
    else:
        for tool in (IP, NFT, UNSHARE, SETPRIV, HOSTNAME, SSH_KEYGEN, USERADD, USERDEL, SSHD):
            if not os.access(tool, os.X_OK):
                reason = f"NetnsBed needs {tool}"
                break
    if reason is None:
        probe = f"vmtprobe{os.getpid()}"
        proc = _cmd([IP, "netns", "add", probe], check=False)
        if proc.returncode != 0:
            reason = f"`ip netns add` does not work here: {proc.stderr.strip()}"
        else:
            _cmd([IP, "netns", "del", probe], check=False)
    _netns_probe["reason"] = reason
    return reason


def have_root_netns() -> bool:
    """True when NetnsBed can be used (root, tools present, ``ip netns`` works)."""
    return skip_reason_no_netns() is None


# --------------------------------------------------------------------------- hosts


@dataclass
class _Network:
    name: str
    index: int  # 0 = main
    octet: int  # third octet: 10.231.<octet>.0/24
    bridge: str

    def addr(self, host_octet: int) -> str:
        return f"{SUPERNET}.{self.octet}.{host_octet}"


class TestHost:
    """One test host: its own netns, UTS hostname, Unix user, home, host keys and sshd."""

    __test__ = False  # not a pytest test class despite the name

    port: int = 22

    def __init__(
        self,
        bed: NetnsBed,
        name: str,
        octet: int,
        networks: list[_Network],
        *,
        hosts_file_loopback_hostname: bool,
        sshd_extra_config: str,
    ) -> None:
        self._bed = bed
        self.name = name
        self.octet = octet
        self.networks = [n.name for n in networks]
        self._nets = networks
        self.netns = f"{bed.prefix}-{name}"
        self.user = self.netns
        self.hostname = f"vmt-{name}"
        self.home = bed.home_root / bed.prefix / name
        self.addrs = [n.addr(octet) for n in networks]
        self.macs = [bed._mac(n.index, octet) for n in networks]
        self.ifnames = [f"eth{i}" for i in range(len(networks))]
        # switch-side veth names (inside the switch namespace, so they cannot collide)
        self.switch_ports = [
            f"{name}-{i}" if len(f"{name}-{i}") <= 15 else f"h{octet}-{i}"
            for i in range(len(networks))
        ]
        self.dir = bed.workdir / name
        self.host_key_files = [self.dir / "ssh_host_ed25519_key", self.dir / "ssh_host_ecdsa_key"]
        self.host_key_pub_lines: list[str] = []
        self.sshd_config_path = self.dir / "sshd_config"
        self.sshd_log_path = self.dir / "sshd.log"
        self.uid = -1
        self.gid = -1
        self._hosts_loopback = hosts_file_loopback_hostname
        self._sshd_extra = sshd_extra_config
        self._sshd: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self._blocked: set[int] = set()
        self._cut: set[str] = set()

    def __repr__(self) -> str:
        return f"TestHost({self.name!r}, addr={self.addr}, user={self.user})"

    # ---------------------------------------------------------------- addressing

    @property
    def addr(self) -> str:
        """Primary address: on the first network given to add_host (normally 'main')."""
        return self.addrs[0]

    @property
    def reachable_from_root(self) -> bool:
        return "main" in self.networks

    def addr_on(self, network: str) -> str:
        return self.addrs[self.networks.index(network)]

    def known_hosts_lines(self, extra_names: Sequence[str] = ()) -> list[str]:
        """known_hosts lines for every address of the host (plus ``extra_names``)."""
        names = [*self.addrs, *extra_names]
        return [f"{n} {key}" for n in names for key in self.host_key_pub_lines]

    def ssh_config_block(
        self,
        alias: str | None = None,
        identity: Path | None = None,
        *,
        proxy_jump: str | None = None,
        extra: Sequence[str] = (),
    ) -> str:
        """A ``Host`` block; identity defaults to the bed's client key."""
        identity = identity or self._bed.client_keys.private
        lines = [
            f"Host {alias or self.name}",
            f"    HostName {self.addr}",
            f"    User {self.user}",
            f"    Port {self.port}",
            f"    IdentityFile {identity}",
            "    IdentitiesOnly yes",
        ]
        if proxy_jump:
            lines.append(f"    ProxyJump {proxy_jump}")
        lines += [f"    {x}" for x in extra]
        return "\n".join(lines) + "\n"

    # ---------------------------------------------------------------- commands

    def _env(self, as_user: bool, env: dict[str, str] | None) -> dict[str, str]:
        if as_user:
            base = {
                "PATH": USER_PATH,
                "HOME": str(self.home),
                "USER": self.user,
                "LOGNAME": self.user,
                "SHELL": "/bin/bash",
            }
        else:
            base = {"PATH": STD_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root"}
        base["LANG"] = "C.UTF-8"
        return {**base, **(env or {})}

    def ns_argv(self, argv: Sequence[str], *, as_user: bool = False) -> list[str]:
        """argv that runs ``argv`` inside this host (netns + its UTS hostname [+ its user]).

        Every step execs (no forks), so the returned pid *is* the command: timeouts and
        kills by pid reach it.  setpriv is used instead of runuser for that reason
        (runuser forks a child and waits for it).
        """
        inner = list(argv)
        if as_user:
            inner = [
                SETPRIV,
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--init-groups",
                "--",
                *inner,
            ]
        return [
            IP,
            "netns",
            "exec",
            self.netns,
            UNSHARE,
            "--uts",
            "--",
            "/bin/sh",
            "-c",
            f'{HOSTNAME} "$0" && exec "$@"',
            self.hostname,
            *inner,
        ]

    def run(
        self,
        argv: Sequence[str],
        *,
        as_user: bool = False,
        check: bool = True,
        timeout: float = 30,
        input: bytes | str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        text: bool = False,
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` inside the host, as root or (``as_user``) as the host's user.

        The environment is a clean login-like one (PATH, HOME, USER, LOGNAME, LANG),
        not the test process's.  cwd defaults to the user's home (as_user) or ``/``.
        On timeout the whole process group is SIGKILLed and TimeoutExpired raised.
        """
        if cwd is None:
            cwd = self.home if as_user else "/"
        return _run_process(
            self.ns_argv(argv, as_user=as_user),
            env=self._env(as_user, env),
            cwd=str(cwd),
            input=input,
            timeout=timeout,
            check=check,
            text=text,
        )

    def popen(
        self,
        argv: Sequence[str],
        *,
        as_user: bool = False,
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start a background process inside the host (killed by stop_sshd()/close())."""
        kwargs.setdefault("cwd", str(self.home if as_user else "/"))
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(
            self.ns_argv(argv, as_user=as_user), env=self._env(as_user, env), **kwargs
        )

    def can_connect(self, addr: str, port: int = 22, timeout: float = 1.0) -> bool:
        """TCP connect from inside this host (bash /dev/tcp, bounded by ``timeout``)."""
        script = f"exec 3<>/dev/tcp/{addr}/{port}"
        proc = self.run(
            ["timeout", str(timeout), "bash", "-c", script], check=False, timeout=timeout + 10
        )
        return proc.returncode == 0

    def pids(self) -> list[int]:
        """All live pids in the host's network namespace."""
        return netns_pids(self.netns)

    def user_pids(self) -> list[int]:
        """Live (non-zombie) processes owned by the host's user, wherever they run."""
        return uid_pids([self.uid])

    def sshd_pid(self) -> int | None:
        proc = self._sshd
        return proc.pid if proc is not None and proc.poll() is None else None

    def sshd_log(self) -> str:
        try:
            return self.sshd_log_path.read_text(errors="replace")
        except OSError:
            return ""

    # ---------------------------------------------------------------- network faults

    def _select_ports(self, network: str | None) -> list[str]:
        if network is None:
            return list(self.switch_ports)
        return [self.switch_ports[self.networks.index(network)]]

    def cut_link(self, network: str | None = None) -> None:
        """Unplug the host's cable(s): its bridge port goes down, packets vanish silently.

        Neighbour (ARP) entries are permanent on every side, so there is no ARP
        failure either: peers see pure timeouts, never RST or EHOSTUNREACH.
        """
        ports = self._select_ports(network)
        _ip_batch((f"link set {p} down" for p in ports), netns=self._bed.switch_ns)
        self._cut.update(ports)

    def heal_link(self, network: str | None = None) -> None:
        """Plug the cable(s) back in; addresses and routes were never touched."""
        ports = self._select_ports(network)
        _ip_batch((f"link set {p} up" for p in ports), netns=self._bed.switch_ns)
        self._cut.difference_update(ports)

    @property
    def link_cut(self) -> bool:
        return bool(self._cut)

    def _apply_nft(self) -> None:
        # add+delete first so the script works whether or not the table exists (nft 1.0.6
        # has no "destroy"); the whole file is one atomic transaction.
        script = f"add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
        if self._blocked:
            ports = ", ".join(str(p) for p in sorted(self._blocked))
            script += (
                f"table inet {NFT_TABLE} {{\n"
                "  chain input {\n"
                "    type filter hook input priority filter; policy accept;\n"
                f"    tcp dport {{ {ports} }} drop\n"
                "  }\n"
                "}\n"
            )
        proc = _run_process(
            [IP, "netns", "exec", self.netns, NFT, "-f", "-"],
            env={"PATH": STD_PATH},
            cwd="/",
            input=script,
            timeout=30,
            check=False,
            text=True,
        )
        if proc.returncode != 0:
            raise TestbedError(f"nft failed in {self.netns}: {proc.stderr.strip()}\n{script}")

    def block_port(self, port: int) -> None:
        """Silently DROP incoming TCP to ``port`` inside the host (connects time out)."""
        self._blocked.add(int(port))
        self._apply_nft()

    def unblock_port(self, port: int) -> None:
        self._blocked.discard(int(port))
        self._apply_nft()

    # ---------------------------------------------------------------- sshd

    def _write_sshd_config(self) -> None:
        lines = [f"ListenAddress {a}" for a in self.addrs]
        lines += [f"HostKey {k}" for k in self.host_key_files]
        lines += [
            f"Port {self.port}",
            "AddressFamily inet",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin no",
            "StrictModes yes",
            "PidFile none",
            "UseDNS no",
            f"Subsystem sftp {SFTP_SERVER}",
            "PermitUserEnvironment no",
            "MaxStartups 100",
            "MaxSessions 64",
            "LoginGraceTime 30",
            "LogLevel VERBOSE",
            "ClientAliveInterval 0",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
        ]
        text = "\n".join(lines) + "\n"
        if self._sshd_extra:
            # sshd keeps the first value it sees: extra lines go first so they win
            text = self._sshd_extra.rstrip("\n") + "\n" + text
        _write_text(self.sshd_config_path, text, 0o600)

    def start_sshd(self, timeout: float = 10.0) -> None:
        """Start sshd (foreground, never daemonised) and wait until it accepts TCP."""
        with self._lock:
            if self.sshd_pid() is not None:
                return
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
            offset = self.sshd_log_path.stat().st_size if self.sshd_log_path.exists() else 0
            with open(self.sshd_log_path, "ab") as log:
                self._sshd = subprocess.Popen(
                    self.ns_argv([SSHD, "-D", "-e", "-f", str(self.sshd_config_path)]),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env={"PATH": STD_PATH, "LANG": "C.UTF-8"},
                    cwd="/",
                    start_new_session=True,
                )
            proc = self._sshd

            def listening() -> bool:
                if proc.poll() is not None:
                    tail = self.sshd_log()[offset:][-2000:]
                    raise TestbedError(f"sshd of {self.name} exited rc={proc.returncode}:\n{tail}")
                with open(self.sshd_log_path, "rb") as f:
                    f.seek(offset)
                    return f.read().count(b"Server listening on") >= len(self.addrs)

            # "Server listening" is logged after listen(), so from then on the port accepts
            # TCP.  No probe connection: sshd.log then holds only the tests' connections.
            wait_until(listening, timeout, f"sshd of {self.name} to listen", interval=0.005)

    def _reap_sshd(self) -> None:
        if self._sshd is not None:
            self._sshd.poll()

    def stop_sshd(self) -> None:
        """Like a crash/reboot: SIGKILL sshd and every process in the host and of its user."""
        with self._lock:
            uid = self.uid

            def everything() -> list[int]:
                return sorted(set(self.pids()) | set(uid_pids([uid] if uid >= 0 else [])))

            _kill_until_gone(everything, reap=self._reap_sshd)
            if self._sshd is not None:
                self._sshd.wait()
                self._sshd = None

    def restart_sshd(self) -> None:
        self.stop_sshd()
        self.start_sshd()

    def reboot_later(self, down_seconds: float) -> threading.Thread:
        """stop_sshd() now, start_sshd() after ``down_seconds`` in a background thread."""
        self.stop_sshd()
        closing = self._bed._closing

        def later() -> None:
            if not closing.wait(down_seconds):
                with self._lock:
                    if not closing.is_set():
                        self.start_sshd()

        thread = threading.Thread(target=later, name=f"reboot-{self.name}", daemon=True)
        self._bed._threads.append(thread)
        thread.start()
        return thread

    def _generate_host_keys(self) -> list[subprocess.Popen[bytes]]:
        return [
            _keygen_popen(self.host_key_files[0], "ed25519", self.hostname),
            _keygen_popen(self.host_key_files[1], "ecdsa", self.hostname),
        ]

    def _load_host_keys(self) -> None:
        self.host_key_pub_lines = [
            _pub_line(k.with_name(k.name + ".pub")) for k in self.host_key_files
        ]

    def replace_host_keys(self) -> None:
        """New host keys + sshd restart (sessions drop): for "host key changed" tests."""
        with self._lock:
            self.stop_sshd()
            _keygen_wait(self._generate_host_keys())
            self._load_host_keys()
            self.start_sshd()

    # ---------------------------------------------------------------- users

    def add_authorized_key(self, pubkey_line: str) -> None:
        path = self.home / ".ssh" / "authorized_keys"
        with open(path, "a") as f:
            f.write(pubkey_line.strip() + "\n")
        os.chown(path, self.uid, self.gid)
        path.chmod(0o600)

    def _create_user(self, authorized: bool) -> None:
        for attempt in range(50):
            proc = _cmd(
                [USERADD, "-M", "-d", str(self.home), "-s", "/bin/bash", "-p", "*", self.user],
                check=False,
            )
            if proc.returncode == 0:
                break
            if proc.returncode != 10 or attempt == 49:  # 10: cannot lock passwd (concurrent)
                raise TestbedError(f"useradd {self.user} failed: {proc.stderr.strip()}")
            time.sleep(0.05)
        pw = pwd.getpwnam(self.user)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700)
        self.home.chmod(0o700)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(self._bed.client_keys.public_line + "\n" if authorized else "")
        keys.chmod(0o600)
        for p in (self.home, ssh_dir, keys):
            os.chown(p, self.uid, self.gid)

    # ---------------------------------------------------------------- creation

    def _etc_files(self) -> None:
        """Per-namespace /etc overrides that ``ip netns exec`` bind-mounts over /etc/*."""
        etc = ETC_NETNS / self.netns
        _mkdir(etc)
        own = "127.0.1.1" if self._hosts_loopback else self.addr
        _write_text(
            etc / "hosts",
            "127.0.0.1\tlocalhost\n"
            f"{own}\t{self.hostname}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n",
        )
        _write_text(etc / "hostname", self.hostname + "\n")
        # A closed local resolver: lookups fail at once instead of stalling 10 s.
        _write_text(etc / "resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _create(self, authorized: bool) -> None:
        bed = self._bed
        self.dir.mkdir(parents=True, exist_ok=True)
        keygens = self._generate_host_keys()  # runs while we wire up the network
        try:
            self._etc_files()
            _cmd([IP, "netns", "add", self.netns])
            # veths: switch-side port + eth<i> inside the host, with fixed MACs
            sw_lines = []
            host_lines = ["link set lo up"]
            for i, net in enumerate(self._nets):
                port, ifname = self.switch_ports[i], self.ifnames[i]
                sw_lines += [
                    f"link add {port} type veth peer name {ifname} netns {self.netns} "
                    f"address {self.macs[i]}",
                    f"link set {port} addrgenmode none",
                    f"link set {port} master {net.bridge} up",
                ]
                host_lines += [
                    f"link set {ifname} addrgenmode none",
                    f"addr add {self.addrs[i]}/24 dev {ifname}",
                    f"link set {ifname} up",
                ]
                # permanent neighbours: a cut link must not turn into ARP failures
                for other in bed._hosts:
                    if net.name in other.networks:
                        j = other.networks.index(net.name)
                        host_lines.append(
                            f"neigh replace {other.addrs[j]} lladdr "
                            f"{other.macs[j]} dev {ifname} nud permanent"
                        )
                if net.index == 0:
                    host_lines.append(
                        f"neigh replace {net.addr(1)} lladdr "
                        f"{bed._mac(0, 1)} dev {ifname} nud permanent"
                    )
            _ip_batch(sw_lines, netns=bed.switch_ns)
            _ip_batch(host_lines, netns=self.netns)
            for other in bed._hosts:
                lines = []
                for i, net in enumerate(self._nets):
                    if net.name in other.networks:
                        j = other.networks.index(net.name)
                        lines.append(
                            f"neigh replace {self.addrs[i]} lladdr {self.macs[i]} "
                            f"dev {other.ifnames[j]} nud permanent"
                        )
                _ip_batch(lines, netns=other.netns)
            if self.reachable_from_root:
                i = self.networks.index("main")
                _ip_batch(
                    [
                        f"neigh replace {self.addrs[i]} lladdr {self.macs[i]} "
                        f"dev {bed.root_link} nud permanent"
                    ]
                )
            self._create_user(authorized)
        finally:
            _keygen_wait(keygens)
        self._load_host_keys()
        self._write_sshd_config()
        self.start_sshd()


class NetnsBed:
    """A set of TestHosts on private bridges; a context manager that leaves nothing behind.

    Layout: one "switch" namespace ``<prefix>-sw`` holds a bridge per network, so the
    root namespace's firewall and ``bridge-nf-call-iptables`` never see host-to-host
    traffic.  The root namespace gets a single veth ``<prefix>-r`` with ``.1`` on the
    "main" network; other networks have no foothold in the root namespace at all.
    """

    def __init__(
        self,
        workdir: Path,
        client_keys: ClientKeys,
        prefix: str | None = None,
        *,
        home_root: Path = DEFAULT_HOME_ROOT,
        sweep_stale: bool = True,
    ) -> None:
        reason = skip_reason_no_netns()
        if reason:
            raise TestbedError(reason)
        if prefix is not None and not _PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must match {_PREFIX_RE.pattern}: {prefix!r}")
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client_keys = client_keys
        self.home_root = Path(home_root)
        self._hosts: list[TestHost] = []
        self._networks: dict[str, _Network] = {}
        self._closing = threading.Event()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        with _registry_lock():
            if sweep_stale:
                _cleanup_stale_locked(DEFAULT_PREFIX_PATTERN, self.home_root)
            self.prefix = prefix or self._new_prefix()
            if prefix is not None and (
                (STATE_DIR / f"{prefix}.json").exists()
                or any(_prefix_resources(prefix, self.home_root).values())
            ):
                raise TestbedError(f"prefix {prefix!r} is in use (or has leftovers)")
            self._write_state()
        atexit.register(self._atexit_close)
        self.switch_ns = f"{self.prefix}-{SWITCH_SUFFIX}"
        self.root_link = f"{self.prefix}-r"
        mac_seed = zlib.crc32(self.prefix.encode())
        self._mac_bytes = (mac_seed >> 8 & 0xFF, mac_seed & 0xFF)
        try:
            _mkdir(self.home_root / self.prefix)
            for p in (self.home_root, self.home_root / self.prefix):
                p.chmod(0o755)  # other users must traverse to their homes
            _cmd([IP, "netns", "add", self.switch_ns])
            # Belt and braces: no netfilter on bridged frames inside the switch namespace.
            _cmd(
                [
                    IP,
                    "netns",
                    "exec",
                    self.switch_ns,
                    "/bin/sh",
                    "-c",
                    "for f in /proc/sys/net/bridge/bridge-nf-call-*; do "
                    "[ -w $f ] && echo 0 > $f; done; true",
                ],
                check=False,
            )
            self._network("main")
            # Guard route: 10.231/16 outside "main" is unreachable from the root namespace,
            # so traffic to inner networks fails at once instead of leaving via the
            # default route (on some machines the outside even answers every TCP SYN).
            metric = _route_metric(self.prefix)
            if metric not in _guard_routes():
                _cmd(
                    [
                        IP,
                        "route",
                        "add",
                        "unreachable",
                        f"{SUPERNET}.0.0/16",
                        "proto",
                        str(ROUTE_PROTO),
                        "metric",
                        str(metric),
                    ]
                )
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- bookkeeping

    @staticmethod
    def _new_prefix() -> str:
        while True:
            prefix = "vmt" + secrets.token_hex(2)
            if not (STATE_DIR / f"{prefix}.json").exists() and not any(
                _prefix_resources(prefix, DEFAULT_HOME_ROOT).values()
            ):
                return prefix

    def _write_state(self) -> None:
        _ensure_state_dir()
        state = {
            "prefix": self.prefix,
            "pid": os.getpid(),
            "starttime": _pid_starttime(os.getpid()),
            "workdir": str(self.workdir),
            "home_root": str(self.home_root),
            "subnets": {n.name: n.octet for n in self._networks.values()},
            "hosts": [h.name for h in self._hosts],
        }
        _write_atomic(STATE_DIR / f"{self.prefix}.json", json.dumps(state, indent=1) + "\n")

    def _mac(self, net_index: int, host_octet: int) -> str:
        a, b = self._mac_bytes
        return f"02:{a:02x}:{b:02x}:{net_index:02x}:00:{host_octet:02x}"

    def _network(self, name: str) -> _Network:
        """The network called ``name``, creating its bridge (and /24) on first use."""
        if name in self._networks:
            return self._networks[name]
        if not _NET_NAME_RE.match(name):
            raise ValueError(f"bad network name {name!r}")
        with _registry_lock():
            used = _root_ns_subnets()
            for prefix, state in _read_states().items():
                if prefix != self.prefix and _state_owner_alive(state):
                    used.update(int(v) for v in state.get("subnets", {}).values())
            used.update(n.octet for n in self._networks.values())
            free = [k for k in range(256) if k not in used]
            if not free:
                raise TestbedError(f"no free /24 left in {SUPERNET}.0.0/16")
            net = _Network(name, len(self._networks), free[0], f"br{len(self._networks)}")
            self._networks[name] = net
            self._write_state()
        _ip_batch(
            [
                f"link add {net.bridge} address {self._mac(net.index, 0)} type bridge stp_state 0",
                f"link set {net.bridge} addrgenmode none",
                f"link set {net.bridge} up",
            ],
            netns=self.switch_ns,
        )
        if net.index == 0:
            # the root namespace's only foothold: <prefix>-r with .1 on "main"
            _ip_batch(
                [
                    f"link add {self.root_link} address {self._mac(0, 1)} type veth "
                    f"peer name root netns {self.switch_ns}",
                    f"link set {self.root_link} addrgenmode none",
                    f"addr add {net.addr(1)}/24 dev {self.root_link}",
                    f"link set {self.root_link} up",
                ]
            )
            _ip_batch(
                ["link set root addrgenmode none", f"link set root master {net.bridge} up"],
                netns=self.switch_ns,
            )
        return net

    # ---------------------------------------------------------------- public API

    def add_host(
        self,
        name: str,
        *,
        networks: tuple[str, ...] = ("main",),
        authorized: bool = True,
        hosts_file_loopback_hostname: bool = False,
        sshd_extra_config: str = "",
    ) -> TestHost:
        """Create a host and start its sshd; returns once port 22 accepts connections.

        ``networks[0]`` provides ``host.addr``.  ``sshd_extra_config`` lines are put
        before the bed's defaults, so they override them.
        """
        with self._lock:
            if self._closed:
                raise TestbedError("bed is closed")
            if not _HOST_NAME_RE.match(name) or name == SWITCH_SUFFIX:
                raise ValueError(f"host name must match {_HOST_NAME_RE.pattern}: {name!r}")
            if any(h.name == name for h in self._hosts):
                raise ValueError(f"host {name!r} exists")
            if not networks or len(set(networks)) != len(networks):
                raise ValueError(f"bad networks {networks!r}")
            octet = FIRST_HOST_OCTET + len(self._hosts)
            if octet > 254:
                raise TestbedError("too many hosts in one bed")
            nets = [self._network(n) for n in networks]
            host = TestHost(
                self,
                name,
                octet,
                nets,
                hosts_file_loopback_hostname=hosts_file_loopback_hostname,
                sshd_extra_config=sshd_extra_config,
            )
            try:
                host._create(authorized)
            except BaseException:
                self._destroy_host(host)
                raise
            self._hosts.append(host)
            self._write_state()
            return host

    def _destroy_host(self, host: TestHost) -> None:
        """Best-effort removal of one (possibly half-made) host, so its name can be reused."""
        with contextlib.suppress(Exception):
            host.stop_sshd()
        _ip_batch([f"netns del {host.netns}"], force=True)
        with contextlib.suppress(Exception):
            _userdel(host.user)
        shutil.rmtree(host.home, ignore_errors=True)
        shutil.rmtree(ETC_NETNS / host.netns, ignore_errors=True)

    def hosts(self) -> list[TestHost]:
        return list(self._hosts)

    def host(self, name: str) -> TestHost:
        for h in self._hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    __getitem__ = host

    def network_cidr(self, name: str = "main") -> str:
        return f"{SUPERNET}.{self._networks[name].octet}.0/24"

    @property
    def root_addr(self) -> str:
        """The root namespace's address on "main" (where the test process talks from)."""
        return self._networks["main"].addr(1)

    def jump_host_for(self, host: TestHost) -> TestHost | None:
        """A host on "main" that shares a network with ``host`` (for ProxyJump), if needed."""
        if host.reachable_from_root:
            return None
        for candidate in self._hosts:
            if candidate.reachable_from_root and set(candidate.networks) & set(host.networks):
                return candidate
        return None

    def ssh_config_text(
        self, identity: Path | None = None, *, known_hosts: Path | None = None
    ) -> str:
        """ssh_config with a Host block per host (alias = host.name).

        Hosts not on "main" get ``ProxyJump <bastion>`` automatically.  With
        ``known_hosts``, a trailing ``Host *`` block pins it with strict checking.
        """
        blocks = []
        for h in self._hosts:
            jump = self.jump_host_for(h)
            blocks.append(
                h.ssh_config_block(identity=identity, proxy_jump=jump.name if jump else None)
            )
        if known_hosts is not None:
            blocks.append(
                "Host *\n"
                f"    UserKnownHostsFile {known_hosts}\n"
                "    GlobalKnownHostsFile /dev/null\n"
                "    StrictHostKeyChecking yes\n"
            )
        return "\n".join(blocks)

    def known_hosts_text(self) -> str:
        return "".join(line + "\n" for h in self._hosts for line in h.known_hosts_lines())

    def __enter__(self) -> NetnsBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process of the bed by pid, then delete namespaces, links, users, files.

        Idempotent.  Works from names (``<prefix>-*``), not from memory, so half-made
        hosts are removed too.  Raises TestbedError if anything survived.
        """
        with self._lock:
            if self._closed:
                return
            self._closing.set()
            for thread in self._threads:
                thread.join(timeout=15)

            def reap() -> None:
                for h in self._hosts:
                    h._reap_sshd()

            with _registry_lock():
                problems = _destroy_prefix(self.prefix, self.home_root, reap=reap)
            for h in self._hosts:
                if h._sshd is not None:
                    with contextlib.suppress(Exception):
                        h._sshd.wait(timeout=5)
                    h._sshd = None
            self._closed = True
            atexit.unregister(self._atexit_close)
        if problems:
            raise TestbedError(f"bed {self.prefix} not fully cleaned: " + "; ".join(problems))

    def _atexit_close(self) -> None:
        if os.getpid() != self._owner_pid:
            return  # a forked child exiting must not tear down its parent's bed
        try:
            self.close()
        except Exception as exc:  # atexit: report, never mask the real exit status
            print(f"vmrun testbed: cleanup of {self.prefix} failed: {exc}")
