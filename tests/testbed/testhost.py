"""TestHost: one host of a NetnsBed (its own netns, hostname, Unix user, home and sshd)."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import TestbedError
from .files import mkdir_shared, write_text
from .host import SshdHost
from .keys import ClientKeys, keygen_wait
from .layout import ETC_NETNS, NETNS_RUN_DIR, NFT_TABLE, Network
from .procs import kill_until_gone, pids_in_netns, run_process, uid_pids
from .tools import (
    HOSTNAME,
    IP,
    MOUNT,
    NFT,
    SETPRIV,
    STD_PATH,
    UNSHARE,
    USER_PATH,
    USERADD,
    ip_batch,
    run_cmd,
)

if TYPE_CHECKING:
    from .netns import NetnsBed

# Host-specific sshd settings (see sshd.COMMON_SETTINGS for the shared ones).
SSHD_SETTINGS = (
    "AddressFamily inet",
    "AuthorizedKeysFile .ssh/authorized_keys",
    "PermitRootLogin no",
    "StrictModes yes",
    "LoginGraceTime 30",
)


class TestHost(SshdHost):
    """One test host: its own netns, UTS hostname, Unix user, home, host keys and sshd.

    Made by :meth:`NetnsBed.add_host`.  Commands (``run``/``popen``) run inside the
    host as root or, with ``as_user``, as its user; cwd defaults to the user's home
    (``as_user``) or ``/``.
    """

    __test__ = False  # not a pytest test class despite the name

    port: int = 22

    def __init__(
        self,
        bed: NetnsBed,
        name: str,
        octet: int,
        networks: list[Network],
        *,
        hosts_file_loopback_hostname: bool,
        sshd_extra_config: str,
        login_user: str | None = None,
        root_login: bool = False,
        mounts: Sequence[tuple[Path, str]] = (),
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
        # A shared login user (cloud.py: one image user on many machines): the user is
        # <prefix>-<login_user> on every such host; its passwd home is a mount point over
        # which each host's prelude binds that host's own ``home``, so every host keeps its
        # own files. Only this host's namespace is killed on stop_sshd(), not the user's
        # processes elsewhere.
        self.shared_user = login_user is not None
        self.login_home = self.home
        if login_user is not None:
            self.user = f"{bed.prefix}-{login_user}"
            self.login_home = bed.home_root / bed.prefix / f"{login_user}.home"
        # A VM reached as root (services.py): root's /root is this host's own ``home`` (the
        # prelude binds it), and like a shared user's, root's processes elsewhere are not
        # this host's.
        self.root_login = root_login
        if root_login:
            self.shared_user = True
            self.user = "root"
            self.login_home = Path("/root")
        self.addrs = [n.addr(octet) for n in networks]
        self.macs = [bed._mac(n.index, octet) for n in networks]
        self.ifnames = [f"eth{i}" for i in range(len(networks))]
        # switch-side veth names (inside the switch namespace, so they cannot collide)
        self.switch_ports = [
            f"{name}-{i}" if len(f"{name}-{i}") <= 15 else f"h{octet}-{i}"
            for i in range(len(networks))
        ]
        super().__init__(
            bed.workdir / name, key_comment=self.hostname, sshd_extra_config=sshd_extra_config
        )
        self.uid = -1
        self.gid = -1
        self._hosts_loopback = hosts_file_loopback_hostname
        self._closing = bed._closing
        self._threads = bed._threads
        self._blocked: set[int] = set()
        self._refused: set[int] = set()
        self._cut: set[str] = set()
        # sh run as root inside the host before each of its commands and its sshd (so every
        # SSH session too), ending in `exec "$@"`: mounts only the host sees (podman.py)
        self.prelude: str | None = None
        binds = [(self.home, str(self.login_home))] if self.shared_user else []
        binds += list(mounts)  # (source, target): folders or files only this host sees
        if binds:
            steps = [f'{MOUNT} --bind "{src}" "{dst}"' for src, dst in binds]
            self.prelude = " && ".join([*steps, 'exec "$@"'])

    def __repr__(self) -> str:
        return f"TestHost({self.name!r}, addr={self.addr}, user={self.user})"

    # ---------------------------------------------------------------- addressing

    @property
    def client_keys(self) -> ClientKeys:  # type: ignore[override]
        return self._bed.client_keys

    @property
    def reachable_from_root(self) -> bool:
        return "main" in self.networks

    def addr_on(self, network: str) -> str:
        return self.addrs[self.networks.index(network)]

    def _known_host_names(self) -> list[str]:
        return list(self.addrs)

    # ---------------------------------------------------------------- commands

    def _command_env(self, as_user: bool, env: dict[str, str] | None) -> dict[str, str]:
        if as_user:
            base = {
                "PATH": USER_PATH,
                "HOME": str(self.login_home),
                "USER": self.user,
                "LOGNAME": self.user,
                "SHELL": "/bin/bash",
            }
        else:
            base = {"PATH": STD_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root"}
        base["LANG"] = "C.UTF-8"
        return {**base, **(env or {})}

    def _default_cwd(self, as_user: bool) -> Path | str:
        return self.login_home if as_user else "/"

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
        if self.prelude is not None:
            inner = ["/bin/sh", "-c", self.prelude, "prelude", *inner]
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

    _command_argv = ns_argv

    def popen(
        self,
        argv: Sequence[str],
        *,
        as_user: bool = False,
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start a background process inside the host (killed by stop_sshd()/close())."""
        kwargs.setdefault("cwd", str(self._default_cwd(as_user)))
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(
            self.ns_argv(argv, as_user=as_user), env=self._command_env(as_user, env), **kwargs
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
        return pids_in_netns(NETNS_RUN_DIR / self.netns)

    def pause(self) -> set[int]:
        """Freeze the host as a hypervisor would: SIGSTOP every process in its namespace,
        again until a round finds none new (one that forked or ended between the listing
        and its signal is caught next round, or was gone). The pids, for `resume`."""
        stopped: set[int] = set()
        try:
            for _ in range(20):  # a round stops every parent: few rounds find anything new
                new = set(self.pids()) - stopped
                if not new:
                    return stopped
                for pid in new:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                stopped |= new
            raise TestbedError(f"{self.name}: processes still starting after 20 SIGSTOP rounds")
        except BaseException:
            self.resume(stopped)  # never a host left half frozen
            raise

    @staticmethod
    def resume(pids: set[int]) -> None:
        """SIGCONT what `pause` stopped (those since ended are skipped)."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def user_pids(self) -> list[int]:
        """Live (non-zombie) processes owned by the host's user, wherever they run (a shared
        user's: only those in this host)."""
        if self.shared_user:
            return sorted(set(uid_pids([self.uid])) & set(self.pids()))
        return uid_pids([self.uid])

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
        ip_batch((f"link set {p} down" for p in ports), netns=self._bed.switch_ns)
        self._cut.update(ports)

    def heal_link(self, network: str | None = None) -> None:
        """Plug the cable(s) back in; addresses and routes were never touched."""
        ports = self._select_ports(network)
        ip_batch((f"link set {p} up" for p in ports), netns=self._bed.switch_ns)
        self._cut.difference_update(ports)

    @property
    def link_cut(self) -> bool:
        return bool(self._cut)

    def _apply_nft(self) -> None:
        # add+delete first so the script works whether or not the table exists (nft 1.0.6
        # has no "destroy"); the whole file is one atomic transaction.
        script = f"add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
        if self._blocked or self._refused:
            rules = [
                f"    tcp dport {{ {', '.join(str(p) for p in sorted(ports))} }} {verdict}\n"
                for ports, verdict in (
                    (self._blocked, "drop"),
                    (self._refused, "reject with tcp reset"),
                )
                if ports
            ]
            script += (
                f"table inet {NFT_TABLE} {{\n"
                "  chain input {\n"
                "    type filter hook input priority filter; policy accept;\n"
                + "".join(rules)
                + "  }\n"
                "}\n"
            )
        proc = run_process(
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
        self._refused.discard(int(port))
        self._apply_nft()

    def refuse_port(self, port: int) -> None:
        """Refuse incoming TCP to ``port`` inside the host (a reset: a service that is down)."""
        self._refused.add(int(port))
        self._apply_nft()

    # ---------------------------------------------------------------- sshd

    def _start_sshd_locked(self, timeout: float) -> None:
        self._launch_sshd(timeout, f"sshd of {self.name}")

    def stop_sshd(self) -> None:
        """Like a crash/reboot: SIGKILL sshd and every process in the host and of its user."""
        with self._lock:
            uid = -1 if self.shared_user else self.uid  # a shared user lives on other hosts

            def everything() -> list[int]:
                return sorted(set(self.pids()) | set(uid_pids([uid] if uid >= 0 else [])))

            kill_until_gone(everything, reap=self._reap_sshd)
            if self._sshd is not None:
                self._sshd.wait()
                self._sshd = None

    # ---------------------------------------------------------------- users

    def add_authorized_key(self, pubkey_line: str) -> None:
        path = self.home / ".ssh" / "authorized_keys"
        with open(path, "a") as f:
            f.write(pubkey_line.strip() + "\n")
        os.chown(path, self.uid, self.gid)
        path.chmod(0o600)

    def _create_user(self, authorized: bool) -> None:
        if self.shared_user:
            self._create_shared_user()
        else:
            self._useradd(self.home)
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700)
        self.home.chmod(0o700)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(self.client_keys.public_line + "\n" if authorized else "")
        keys.chmod(0o600)
        for p in (self.home, ssh_dir, keys):
            os.chown(p, self.uid, self.gid)

    def _create_shared_user(self) -> None:
        """The shared user, made by the first host that has it; the mount point of homes."""
        if self.root_login:
            self.uid = self.gid = 0
            return
        try:
            pw = pwd.getpwnam(self.user)
        except KeyError:
            self._useradd(self.login_home)
        else:
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
        self.login_home.mkdir(mode=0o700, exist_ok=True)
        os.chown(self.login_home, self.uid, self.gid)

    def _useradd(self, home: Path) -> None:
        for attempt in range(50):
            proc = run_cmd(
                [USERADD, "-M", "-d", str(home), "-s", "/bin/bash", "-p", "*", self.user],
                check=False,
            )
            if proc.returncode == 0:
                break
            if proc.returncode != 10 or attempt == 49:  # 10: cannot lock passwd (concurrent)
                raise TestbedError(f"useradd {self.user} failed: {proc.stderr.strip()}")
            time.sleep(0.05)
        pw = pwd.getpwnam(self.user)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid

    # ---------------------------------------------------------------- creation

    def _etc_files(self) -> None:
        """Per-namespace /etc overrides that ``ip netns exec`` bind-mounts over /etc/*."""
        etc = ETC_NETNS / self.netns
        mkdir_shared(etc)
        own = "127.0.1.1" if self._hosts_loopback else self.addr
        write_text(
            etc / "hosts",
            "127.0.0.1\tlocalhost\n"
            f"{own}\t{self.hostname}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n",
        )
        write_text(etc / "hostname", self.hostname + "\n")
        # A closed local resolver: lookups fail at once instead of stalling 10 s.
        write_text(etc / "resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _wire(self) -> None:
        """veths to the bridges (fixed MACs) and permanent neighbour entries everywhere:
        a cut link must never turn into ARP failures."""
        bed = self._bed
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
        ip_batch(sw_lines, netns=bed.switch_ns)
        ip_batch(host_lines, netns=self.netns)
        for other in bed._hosts:
            lines = []
            for i, net in enumerate(self._nets):
                if net.name in other.networks:
                    j = other.networks.index(net.name)
                    lines.append(
                        f"neigh replace {self.addrs[i]} lladdr {self.macs[i]} "
                        f"dev {other.ifnames[j]} nud permanent"
                    )
            ip_batch(lines, netns=other.netns)
        if self.reachable_from_root:
            i = self.networks.index("main")
            ip_batch(
                [
                    f"neigh replace {self.addrs[i]} lladdr {self.macs[i]} "
                    f"dev {bed.root_link} nud permanent"
                ]
            )

    def _create(self, authorized: bool) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        keygens = self._start_host_keygen()  # runs while we wire up the network
        try:
            self._etc_files()
            run_cmd([IP, "netns", "add", self.netns])
            self._wire()
            self._create_user(authorized)
        finally:
            keygen_wait(keygens)
        self._load_host_keys()
        self._write_sshd_config(self.addrs, [f"Port {self.port}", *SSHD_SETTINGS])
        self.start_sshd()
