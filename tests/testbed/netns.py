"""NetnsBed: real OpenSSH servers as test hosts, one network namespace per host.

Why namespaces: vmrun drives machines over SSH, and the only honest way to test
that is against real ``sshd`` processes with real users, homes, host keys and a
real network that can be cut, blocked and rebooted.  Everything a bed creates
is named ``<prefix>-...`` (prefix like ``vmt1a2b``) and recorded in
``/run/vmrun-testbed/<prefix>.json`` together with the creating pid, so
leftovers of a crashed run can always be recognised and removed
(:func:`~testbed.registry.cleanup_stale`).  See README.md for the layout.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from . import registry
from .errors import TestbedError
from .files import mkdir_shared
from .keys import ClientKeys
from .layout import (
    DEFAULT_HOME_ROOT,
    DEFAULT_PREFIX_PATTERN,
    ETC_NETNS,
    FIRST_HOST_OCTET,
    HOST_NAME_RE,
    NET_NAME_RE,
    PREFIX_RE,
    ROUTE_PROTO,
    SUPERNET,
    SWITCH_SUFFIX,
    Network,
    guard_routes,
    mac,
    root_ns_subnets,
    route_metric,
)
from .testhost import TestHost
from .tools import IP, NETNS_TOOLS, ip_batch, run_cmd

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
        for tool in NETNS_TOOLS:
            if not os.access(tool, os.X_OK):
                reason = f"NetnsBed needs {tool}"
                break
    if reason is None:
        probe = f"vmtprobe{os.getpid()}"
        proc = run_cmd([IP, "netns", "add", probe], check=False)
        if proc.returncode != 0:
            reason = f"`ip netns add` does not work here: {proc.stderr.strip()}"
        else:
            run_cmd([IP, "netns", "del", probe], check=False)
    _netns_probe["reason"] = reason
    return reason


def have_root_netns() -> bool:
    """True when NetnsBed can be used (root, tools present, ``ip netns`` works)."""
    return skip_reason_no_netns() is None


# --------------------------------------------------------------------------- the bed


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
        if prefix is not None and not PREFIX_RE.match(prefix):
            raise ValueError(f"prefix must match {PREFIX_RE.pattern}: {prefix!r}")
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client_keys = client_keys
        self.home_root = Path(home_root)
        self._hosts: list[TestHost] = []
        self._networks: dict[str, Network] = {}
        self._closing = threading.Event()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._on_close: list[Callable[[], object]] = []
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        with registry.registry_lock():
            if sweep_stale:
                registry.cleanup_stale_locked(DEFAULT_PREFIX_PATTERN, self.home_root)
            self.prefix = prefix or registry.new_prefix()
            if prefix is not None and registry.prefix_in_use(prefix, self.home_root):
                raise TestbedError(f"prefix {prefix!r} is in use (or has leftovers)")
            self._write_state()
        atexit.register(self._atexit_close)
        self.switch_ns = f"{self.prefix}-{SWITCH_SUFFIX}"
        self.root_link = f"{self.prefix}-r"
        try:
            mkdir_shared(self.home_root / self.prefix)
            for p in (self.home_root, self.home_root / self.prefix):
                p.chmod(0o755)  # other users must traverse to their homes
            run_cmd([IP, "netns", "add", self.switch_ns])
            # Belt and braces: no netfilter on bridged frames inside the switch namespace.
            run_cmd(
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
            metric = route_metric(self.prefix)
            if metric not in guard_routes():
                run_cmd(
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

    def _write_state(self) -> None:
        registry.write_state(
            self.prefix,
            workdir=str(self.workdir),
            home_root=str(self.home_root),
            subnets={n.name: n.octet for n in self._networks.values()},
            hosts=[h.name for h in self._hosts],
        )

    def _mac(self, net_index: int, host_octet: int) -> str:
        return mac(self.prefix, net_index, host_octet)

    def _network(self, name: str) -> Network:
        """The network called ``name``, creating its bridge (and /24) on first use."""
        if name in self._networks:
            return self._networks[name]
        if not NET_NAME_RE.match(name):
            raise ValueError(f"bad network name {name!r}")
        with registry.registry_lock():
            used = root_ns_subnets()
            for prefix, state in registry.read_states().items():
                if prefix != self.prefix and registry.state_owner_alive(state):
                    used.update(int(v) for v in state.get("subnets", {}).values())
            used.update(n.octet for n in self._networks.values())
            free = [k for k in range(256) if k not in used]
            if not free:
                raise TestbedError(f"no free /24 left in {SUPERNET}.0.0/16")
            net = Network(name, len(self._networks), free[0], f"br{len(self._networks)}")
            self._networks[name] = net
            self._write_state()
        ip_batch(
            [
                f"link add {net.bridge} address {self._mac(net.index, 0)} type bridge stp_state 0",
                f"link set {net.bridge} addrgenmode none",
                f"link set {net.bridge} up",
            ],
            netns=self.switch_ns,
        )
        if net.index == 0:
            # the root namespace's only foothold: <prefix>-r with .1 on "main"
            ip_batch(
                [
                    f"link add {self.root_link} address {self._mac(0, 1)} type veth "
                    f"peer name root netns {self.switch_ns}",
                    f"link set {self.root_link} addrgenmode none",
                    f"addr add {net.addr(1)}/24 dev {self.root_link}",
                    f"link set {self.root_link} up",
                ]
            )
            ip_batch(
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
        login_user: str | None = None,
        root_login: bool = False,
        mounts: Sequence[tuple[Path, str]] = (),
    ) -> TestHost:
        """Create a host and start its sshd; returns once port 22 accepts connections.

        ``networks[0]`` provides ``host.addr``.  ``sshd_extra_config`` lines are put
        before the bed's defaults, so they override them.  ``login_user``: the host's
        user is ``<prefix>-<login_user>``, shared with every host given the same name,
        each with its own home (like one image's user on separate machines).
        ``root_login``: the host is reached as root, whose /root is the host's own home
        (sshd_extra_config must permit it).  ``mounts``: (source, target) pairs bound in
        the host's mount namespace before its sshd and each of its commands.
        """
        with self._lock:
            if self._closed:
                raise TestbedError("bed is closed")
            if not HOST_NAME_RE.match(name) or name == SWITCH_SUFFIX:
                raise ValueError(f"host name must match {HOST_NAME_RE.pattern}: {name!r}")
            if any(h.name == name for h in self._hosts):
                raise ValueError(f"host {name!r} exists")
            if login_user is not None and not HOST_NAME_RE.match(login_user):
                raise ValueError(f"login user must match {HOST_NAME_RE.pattern}: {login_user!r}")
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
                login_user=login_user,
                root_login=root_login,
                mounts=mounts,
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
        ip_batch([f"netns del {host.netns}"], force=True)
        if not host.shared_user:  # other hosts may use a shared one
            with contextlib.suppress(Exception):
                registry.userdel(host.user)
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

    def on_close(self, callback: Callable[[], object]) -> None:
        """``callback()`` runs first when the bed closes (what lives outside its names:
        threads, servers in this process)."""
        self._on_close.append(callback)

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
            errors = []
            for callback in reversed(self._on_close):
                try:
                    callback()
                except Exception as exc:
                    errors.append(f"{callback!r}: {exc}")
            for thread in self._threads:
                thread.join(timeout=15)

            def reap() -> None:
                for h in self._hosts:
                    h._reap_sshd()

            with registry.registry_lock():
                problems = registry.destroy_prefix(self.prefix, self.home_root, reap=reap)
            for h in self._hosts:
                if h._sshd is not None:
                    with contextlib.suppress(Exception):
                        h._sshd.wait(timeout=5)
                    h._sshd = None
            self._closed = True
            atexit.unregister(self._atexit_close)
        problems = errors + problems
        if problems:
            raise TestbedError(f"bed {self.prefix} not fully cleaned: " + "; ".join(problems))

    def _atexit_close(self) -> None:
        if os.getpid() != self._owner_pid:
            return  # a forked child exiting must not tear down its parent's bed
        try:
            self.close()
        except Exception as exc:  # atexit: report, never mask the real exit status
            print(f"vmrun testbed: cleanup of {self.prefix} failed: {exc}")
