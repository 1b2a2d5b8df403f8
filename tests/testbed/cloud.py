"""CloudBed: a fake AWS (moto's EC2 server) whose instances are real sshd hosts of a bed.

vmrun's AWS commands run for real against moto's server mode: boto3 over HTTP to
``AWS_ENDPOINT_URL``.  moto's instances are records only, so at exactly that boundary a
**STAND-IN** (in-process patches of moto, never of vmrun) turns each launched instance
into one of the bed's test hosts:

* addresses: the i-th free host's address on "main" is the instance's public IP, its
  address on "vpc" the private IP (moto's made-up 54.x / 172.31.x never exist);
* boot: the host's sshd starts after ``boot_s``, with the instance's cloud-config host key
  (and only that key); for ``refuse_s`` more it answers but refuses every login (no
  authorized_keys yet), then the user data's ``ssh_authorized_keys`` are installed;
* stop/terminate switch the host off (every process in it dies), start boots it again;
* faults: RunInstances answers AWS's own error responses per zone or everywhere;
* placement groups, which moto lacks: create/describe/delete with AWS's error codes;
* security groups (``enforce_security_groups``): each instance's groups become nftables
  rules inside its host;
* losses (:meth:`CloudBed.lose`): a VM gone for real, its host powered off and retired.

moto runs in this process, its listening socket in the laptop's network namespace (the
server thread is started from a thread that entered it with ``setns``), so vmrun, run
there with :meth:`CloudBed.argv`, reaches moto on 127.0.0.1 and nothing but loopback and
the test hosts: any other address fails at once with "Network is unreachable".  With
``listen="main"`` moto listens on the laptop's address on "main" instead, which the
instances reach too (a program on an instance that calls EC2, e.g. a recovery supervisor).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from xml.sax.saxutils import escape

from .errors import TestbedError
from .files import write_text
from .keys import keygen_wait
from .layout import NETNS_RUN_DIR, NFT_TABLE
from .procs import ns_ident, run_process, wait_until
from .testhost import SSHD_SETTINGS
from .tools import IP, NFT, STD_PATH, _which

if TYPE_CHECKING:
    from .netns import NetnsBed
    from .testhost import TestHost

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
ENV = _which("env", "/usr/bin/env")
ACCESS_KEY = "testing"
DLAMI_OWNER = "898082745236"  # Amazon's Deep Learning AMIs
CANONICAL_OWNER = "099720109477"
DLAMI_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) {}"
UBUNTU_NAME = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-{}"
# (key in CloudBed.images, owner, owner alias, name, creation date)
SEEDED_IMAGES = (
    ("dlami", DLAMI_OWNER, "amazon", DLAMI_NAME.format("20260101"), "2026-01-01"),
    ("dlami-old", DLAMI_OWNER, "amazon", DLAMI_NAME.format("20250601"), "2025-06-01"),
    ("ubuntu", CANONICAL_OWNER, None, UBUNTU_NAME.format("20251212"), "2025-12-12"),
)

# RunInstances errors as AWS sends them: HTTP status and message. Capacity errors are
# server errors (500): botocore retries them (legacy mode: 4 retries with backoff) unless
# the client is configured not to.
FAULTS: dict[str, tuple[int, str]] = {
    "InsufficientInstanceCapacity": (
        500,
        "We currently do not have sufficient {type} capacity in the Availability Zone you "
        "requested ({zone}). Our system will be working on provisioning additional capacity. "
        "You can currently get {type} capacity by not specifying an Availability Zone in your "
        "request or choosing {others}.",
    ),
    "VcpuLimitExceeded": (
        400,
        "You have requested more vCPU capacity than your current vCPU limit of 0 allows for "
        "the instance bucket that the specified instance type belongs to. Please visit "
        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.",
    ),
    "InstanceLimitExceeded": (
        400,
        "You have requested more instances ({count}) than your current instance limit of 0 "
        "allows for the specified instance type. Please visit "
        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.",
    ),
    "MaxSpotInstanceCountExceeded": (400, "Max spot instance count exceeded"),
    "Unsupported": (
        400,
        "Your requested instance type ({type}) is not supported in your requested "
        "Availability Zone ({zone}).",
    ),
}

_active: CloudBed | None = None  # the one open CloudBed the moto patches serve
_active_lock = threading.Lock()


# --------------------------------------------------------------------------- namespaces


def _enter_netns(netns: str) -> None:
    """Move the calling thread (only it) into ``netns``; threads it starts stay there."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_RUN_DIR / netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def threads_in_netns(netns: str) -> list[str]:
    """Names (tids) of this process's threads whose network namespace is ``netns``."""
    ident = ns_ident(NETNS_RUN_DIR / netns)
    found = []
    for tid in os.listdir("/proc/self/task"):
        if ident is not None and ns_ident(f"/proc/self/task/{tid}/ns/net") == ident:
            with contextlib.suppress(OSError):
                tid += ":" + Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            found.append(tid)
    return found


# --------------------------------------------------------------------------- user data


@dataclass
class UserData:
    """What the stand-in's "cloud-init" takes from an instance's user data."""

    host_key_private: str | None = None
    host_key_public: str | None = None
    authorized_keys: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: str | None) -> UserData:
        """``raw`` is the RunInstances parameter (base64); only #cloud-config is read."""
        if not raw:
            return cls()
        try:
            text = base64.b64decode(raw).decode()
        except ValueError:
            text = raw
        if not text.startswith("#cloud-config"):
            return cls()
        import yaml  # moto's dependency

        doc = yaml.safe_load(text) or {}
        keys = doc.get("ssh_keys") or {}
        return cls(
            host_key_private=keys.get("ed25519_private"),
            host_key_public=keys.get("ed25519_public"),
            authorized_keys=[str(k).strip() for k in doc.get("ssh_authorized_keys") or []],
        )


# --------------------------------------------------------------------------- the bed


@dataclass
class _Machine:
    """One test host as an EC2 machine: which instance runs on it, and its power state."""

    host: TestHost
    instance_id: str | None = None
    gen: int = 0  # bumped by every power change: a boot thread of an older gen gives up
    booted: bool = False  # a login works
    user_data: UserData = field(default_factory=UserData)
    groups: list[str] = field(default_factory=list)  # security group ids
    backend: Any = None  # moto's EC2 backend that holds the instance
    retired: bool = False  # lost (CloudBed.lose): off for good, never handed out again


class _InNamespace:
    """A boto3 client (or waiter, paginator) whose calls run in the laptop's thread."""

    def __init__(self, cloud: CloudBed, target: Any) -> None:
        self._cloud = cloud
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name == "exceptions" or not callable(value) or isinstance(value, type):
            return value

        def in_namespace(*args: Any, **kwargs: Any) -> Any:
            result = self._cloud.call(value, *args, **kwargs)
            if name == "paginate":  # lazy pages would fetch outside: fetch them all now
                return self._cloud.call(list, result)
            if hasattr(result, "wait") or hasattr(result, "paginate"):
                return _InNamespace(self._cloud, result)
            return result

        return in_namespace


class CloudBed:
    """moto's EC2 server in the laptop's namespace, instances mapped onto bed hosts.

    ``instances`` names the hosts (on "main" and "vpc") that launched instances become,
    in launch order; a terminated instance's host is free again (a fresh disk), a lost
    one's never.  Open one at a time per process (moto's backends and the patches are
    global).  ``listen``: where moto listens, "loopback" (127.0.0.1: the laptop alone
    reaches it) or "main" (the laptop's address on "main": the instances too).
    ``service_hosts``: each machine is a service host (services.py: reached as root, its
    own Slurm and munge folders, which a fresh disk empties, and the systemctl stand-in),
    for `vmrun up --slurm`; the login user is then root.
    ``on_boot(host)`` runs on every first boot of an instance, after its fresh disk and
    before its sshd starts (as root, in a bed thread: chown what it writes to the host's
    user); if it raises, the boot fails (printed; ``wait_booted`` times out).
    """

    def __init__(
        self,
        bed: NetnsBed,
        workdir: Path,
        instances: Sequence[str] = ("n1", "n2"),
        *,
        region: str = "us-east-1",
        user: str = "ubuntu",
        boot_s: float = 0.2,
        refuse_s: float = 0.3,
        enforce_security_groups: bool = False,
        listen: str = "loopback",
        on_boot: Callable[[TestHost], None] | None = None,
        service_hosts: bool = False,
    ) -> None:
        global _active
        if user in instances or "laptop" in instances:
            raise ValueError("instance names may not be 'laptop' or the login user")
        if listen not in ("loopback", "main"):
            raise ValueError(f"listen must be 'loopback' or 'main': {listen!r}")
        with _active_lock:
            if _active is not None:
                raise TestbedError("a CloudBed is open already (one per process)")
            _active = self
        self.bed = bed
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.region = region
        self.boot_s = boot_s
        self.refuse_s = refuse_s
        self.enforce_security_groups = enforce_security_groups
        self.listen = listen
        self.on_boot = on_boot
        self.images: dict[str, str] = {}
        self.api_calls: list[str] = []  # every EC2 action moto answered, in order
        self.poweroff_command = ""  # the machines' power-off (an absolute path), see below
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._machines: list[_Machine] = []
        self._by_id: dict[str, _Machine] = {}
        self._zone_faults: dict[str, tuple[str, bool]] = {}
        self._all_fault: tuple[str, bool] | None = None
        self._placement_groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._instance_group: dict[str, str] = {}  # instance id -> placement group name
        self._clients: list[Any] = []
        self._server: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._ns_thread: int | None = None
        try:
            self.laptop = bed.add_host("laptop")
            self.laptop.stop_sshd()  # the laptop only runs vmrun
            self.service_hosts = service_hosts
            for name in instances:
                self._machines.append(_Machine(self._machine_host(name, user)))
            self.user = self._machines[0].host.user if self._machines else f"{bed.prefix}-{user}"
            self._executor = ThreadPoolExecutor(
                1, thread_name_prefix="cloudbed-laptop", initializer=self._init_thread
            )
            self._make_power_buttons()
            self._start_moto()
            bed.on_close(self.close)
            self._spawn(self._watch_power_buttons, "cloudbed-power")
        except BaseException:
            self.close()
            raise

    def _machine_host(self, name: str, user: str) -> TestHost:
        """A machine's test host, powered off until an instance boots on it."""
        if self.service_hosts:
            from .services import add_service_host

            host = add_service_host(self.bed, name, networks=("main", "vpc"), authorized=False)
        else:
            host = self.bed.add_host(
                name, networks=("main", "vpc"), authorized=False, login_user=user
            )
        host.stop_sshd()
        return host

    # ---------------------------------------------------------------- public API

    @property
    def listen_addr(self) -> str:
        """The address moto listens on: 127.0.0.1, or the laptop's on "main"."""
        return self.laptop.addr_on("main") if self.listen == "main" else "127.0.0.1"

    @property
    def endpoint(self) -> str:
        """moto's URL (``AWS_ENDPOINT_URL``); with listen="main" the instances' too."""
        return f"http://{self.listen_addr}:{self.port}"

    @property
    def ssh_cidr(self) -> str:
        """The laptop's address as /32: what ``vmrun up --ssh-from`` gets."""
        return f"{self.laptop.addr}/32"

    @property
    def hosts(self) -> list[TestHost]:
        return [m.host for m in self._machines]

    def env(self) -> dict[str, str]:
        """The AWS variables vmrun needs (merge into its environment; no AWS_PROFILE)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": ACCESS_KEY,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """``argv`` run as root inside the laptop's namespace; with ``env``, env(1) drops
        AWS_PROFILE and sets ``env`` (e.g. ``cloud.env()``) over the inherited environment."""
        prefix = [IP, "netns", "exec", self.laptop.netns]
        if env is not None:
            prefix += [ENV, "-u", "AWS_PROFILE", *(f"{k}={v}" for k, v in env.items())]
        return [*prefix, *argv]

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the thread that lives in the laptop's namespace."""
        if threading.get_ident() == self._ns_thread:
            return fn(*args, **kwargs)
        if self._executor is None:
            raise TestbedError("CloudBed is closed")
        return self._executor.submit(fn, *args, **kwargs).result()

    def client(self, service: str = "ec2", **config: Any) -> Any:
        """A boto3 client of moto whose calls run in the laptop's namespace.

        ``config``: botocore Config options; by default one attempt per call (no retries).
        """
        import boto3
        from botocore.config import Config

        config.setdefault("retries", {"total_max_attempts": 1})
        real = boto3.client(
            service,
            region_name=self.region,
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=ACCESS_KEY,
            config=Config(**config),
        )
        self._clients.append(real)
        return _InNamespace(self, real)

    def fail_zones(self, faults: Mapping[str, str], *, spot_only: bool = False) -> None:
        """RunInstances in each zone answers that AWS error code (replaces earlier ones;
        ``{}`` clears). ``spot_only``: on-demand launches there still work."""
        with self._lock:
            self._zone_faults = {z: (code, spot_only) for z, code in faults.items()}

    def fail_all(self, code: str | None, *, spot_only: bool = False) -> None:
        """Every RunInstances answers ``code`` (None: no longer)."""
        with self._lock:
            self._all_fault = None if code is None else (code, spot_only)

    def host_of(self, instance_id: str) -> TestHost:
        return self._by_id[instance_id].host

    def lose(self, instance_id: str, *, terminate: bool) -> TestHost:
        """The instance's VM is gone for real: its host powered off (every process killed,
        sshd too: connections to it are refused) and retired, never handed to a later
        instance.  ``terminate``: moto terminates the instance too (a reclaimed spot VM);
        else it stays as it was there, "running" but unreachable (a dead VM), and a later
        start or reboot of it does not bring the host back.  Returns the lost host."""
        with self._lock:
            machine = self._by_id.get(instance_id)
            if machine is None or machine.instance_id != instance_id:
                raise TestbedError(f"{instance_id} is not a live instance of this bed")
            machine.retired = True
            self._power_off(machine)
            if terminate:
                machine.backend.terminate_instances([instance_id])
                machine.instance_id = None
                self._apply_security_groups()  # one member fewer
            return machine.host

    def wait_booted(self, count: int, timeout: float = 10.0) -> list[TestHost]:
        """Wait until ``count`` instances accept logins; returns their hosts."""

        def booted() -> list[TestHost]:
            with self._lock:
                up = [m.host for m in self._machines if m.booted]
            return up if len(up) >= count else []

        return wait_until(booted, timeout, f"{count} instances to boot")

    def instance_hosts(self) -> dict[str, TestHost]:
        """Instance id -> host, for every instance not terminated."""
        with self._lock:
            return {m.instance_id: m.host for m in self._machines if m.instance_id}

    def __enter__(self) -> CloudBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop what it started (by pid and thread), undo the patches; idempotent.

        Raises TestbedError if a thread of this process is still in the laptop's namespace.
        """
        global _active
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
        for thread in self._threads:
            thread.join(timeout=15)
        for m in self._machines:
            with contextlib.suppress(Exception):
                m.host.stop_sshd()
        for client in self._clients:
            with contextlib.suppress(Exception):
                self.call(client.close)
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with _active_lock:
            if _active is self:
                _uninstall_patches()
                _reset_moto()
                _active = None
        laptop = getattr(self, "laptop", None)
        if laptop is not None:
            wait_until(
                lambda: not threads_in_netns(laptop.netns),
                10,
                "threads in the laptop namespace to end",
                interval=0.01,
            )

    # ---------------------------------------------------------------- moto

    def _init_thread(self) -> None:
        _enter_netns(self.laptop.netns)
        self._ns_thread = threading.get_ident()

    def _start_moto(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        _reset_moto()
        _install_patches()
        self._seed_images()
        self._server = ThreadedMotoServer(ip_address=self.listen_addr, port=0, verbose=False)
        self.call(self._server.start)  # its thread (and request threads) in the laptop ns
        self.port = int(self._server.get_host_and_port()[1])

    def _backend(self, account: str | None = None, region: str | None = None) -> Any:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        return ec2_backends[account or DEFAULT_ACCOUNT_ID][region or self.region]

    def _seed_images(self) -> None:
        """The AMIs vmrun looks for (moto's catalog is from 2017), in the default account's
        backend of ``region``: moto's register_image cannot set another owner."""
        from moto.ec2.models.amis import Ami

        backend = self._backend()
        for key, owner, alias, name, date in SEEDED_IMAGES:
            ami_id = "ami-0" + secrets.token_hex(8)[:16]
            backend.amis[ami_id] = Ami(
                backend,
                ami_id,
                name=name,
                description=name,
                owner_id=owner,
                owner_alias=alias,
                public=True,
                virtualization_type="hvm",
                architecture="x86_64",
                root_device_type="ebs",
                region_name=self.region,
                creation_date=datetime.fromisoformat(date).replace(tzinfo=timezone.utc),
            )
            self.images[key] = ami_id

    # ---------------------------------------------------------------- STAND-IN: instances

    def _free_machines(self) -> list[_Machine]:
        return [m for m in self._machines if m.instance_id is None and not m.retired]

    def _on_run_instances(self, resp: Any, original: Callable[[Any], Any]) -> Any:
        count = int(resp._get_param("MinCount", if_none="1"))
        itype = resp._get_param("InstanceType", "m1.small")
        zone = self._zone_of(resp)
        spot = resp._get_param("InstanceMarketOptions.MarketType") == "spot"
        with self._lock:
            fault = self._zone_faults.get(zone) if zone else None
            fault = fault or self._all_fault
        if fault and (spot or not fault[1]):
            return self._fault(resp, fault[0], itype=itype, zone=zone, count=count)
        group = resp._get_param("Placement.GroupName")
        if group and group not in self._groups(resp):
            return aws_error(
                "InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown."
            )
        with self._lock:
            free = self._free_machines()
            if len(free) < count:
                return aws_error(
                    "TestbedOutOfHosts",
                    f"the test bed has {len(free)} free hosts, RunInstances asked for {count}",
                )
            result = original(resp)
            user_data = UserData.parse(resp._get_param("UserData"))
            key_name = resp._get_param("KeyName")
            if key_name:  # an imported key pair: the image's cloud-init authorizes it
                pair = resp.ec2_backend.describe_key_pairs([key_name])[0]
                user_data.authorized_keys.append(pair.material_public.decode().strip())
            for instance, machine in zip(result.result.instances, free, strict=False):
                machine.instance_id = instance.id
                machine.backend = resp.ec2_backend
                machine.user_data = user_data
                machine.groups = [g.id for g in instance.security_groups]
                self._by_id[instance.id] = machine
                if group:
                    self._instance_group[instance.id] = group
                self._set_addresses(instance, machine)
                self._power_on(machine, first=True)
        return result

    def _on_power(self, resp: Any, original: Callable[[Any], Any], action: str) -> Any:
        result = original(resp)
        with self._lock:
            for instance_id in resp._get_param("InstanceIds", []):
                machine = self._by_id.get(instance_id)
                if machine is None or machine.instance_id != instance_id:
                    continue
                if action in ("stop", "terminate", "reboot"):
                    self._power_off(machine)
                if action == "terminate":
                    machine.instance_id = None  # the host is free for a new instance
                    self._apply_security_groups()  # one member fewer
                if action in ("start", "reboot") and not machine.retired:
                    self._set_addresses(resp.ec2_backend.get_instance(instance_id), machine)
                    self._power_on(machine, first=False)
        return result

    def _set_addresses(self, instance: Any, machine: _Machine) -> None:
        nic = instance.nics[0]
        private = machine.host.addr_on("vpc")
        nic.private_ip_address = private
        nic.private_ip_addresses = [{"Primary": True, "PrivateIpAddress": private}]
        if nic.public_ip is not None:  # moto gave it one: the subnet maps public addresses
            nic.public_ip = machine.host.addr_on("main")

    def _power_off(self, machine: _Machine) -> None:
        machine.gen += 1
        machine.booted = False
        machine.host.stop_sshd()  # every process of the machine dies

    def _power_on(self, machine: _Machine, *, first: bool) -> None:
        machine.gen += 1
        self._spawn(self._boot, f"cloudbed-boot-{machine.host.name}", machine, machine.gen, first)

    def _boot(self, machine: _Machine, gen: int, first: bool) -> None:
        """The machine boots: a fresh disk (first boot), host key, sshd, then the keys."""
        host = machine.host

        def current() -> bool:
            return machine.gen == gen and not self._closing.is_set()

        try:
            if first:
                self._fresh_disk(machine)
                if self.on_boot is not None:
                    self.on_boot(host)
            if self._closing.wait(self.boot_s):
                return
            with self._lock:
                if not current():
                    return
                self._apply_security_groups()  # before sshd answers
                host.start_sshd()
            if first:
                if self._closing.wait(self.refuse_s):
                    return
                with self._lock:
                    if not current():
                        return
                    for line in machine.user_data.authorized_keys:
                        host.add_authorized_key(line)
            with self._lock:
                if current():
                    machine.booted = True
        except Exception as exc:  # shows in the test's output; wait_booted times out
            print(f"cloudbed: boot of {host.name} failed: {exc!r}")

    def _make_power_buttons(self) -> None:
        """The STAND-IN power-off (``poweroff_command``): a script any user of a machine may
        run; it writes to the machine's button file, which a thread of the bed watches."""
        power = self.bed.home_root / self.bed.prefix / "power"
        power.mkdir(mode=0o755)
        for m in self._machines:
            button = power / m.host.name
            button.touch(mode=0o600)
            os.chown(button, m.host.uid, m.host.gid)
        script = power / "poweroff"
        write_text(
            script,
            "#!/bin/sh\n"
            "# STAND-IN power-off of a CloudBed machine: the bed stops (or terminates, as the\n"
            "# instance's InstanceInitiatedShutdownBehavior says) the instance; delays are\n"
            "# ignored, -c cancels nothing.\n"
            'case " $* " in *" -c "*) exit 0 ;; esac\n'
            f'h=$(hostname) && echo "$*" >> "{power}/${{h#vmt-}}"\n',
            0o755,
        )
        self.poweroff_command = str(script)
        self._power = power

    def _watch_power_buttons(self) -> None:
        while not self._closing.wait(0.05):
            for m in self._machines:
                button = self._power / m.host.name
                with contextlib.suppress(OSError):
                    if m.instance_id and button.stat().st_size:
                        button.write_text("")
                        self._powered_off_from_inside(m)

    def _powered_off_from_inside(self, machine: _Machine) -> None:
        with self._lock:
            instance_id = machine.instance_id
            if instance_id is None:
                return
            self._power_off(machine)  # first: once moto says so, the machine is off
            instance = machine.backend.get_instance(instance_id)
            if instance.instance_initiated_shutdown_behavior == "terminate":
                machine.backend.terminate_instances([instance_id])
                machine.instance_id = None
                self._apply_security_groups()
            else:
                machine.backend.stop_instances([instance_id])

    def _spawn(self, target: Callable[..., object], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        self._threads.append(thread)
        thread.start()

    def _fresh_disk(self, machine: _Machine) -> None:
        """Empty home with an empty authorized_keys; the user data's host key, or a new one."""
        host = machine.host
        for child in list(host.home.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        if self.service_hosts:
            from .services import fresh_system

            fresh_system(self.bed, host.name)
        ssh_dir = host.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text("")
        (ssh_dir / "authorized_keys").chmod(0o600)
        for p in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(p, host.uid, host.gid)
        key = host.dir / "ssh_host_ed25519_key"
        pub = key.with_name(key.name + ".pub")
        data = machine.user_data
        if data.host_key_private and data.host_key_public:
            write_text(key, data.host_key_private.rstrip("\n") + "\n", 0o600)
            write_text(pub, data.host_key_public.strip() + "\n", 0o644)
        else:  # no key handed in: cloud-init makes one
            from .keys import _keygen_popen

            keygen_wait([_keygen_popen(key, "ed25519", host.hostname)])
        (self._power / host.name).write_text("")  # nobody pressed this machine's button
        _apply_nft(host, None)  # a fresh machine: its security groups come at boot
        host.host_key_files = [key]  # only this key: what the instance's sshd offers
        host._load_host_keys()
        host._write_sshd_config(host.addrs, [f"Port {host.port}", *SSHD_SETTINGS])

    # ---------------------------------------------------------------- STAND-IN: faults

    def _zone_of(self, resp: Any) -> str:
        zone = resp._get_param("Placement.AvailabilityZone")
        if zone:
            return str(zone)
        subnet_id = resp._get_param("SubnetId")
        if not subnet_id:
            nics = resp._get_param("NetworkInterfaces", []) or []
            subnet_id = next((n.get("SubnetId") for n in nics if n.get("SubnetId")), None)
        if subnet_id:
            return str(resp.ec2_backend.get_subnet(subnet_id).availability_zone)
        return f"{resp.region}a"  # where moto puts it

    def _fault(self, resp: Any, code: str, *, itype: str, zone: str, count: int) -> Any:
        status, template = FAULTS.get(code, (400, f"{code} (from the test bed)"))
        zones = [z.name for z in resp.ec2_backend.describe_availability_zones()]
        others = ", ".join(z for z in zones if z != zone and z not in self._zone_faults)
        message = template.format(type=itype, zone=zone, others=others, count=count)
        return aws_error(code, message, status)

    # ---------------------------------------------------------------- STAND-IN: placement

    def _groups(self, resp: Any) -> dict[str, dict[str, Any]]:
        return self._placement_groups.setdefault((resp.current_account, resp.region), {})

    def _create_placement_group(self, resp: Any) -> Any:
        from moto.core.responses import ActionResult

        name = resp._get_param("GroupName")
        strategy = resp._get_param("Strategy")
        if not name:
            return aws_error("MissingParameter", "The request must contain the parameter groupName")
        tags = resp._parse_tag_specification().get("placement-group", {})
        with self._lock:
            groups = self._groups(resp)
            if name in groups:
                return aws_error(
                    "InvalidPlacementGroup.Duplicate",
                    f"The Placement Group '{name}' already exists.",
                )
            group_id = "pg-" + secrets.token_hex(9)[:17]
            group: dict[str, Any] = {
                "GroupName": name,
                "GroupId": group_id,
                "State": "available",
                "Strategy": strategy,
                "GroupArn": f"arn:aws:ec2:{resp.region}:{resp.current_account}"
                f":placement-group/{name}",
                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
            }
            if strategy == "partition":
                group["PartitionCount"] = int(resp._get_param("PartitionCount") or 2)
            groups[name] = group
        return ActionResult({"PlacementGroup": group})

    def _describe_placement_groups(self, resp: Any) -> Any:
        from moto.core.responses import ActionResult

        names = resp._get_param("GroupNames", []) or []
        ids = resp._get_param("GroupIds", []) or []
        filters = resp._filters_from_querystring()
        with self._lock:
            groups = list(self._groups(resp).values())
        for name in names:
            if not any(g["GroupName"] == name for g in groups):
                return aws_error(
                    "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
                )
        for group_id in ids:
            if not any(g["GroupId"] == group_id for g in groups):
                return aws_error(
                    "InvalidPlacementGroupId.NotFound",
                    f"The Placement Group ID '{group_id}' does not exist",
                )
        found = [
            g
            for g in groups
            if (not names or g["GroupName"] in names)
            and (not ids or g["GroupId"] in ids)
            and all(_group_matches(g, k, v) for k, v in filters.items())
        ]
        return ActionResult({"PlacementGroups": found})

    def _delete_placement_group(self, resp: Any) -> Any:
        from moto.core.responses import EmptyResult

        name = resp._get_param("GroupName")
        with self._lock:
            groups = self._groups(resp)
            if name not in groups:
                return aws_error(
                    "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
                )
            for instance_id, group in self._instance_group.items():
                if group != name:
                    continue
                with contextlib.suppress(Exception):
                    state = resp.ec2_backend.get_instance(instance_id).state
                    if state != "terminated":
                        return aws_error(
                            "InvalidPlacementGroup.InUse",
                            f"The placement group '{name}' is in use and may not be deleted.",
                        )
            del groups[name]
        return EmptyResult()

    # ---------------------------------------------------------------- STAND-IN: security groups

    def _apply_security_groups(self) -> None:
        """Each machine's security groups as nftables rules in its namespace (call with the
        lock held): a rule's ports from its CIDR, or from the private addresses of the
        members of the group it names; everything else is dropped, as on EC2."""
        if not self.enforce_security_groups:
            return
        backend = self._backend()
        members: dict[str, list[str]] = {}
        for m in self._machines:
            if m.instance_id:
                for gid in m.groups:
                    members.setdefault(gid, []).append(m.host.addr_on("vpc"))
        for m in self._machines:
            if m.instance_id:
                rules = []
                for gid in m.groups:
                    sg = backend.get_security_group_from_id(gid)
                    if sg is not None:
                        rules += _nft_rules(sg, members)
                _apply_nft(m.host, rules)

    def _on_security_group_change(self, resp: Any, original: Callable[[Any], Any]) -> Any:
        result = original(resp)
        with self._lock:
            self._apply_security_groups()
        return result


# --------------------------------------------------------------------------- helpers


def aws_error(code: str, message: str, status: int = 400) -> tuple[int, dict[str, Any], str]:
    """An EC2 error response exactly as AWS writes it (what botocore parses)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
    return status, {"status": status, "Content-Type": "text/xml;charset=UTF-8"}, body


def _group_matches(group: dict[str, Any], name: str, values: Iterable[str]) -> bool:
    values = list(values)
    tags = {t["Key"]: t["Value"] for t in group.get("Tags", [])}
    if name.startswith("tag:"):
        return tags.get(name[4:]) in values
    if name == "tag-key":
        return any(v in tags for v in values)
    field_of = {
        "group-name": "GroupName",
        "state": "State",
        "strategy": "Strategy",
        "group-arn": "GroupArn",
    }
    if name in field_of:
        return group.get(field_of[name]) in values
    return True


def _nft_rules(sg: Any, members: Mapping[str, list[str]]) -> list[str]:
    """nftables accept rules for a security group's ingress rules (one source per rule)."""
    rules = []
    for rule in sg.ingress_rules:
        proto = str(rule.ip_protocol or "").lower()
        if proto in ("-1", "all"):
            match = ""
        elif proto in ("tcp", "udp", "6", "17"):
            name = {"6": "tcp", "17": "udp"}.get(proto, proto)
            lo, hi = rule.from_port, rule.to_port
            match = f"{name} dport {lo if lo == hi else f'{lo}-{hi}'} "
        else:
            continue
        sources = [rule.ip_range["CidrIp"]] if rule.ip_range.get("CidrIp") else []
        sources += members.get(rule.source_group.get("GroupId", ""), [])
        rules += [f"ip saddr {src} {match}accept" for src in sources]
    return rules


def _apply_nft(host: TestHost, rules: list[str] | None) -> None:
    """The host's security group table: ``rules`` then drop; None removes the table."""
    table = f"{NFT_TABLE}_sg"
    script = f"add table inet {table}\ndelete table inet {table}\n"
    if rules is not None:
        body = "".join(f"    {r}\n" for r in rules)
        script += (
            f"table inet {table} {{\n  chain input {{\n"
            "    type filter hook input priority filter - 1; policy drop;\n"
            "    iif lo accept\n    ct state established,related accept\n"
            f"{body}  }}\n}}\n"
        )
    proc = run_process(
        [IP, "netns", "exec", host.netns, NFT, "-f", "-"],
        env={"PATH": STD_PATH},
        cwd="/",
        input=script,
        timeout=30,
        check=False,
        text=True,
    )
    if proc.returncode != 0:
        raise TestbedError(f"nft failed in {host.netns}: {proc.stderr.strip()}\n{script}")


# --------------------------------------------------------------------------- moto patches

_PATCHED: dict[str, Any] = {}  # name -> what EC2Response had before (None: inherited)


def _dispatch(name: str) -> Callable[..., Any]:
    """A method for moto's EC2Response that hands the request to the open CloudBed."""
    from moto.ec2.responses import EC2Response

    original = getattr(EC2Response, name, None)

    def method(resp: Any) -> Any:
        cloud = _active
        if cloud is None:
            if original is None:
                raise NotImplementedError(name)
            return original(resp)
        if name == "run_instances":
            return cloud._on_run_instances(resp, original)
        if name.endswith("_placement_group") or name == "describe_placement_groups":
            return getattr(cloud, "_" + name)(resp)
        if name.endswith("_security_group_ingress"):
            return cloud._on_security_group_change(resp, original)
        if name == "call_action":
            cloud.api_calls.append(resp._get_action())
            return original(resp)
        return cloud._on_power(resp, original, name.split("_")[0])

    method.__name__ = name
    return method


def _install_patches() -> None:
    from moto.ec2.responses import EC2Response

    names = (
        "call_action",
        "run_instances",
        "stop_instances",
        "start_instances",
        "terminate_instances",
        "reboot_instances",
        "create_placement_group",
        "describe_placement_groups",
        "delete_placement_group",
        "authorize_security_group_ingress",
        "revoke_security_group_ingress",
    )
    for name in names:
        if name not in _PATCHED:
            _PATCHED[name] = EC2Response.__dict__.get(name)
            setattr(EC2Response, name, _dispatch(name))


def _uninstall_patches() -> None:
    from moto.ec2.responses import EC2Response

    for name, before in _PATCHED.items():
        if before is None:
            delattr(EC2Response, name)
        else:
            setattr(EC2Response, name, before)
    _PATCHED.clear()


def _reset_moto() -> None:
    from moto.ec2.models import ec2_backends

    ec2_backends.reset()
