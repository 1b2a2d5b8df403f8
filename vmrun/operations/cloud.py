"""`vmrun up NAME` and `vmrun down NAME`: from a cloud account to SSH-ready hosts recorded in
vmrun.toml as group @NAME, and back to nothing billing.

`up` pins each VM's host key before the first connection (vmrun makes the key and hands it
in with the user data), waits until SSH really logs in, and records the hosts with their
private addresses (multi-node traffic stays inside the cluster). Anything that fails, or
Ctrl-C, after the first resource was made removes everything made, unless `keep` is asked.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.config import CLOUDS, Settings
from vmrun.errors import (
    AuthError,
    CloudError,
    ConnectionLostError,
    HostKeyError,
    UnreachableError,
    UsageError,
)
from vmrun.reporting import QUIET, Reporter
from vmrun.ssh.inventory import HostEntry

if TYPE_CHECKING:
    from vmrun.providers.api import Instance, Offer, Provider, Removed, Request

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")
# What a stopped disk still costs (gp3, us-east-1, per GB-month): said at `down --stop`.
GP3_GB_MONTH = 0.08
CHECK_IP_URL = "https://checkip.amazonaws.com"


@dataclass(frozen=True)
class UpAsk:
    """`vmrun up`'s flags; None: from the `[[clouds]]` table NAME in vmrun.toml, else the
    default (see `resolve`)."""

    name: str
    cloud: str | None = None
    instance_type: str | None = None
    count: int | None = None
    region: str | None = None
    zone: str | None = None
    spot: bool | None = None
    spot_fallback: bool | None = None
    disk: int | None = None
    image: str | None = None
    user: str | None = None
    autostop: str | None = None
    autostop_terminate: bool | None = None
    ssh_from: str | None = None
    profile: str | None = None
    placement: bool | None = None
    ssh_key: Path | None = None
    store: str | None = None  # s3://BUCKET/PREFIX: a role for the VMs that reaches it alone
    keep: bool = False  # keep what was made when `up` fails
    ssh_timeout: float = 600.0
    # an hour for the whole cluster, in the cloud's currency (USD, DKK): dearer is refused
    max_hourly_cost: float | None = None
    # the whole cluster's cap, in the cloud's currency: each VM's watchdog stops its runs
    # (saved) and powers it off once it has run its share (autostop_budget)
    max_cost: float | None = None


_DEFAULTS: dict[str, Any] = {
    "cloud": "aws",
    "instance_type": None,
    "count": 1,
    "region": "",
    "zone": "",
    "spot": False,
    "spot_fallback": False,
    "disk": 0,
    "image": "dlami",
    "user": "",
    "autostop": "",
    "autostop_terminate": False,
    "ssh_from": "",
    "profile": "",
    "placement": True,
    "store": "",
    "max_cost": 0.0,
}
# [[clouds]] keys -> UpAsk fields (the table says `type` and `disk` as the flags do)
_TABLE_KEYS = {"type": "instance_type", **{k: k for k in _DEFAULTS if k != "instance_type"}}


@dataclass
class Up:
    """What `up` did: the cluster's instances in node order, the hosts it recorded (group
    @NAME), and whether the cluster was already there (`already`: running, nothing made;
    `started`: stopped instances started again)."""

    name: str
    region: str
    image: str = ""
    instances: list[Instance] = field(default_factory=list)
    hosts: list[HostEntry] = field(default_factory=list)
    already: bool = False
    started: bool = False
    autostop: str = ""
    project_file: Path | None = None
    per_hour: float | None = None  # for the whole cluster, where the price list answers
    currency: str = "USD"  # per_hour's
    budget: str = ""  # --max-cost: each VM's running time until its watchdog powers it off


@dataclass
class Down:
    name: str
    region: str
    removed: Removed | None = None
    stopped: bool = False
    forgotten: list[str] = field(default_factory=list)  # hosts removed from vmrun.toml
    disk_gb: int = 0  # what stopped instances keep


def check_name(name: str) -> None:
    if not name or not set(name) <= _NAME_CHARS or name[0] == "-" or len(name) > 40:
        raise UsageError(
            f"cluster name {name!r}: use lowercase letters, digits and -, up to 40",
            hint="e.g. `vmrun up w251 --type g4dn.2xlarge`",
        )


def table_for(settings: Settings, name: str) -> dict[str, Any]:
    """The `[[clouds]]` table named `name` in vmrun.toml ({} if none)."""
    for table in settings.project_data.get("clouds", []) or []:
        if isinstance(table, dict) and table.get("name") == name:
            return table
    return {}


def resolve(ask: UpAsk, settings: Settings) -> UpAsk:
    """Flags over the `[[clouds]]` table over the defaults."""
    check_name(ask.name)
    table = table_for(settings, ask.name)
    values: dict[str, Any] = {}
    for key, attr in _TABLE_KEYS.items():
        flag = getattr(ask, attr)
        values[attr] = flag if flag is not None else table.get(key, _DEFAULTS[attr])
    done = replace(ask, **values)
    if done.cloud not in CLOUDS:
        raise UsageError(f"--cloud {done.cloud!r}: vmrun knows {', '.join(CLOUDS)}")
    if not done.instance_type:
        raise UsageError(
            f"no instance type for {ask.name}",
            hint='pass --type (e.g. g4dn.2xlarge), or type = "..." in its [[clouds]] table',
        )
    if not isinstance(done.count, int) or done.count < 1:
        raise UsageError(f"-n {done.count}: the number of instances is 1 or more")
    _refuse_lacking(done)
    if done.spot_fallback and not done.spot:
        raise UsageError("--spot-fallback only goes with --spot", code="flags-conflict")
    if done.store:
        from vmrun.store_url import parse_store

        parse_store(str(done.store))
    if done.autostop:
        from vmrun.setting_types import OFF, period_or_off

        if period_or_off("--autostop", done.autostop) == OFF:
            done = replace(done, autostop="")
    return done


def _refuse_lacking(done: Any) -> None:
    """The flags `done`'s cloud lacks the capability of, refused by its name (its provider
    declares what it can do: vmrun.providers.api.ProviderCapabilities)."""
    from vmrun.providers.api import capabilities_of

    caps = capabilities_of(done.cloud)
    asked = {"--spot": "spot", "--store": "store", "--zone": "zones"}
    lacked = [f for f, cap in asked.items() if getattr(done, f[2:]) and caps.lacks(cap)]
    if lacked:
        names = ", ".join(asked[f] for f in lacked)
        raise UsageError(
            f"{' and '.join(lacked)}: {caps.what} has no spot instances, bucket role or"
            f" zones (capability: {names}, which {caps.what} lacks)",
            code="flags-conflict",
        )
    if caps.lacks("power_off") and (done.max_cost or done.autostop):
        raise UsageError(
            f"{'--max-cost' if done.max_cost else '--autostop'} on a {caps.what} cluster:"
            f" {caps.why_no_power_off} (capability: power_off, which {caps.what} lacks)",
            hint="`vmrun down NAME --stop` suspends the jobs (not charged); a run's own"
            " `train --max-cost` stops the run at its cap",
            code="flags-conflict",
        )


def ssh_source(ssh_from: str, timeout: float = 5.0) -> str:
    """Who may reach port 22: the CIDR given, else this machine's public address as AWS's
    check-IP service sees it, as /32."""
    if ssh_from:
        try:
            return str(ipaddress.ip_network(ssh_from, strict=False))
        except ValueError:
            raise UsageError(
                f"--ssh-from {ssh_from!r} is not an address or CIDR (e.g. 203.0.113.7/32)"
            ) from None
    import urllib.request

    try:
        with urllib.request.urlopen(CHECK_IP_URL, timeout=timeout) as reply:
            text = reply.read(64).decode("ascii").strip()
        return str(ipaddress.ip_network(text + "/32"))
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"could not learn this machine's public address from {CHECK_IP_URL} ({exc})",
            hint="pass --ssh-from CIDR: the addresses that may reach SSH on the VMs",
        ) from None


def provider_for(cloud: str, profile: str) -> Provider:
    """The cloud's provider (its package's `provider`: only that cloud's client loads)."""
    import importlib

    made: Provider = importlib.import_module(f"vmrun.providers.{cloud}").make(profile)
    return made


def _gives_host_key(provider: Provider) -> bool:
    """Whether the cloud takes the host key vmrun makes (user data); else vmrun pins the key
    each VM first shows (trust on first use, said once)."""
    return bool(getattr(provider, "gives_host_key", True))


# ---------------------------------------------------------------------------------- up


def up(settings: Settings, ask: UpAsk, out: Reporter = QUIET) -> Up:
    ask = resolve(ask, settings)
    assert ask.instance_type is not None and ask.count is not None
    provider = provider_for(ask.cloud or "aws", ask.profile or "")
    provider.check_credentials()  # local and more fundamental: before --ssh-from's look-up
    cidr = ssh_source(ask.ssh_from or "") if getattr(provider, "needs_ssh_cidr", True) else ""
    region = ask.region or provider.default_region
    existing = provider.describe(ask.name, region)
    if existing:
        return _again(settings, ask, provider, region, existing, out)
    from vmrun.providers import cloudinit
    from vmrun.providers.api import Request

    home = Path(os.environ.get("HOME") or os.path.expanduser("~"))
    host_key = cloudinit.new_host_key(f"vmrun-{ask.name}-host")
    public_key = cloudinit.user_public_key(ask.ssh_key, home)
    request = Request(
        cluster=ask.name,
        instance_type=ask.instance_type,
        count=ask.count,
        region=region,
        zone=ask.zone or "",
        image=ask.image or "dlami",
        disk_gb=int(ask.disk or 0),
        spot=bool(ask.spot),
        spot_fallback=bool(ask.spot_fallback),
        ssh_cidr=cidr,
        user_data=cloudinit.user_data(host_key, public_key),
        public_key=public_key,
        boot_timeout=ask.ssh_timeout,
        power_off="terminate" if ask.autostop_terminate else "stop",
        placement=bool(ask.placement),
        creator=f"{getpass.getuser()}@{socket.gethostname()}",
        user=ask.user or "",
        store=ask.store or "",
    )
    offer = provider.offer(request)
    if not region:  # where the type is (UCloud's providers are its regions)
        region = offer.region
        request = replace(request, region=region)
    _say_the_cost(provider, ask, request, offer, out)  # before anything is made
    out.info(
        f"{ask.name}: {ask.count} x {ask.instance_type} in {region}"
        f"{' (spot)' if ask.spot else ''}, image {offer.image_name} ({offer.image_id})"
    )
    _note_region(ask.cloud or "aws", region)
    instances: list[Instance] = []
    try:
        instances = provider.launch(request, offer, out)
        for inst in instances:
            out.info(
                f"{ask.name}: node {inst.index} {inst.id} running: {inst.public_addr}"
                f" (private {inst.private_addr})"
            )
        price, currency = _price(provider, instances)
        entries = _entries(
            ask.name,
            offer.user,
            instances,
            ask.autostop or "",
            ask.store or "",
            price,
            currency,
            _budget(ask, price, len(instances)),
        )
        if _gives_host_key(provider):
            _pin(settings, entries, host_key)
        else:
            _first_use(settings, entries, provider.name, out)
        _wait_ssh(entries, _trusting(settings, provider), ask.ssh_timeout, out)
        done = Up(ask.name, region, offer.image_name, instances, entries)
        done.project_file = _record(settings, ask, region, offer.user, entries)
        done.autostop = _autostop(settings, entries, ask.autostop or "", bool(ask.max_cost))
        done.budget = str(entries[0].vars.get("autostop_budget", "")) if entries else ""
        done.per_hour = None if price is None else price * len(instances)
        done.currency = currency
        return done
    except BaseException:
        if ask.keep:
            out.warn(f"{ask.name}: kept as it is (--keep); `vmrun down {ask.name}` removes it")
            raise
        if instances:  # launch removes its own leftovers; these ran and must go now
            out.warn(f"{ask.name}: removing the cluster")
            removed = provider.terminate(ask.name, region)
            if removed.left:
                raise CloudError(
                    f"{ask.name}: could not remove {'; '.join(removed.left)}",
                    hint=f"`vmrun down {ask.name}` tries again",
                    code="cloud-leftovers",
                ) from None
        raise


def _again(
    settings: Settings,
    ask: UpAsk,
    provider: Provider,
    region: str,
    existing: list[Instance],
    out: Reporter,
) -> Up:
    """`up` of a cluster that is there: stopped instances start again (new public
    addresses, recorded anew); running ones are recorded as they are."""
    started = any(i.state in ("stopped", "stopping") for i in existing)
    if started:
        existing = provider.start(ask.name, region, out)
    elif any(i.state == "pending" for i in existing):
        existing = provider.wait_running(ask.name, region, [i.id for i in existing], 600)
    user = ask.user or _recorded_user(settings, ask.name) or "ubuntu"
    price, currency = _price(provider, existing)
    entries = _entries(
        ask.name,
        user,
        existing,
        ask.autostop or "",
        ask.store or "",
        price,
        currency,
        _budget(ask, price, len(existing)),
    )
    if _gives_host_key(provider):
        _repin(settings, entries, ask.name, provider.host_key(existing[0]))
    else:  # the same VMs (their keys pinned), maybe at new ports: a new place is pinned
        out.info(
            f"{ask.name}: {provider.name} hands a VM no host key: a new address's key is"
            " pinned on first use"
        )
    _wait_ssh(entries, _trusting(settings, provider), ask.ssh_timeout, out)
    done = Up(ask.name, region, instances=existing, hosts=entries, already=not started)
    done.started = started
    done.project_file = _record(settings, ask, region, user, entries)
    if ask.max_cost:  # the cap as asked now (a higher one lets stopped VMs run again)
        _autostop(settings, entries, ask.autostop or "", True)
        done.budget = str(entries[0].vars.get("autostop_budget", ""))
    done.per_hour = None if price is None else price * len(existing)
    done.currency = currency
    return done


def _say_the_cost(
    provider: Provider, ask: UpAsk, request: Request, offer: Offer, out: Reporter
) -> None:
    """What the cluster costs an hour, said before anything is made, where the price list
    answers; above `--max-hourly-cost` (in the cloud's currency; or unknown with one
    given) it is refused here."""
    from vmrun.providers.api import Instance
    from vmrun.results.cost import money, price_text

    probe = Instance(
        id="",
        cluster=ask.name,
        state="pending",
        instance_type=request.instance_type,
        zone=offer.zones[0] if offer.zones else "",
        region=request.region,
        public_addr="",
        private_addr="",
        spot=request.spot,
    )
    per_vm = provider.hourly_price(probe)
    total = None if per_vm is None else per_vm * request.count
    currency = provider.price_currency(probe) if per_vm is not None else ""
    if total is not None:
        out.info(
            f"{ask.name}: about {money(total, currency)} an hour while it runs"
            f" ({request.count} x {price_text(per_vm or 0, currency)}"
            f"{' spot' if request.spot else ''})"
        )
    if ask.max_cost and total is None:
        raise UsageError(
            f"--max-cost {ask.max_cost:g}: the price list gives no price for"
            f" {request.instance_type} in {request.region}, so the cap cannot be kept",
            hint="drop --max-cost; nothing was made",
            code="over-budget",
        )
    limit = ask.max_hourly_cost
    if limit is None:
        return
    if total is None:
        raise UsageError(
            f"--max-hourly-cost {limit:g}: the price list gives no price for"
            f" {request.instance_type} in {request.region}, so the limit cannot be kept",
            hint="drop --max-hourly-cost, or put the price in vmrun.toml yourself after `up`",
            code="over-budget",
        )
    if total > limit:
        raise UsageError(
            f"{request.count} x {request.instance_type} costs {money(total, currency)} an"
            f" hour, above --max-hourly-cost {limit:g} ({currency}, the cloud's currency);"
            " nothing was made",
            hint="a smaller --type, fewer nodes (-n), --spot, or a higher limit",
            code="over-budget",
        )


def _price(provider: Provider, instances: list[Instance]) -> tuple[float | None, str]:
    """What one VM costs an hour (they are alike), where the price list answers, and in
    which currency: recorded as each host's `price` (and `currency`, where not USD), for
    what runs on them cost (vmrun.results.cost)."""
    for inst in instances[:1]:
        price = provider.hourly_price(inst)
        if price is not None:
            return price, provider.price_currency(inst) or "USD"
    return None, "USD"


def _recorded_user(settings: Settings, name: str) -> str:
    return str(table_for(settings, name).get("user", ""))


def _note_region(cloud: str, region: str) -> None:
    try:
        from vmrun.providers.regions import note_region
    except ImportError:  # pragma: no cover - the record arrives with `vmrun clusters`
        return
    note_region(cloud, region)


def _entries(
    name: str,
    user: str,
    instances: list[Instance],
    autostop: str,
    store: str = "",
    price: float | None = None,
    currency: str = "USD",
    budget: str = "",
) -> list[HostEntry]:
    """The cluster's hosts as vmrun.toml records them (`store_role`: the bucket place the
    VMs' own role reaches, which "auto" credentials then use)."""
    from vmrun.ssh.hosts import parse_host

    entries = []
    for position, inst in enumerate(instances):
        if not inst.public_addr:
            raise CloudError(
                f"{inst.id} has no public address",
                hint="the default subnet must map public addresses (MapPublicIpOnLaunch)",
            )
        values: dict[str, Any] = {"private_addr": inst.private_addr, "instance": inst.id}
        port = f":{inst.ssh_port}" if inst.ssh_port and inst.ssh_port != 22 else ""
        host = f"[{inst.public_addr}]" if ":" in inst.public_addr else inst.public_addr
        if autostop:
            values["autostop"] = autostop
        if store:
            values["store_role"] = store
        if price is not None:
            values["price"] = round(price, 6)
            if currency != "USD":
                values["currency"] = currency
        if budget:
            values["autostop_budget"] = budget
        entries.append(
            HostEntry(
                parse_host(f"{inst.login_user or user}@{host}{port}"),
                f"{name}-{position}",
                (name,),
                values,
            )
        )
    return entries


# ---------------------------------------------------------------------------------- host keys


def _pin(settings: Settings, entries: list[HostEntry], host_key: Any) -> None:
    """The cluster's host key, for each public address, in vmrun's known_hosts; lines an
    earlier VM left for the same address (AWS reuses addresses) go first."""
    from vmrun.providers.cloudinit import HostKey

    assert isinstance(host_key, HostKey)
    addrs = [e.spec.host for e in entries]
    _drop_known(settings.known_hosts, addrs)
    path = settings.known_hosts
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = "".join(f"{a} {host_key.key_type} {host_key.base64}\n" for a in addrs)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(lines)


def _first_use(settings: Settings, entries: list[HostEntry], cloud: str, out: Reporter) -> None:
    """A cloud that takes no host key from vmrun: what an earlier VM left for the same
    address goes, and the user is told once that the first key seen is the one pinned."""
    _drop_known(settings.known_hosts, [_known_name(e) for e in entries])
    out.warn(
        f"{cloud} hands a VM no host key: vmrun pins the key each VM shows first (trust on"
        " first use: a machine in the middle now would go unnoticed; a key that changes"
        " later is refused)"
    )


def _trusting(settings: Settings, provider: Provider) -> Settings:
    """The settings to reach new VMs with: strict where vmrun pinned their key already."""
    if _gives_host_key(provider):
        return settings
    return replace(settings, accept_new_host_key=True)


def _known_name(entry: HostEntry) -> str:
    """How known_hosts names the host: `addr`, or `[addr]:port` off port 22."""
    port = entry.spec.port
    return f"[{entry.spec.host}]:{port}" if port and port != 22 else entry.spec.host


def _repin(settings: Settings, entries: list[HostEntry], name: str, launched: str) -> None:
    """Pin the cluster's key for its (maybe new) addresses: the key vmrun gave the VMs at
    launch, read back from their user data (another machine, a lost known_hosts, new
    addresses after a restart). None there: the key known_hosts holds for its old ones."""
    from vmrun.providers.cloudinit import HostKey

    if launched:
        _pin(settings, entries, HostKey("", launched))
        return
    if all(_known(settings.known_hosts, e.spec.host) for e in entries):
        return
    raise CloudError(
        f"{name}'s host key is not known here, and its user data has none",
        hint=f"`vmrun down {name}` and `vmrun up` again, or add its key to known_hosts",
    )


def _known(path: Path, addr: str) -> bool:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    return any(line.split()[:1] == [addr] for line in lines)


def _drop_known(path: Path, addrs: list[str]) -> None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except OSError:
        return
    keep = [ln for ln in lines if not ln.split() or ln.split()[0] not in addrs]
    if keep != lines:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.writelines(keep)
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------- SSH wait


def _wait_ssh(entries: list[HostEntry], settings: Settings, timeout: float, out: Reporter) -> None:
    """Until every host lets vmrun log in and run a command: the port answering is not
    enough while a VM boots (sshd may start before cloud-init wrote the keys). A changed
    host key is no boot state: it fails at once."""
    deadline = time.monotonic() + timeout
    errors: dict[str, BaseException] = {}

    def wait(entry: HostEntry) -> None:
        from vmrun.ssh.connection import Connection

        last: BaseException | None = None
        while time.monotonic() < deadline:
            quick = replace(settings, connect_timeout=min(settings.connect_timeout, 10.0))
            try:
                with Connection(entry.spec, quick, label=entry.label) as conn:
                    conn.run(["true"], check=True, timeout=30)
                out.info(f"{entry.label}: SSH up ({entry.spec.label})")
                return
            except HostKeyError as exc:
                errors[entry.label] = exc
                return
            except (UnreachableError, AuthError, ConnectionLostError) as exc:
                last = exc
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        errors[entry.label] = last or UnreachableError("no answer", host=entry.label)

    threads = [threading.Thread(target=wait, args=(e,), daemon=True) for e in entries]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)  # Ctrl-C reaches the main thread
    if errors:
        first = next(iter(errors.values()))
        if isinstance(first, HostKeyError):
            raise first
        raise CloudError(
            f"SSH never let vmrun in within {timeout:.0f} s: "
            + "; ".join(f"{label}: {err}" for label, err in errors.items()),
            hint="--keep keeps the VMs to look at (the console's system log)",
            code="cloud-ssh-never-up",
        )


# ---------------------------------------------------------------------------------- record


def _record(
    settings: Settings, ask: UpAsk, region: str, user: str, entries: list[HostEntry]
) -> Path:
    from vmrun.config import PROJECT_FILE
    from vmrun.ssh.inventory import forget_group, record_hosts, record_table

    project = settings.project_dir or Path.cwd()
    table = {**table_for(settings, ask.name)}
    table.update(
        {
            "name": ask.name,
            "cloud": ask.cloud,
            "type": ask.instance_type,
            "count": ask.count,
            "region": region,
        }
    )
    for key in (
        "zone",
        "image",
        "disk",
        "spot",
        "spot_fallback",
        "autostop",
        "autostop_terminate",
        "store",
        "max_cost",
    ):
        value = getattr(ask, key)
        if value not in (None, "", 0, False) and not (key == "image" and value == "dlami"):
            table[key] = value
    if user and user != "ubuntu":
        table["user"] = user
    if ask.ssh_from:
        table["ssh_from"] = ask.ssh_from
    if ask.profile:
        table["profile"] = ask.profile
    record_table(project, "clouds", table)
    # addresses change when VMs start again; what else a host says (the python `vmrun setup`
    # recorded, the user's own keys) stays with its name
    from vmrun.ssh.inventory import HostEntry, project_hosts

    kept = {e.name: e.vars for e in project_hosts(settings) if e.groups == (ask.name,)}
    forget_group(project, ask.name)
    record_hosts(
        project,
        [HostEntry(e.spec, e.name, e.groups, {**kept.get(e.name, {}), **e.vars}) for e in entries],
    )
    return project / PROJECT_FILE


def _budget(ask: UpAsk, price: float | None, count: int) -> str:
    """`--max-cost`: each VM's share of the cluster's cap as running time (its watchdog's
    autostop_budget, recorded on its host); "" without a cap."""
    if not ask.max_cost:
        return ""
    if price is None or price <= 0:
        raise UsageError(
            f"--max-cost {ask.max_cost:g}: the price list gives no price for"
            f" {ask.instance_type}, so the cap cannot be kept",
            hint="drop --max-cost (a run's own --max-cost needs the hosts' `price`)",
            code="over-budget",
        )
    from vmrun.results.cost import budget_seconds

    share = budget_seconds(ask.max_cost, price * count)
    return f"{max(1, int(share))}s"


def _autostop(
    settings: Settings, entries: list[HostEntry], period: str, budget: bool = False
) -> str:
    if not period and not budget:
        return ""
    from vmrun.operations.autostop import install

    applied = install(settings, entries, required=True)
    from vmrun.ssh.group import raise_for_failures

    raise_for_failures(applied.checked if applied.refused else applied.outcomes)
    return period


# ---------------------------------------------------------------------------------- down


def down(
    settings: Settings,
    name: str,
    *,
    region: str | None = None,
    stop: bool = False,
    profile: str | None = None,
    out: Reporter = QUIET,
) -> Down:
    """Terminate the cluster (or stop it: disks kept) and remove the security and
    placement groups; the hosts leave vmrun.toml. Nothing there is no error."""
    check_name(name)
    table = table_for(settings, name)
    provider = provider_for(
        str(table.get("cloud", "aws")), profile or str(table.get("profile", ""))
    )
    where = region or str(table.get("region", "")) or provider.default_region
    project = settings.project_dir or Path.cwd()
    if stop:
        instances = provider.describe(name, where)
        removed = provider.stop(name, where)
        disk = sum(int(table.get("disk", 0) or 0) for _ in instances)
        return Down(name, where, removed, stopped=True, disk_gb=disk)
    removed = provider.terminate(name, where)
    from vmrun.ssh.inventory import forget_group, forget_table, project_hosts

    addrs = [_known_name(e) for e in project_hosts(settings) if e.groups == (name,)]
    forgotten = forget_group(project, name)
    forget_table(project, "clouds", name)
    if _made_cluster(settings, name):  # `up --slurm`'s queue went with its VMs
        forget_table(project, "clusters", name)
    _drop_known(settings.known_hosts, addrs)
    if removed.left:
        raise CloudError(
            f"{name}: still there after `down`: {'; '.join(removed.left)}",
            hint=f"run `vmrun down {name}` again in a minute",
            code="cloud-leftovers",
        )
    return Down(name, where, removed, forgotten=forgotten)


def _made_cluster(settings: Settings, name: str) -> bool:
    """Whether vmrun.toml has a cluster NAME that vmrun made of the VMs @NAME."""
    from vmrun.ssh.inventory import project_hosts

    tables = settings.project_data.get("clusters", [])
    table = next((t for t in tables if isinstance(t, dict) and t.get("name") == name), {})
    ours = {e.name for e in project_hosts(settings) if e.groups == (name,)}
    return bool(table.get("nodes")) and set(table["nodes"]) <= ours


# ---------------------------------------------------------------------------------- replace


@dataclass(frozen=True)
class Replaced:
    """What `replace_node` did: the host as vmrun.toml now records it (new address,
    instance and private address), the lost instance ("" when none was found) and the new."""

    host: HostEntry
    old_instance: str
    new_instance: str

    @property
    def address(self) -> str:
        return self.host.spec.host


def replace_node(
    settings: Settings,
    name: str,
    label: str,
    out: Reporter = QUIET,
    *,
    extra_keys: Sequence[str] = (),
    ssh_timeout: float = 600.0,
) -> Replaced:
    """A new VM in place of the lost node `label` (e.g. NAME-1) of the cluster `vmrun up
    NAME` made: its type, image, zone first, groups, role, node index and host key (the key
    pinned already, read from a surviving VM's user data, so nothing new is trusted). The
    lost instance is terminated first (it still counts against the quota). It does not run
    `vmrun setup` on the new VM: the caller replays that. A failure after the launch
    terminates the new VM alone. `extra_keys`: more public key lines the VM lets in."""
    check_name(name)
    table = table_for(settings, name)
    entry = _cluster_host(settings, name, label, table)
    provider = provider_for(str(table.get("cloud", "aws")), str(table.get("profile", "")))
    region = str(table.get("region", "")) or provider.default_region
    lost, source = _lost_and_source(provider, name, region, str(entry.vars.get("instance", "")))
    index = _lost_index(lost, name, label)
    key = _cluster_key(provider, source, name)
    request = _replacement(table, source, _with_keys(provider.user_data(source), extra_keys))
    offer = provider.offer(request)  # nothing made yet: a refusal here leaves all as it was
    offer = replace(offer, zones=sorted(offer.zones, key=lambda z: z != source.zone))
    if lost is not None and lost.state not in ("shutting-down", "terminated"):
        out.info(f"{label}: terminating the lost {lost.id}")
        provider.terminate_ids(region, [lost.id])
    new = provider.add(request, offer, index, out)
    host = _bring_up(settings, provider, entry, new, key, offer, ssh_timeout, out)
    return Replaced(host, lost.id if lost else "", new.id)


def _cluster_host(settings: Settings, name: str, label: str, table: dict[str, Any]) -> HostEntry:
    from vmrun.ssh.inventory import project_hosts

    if not table:
        raise UsageError(
            f"vmrun.toml has no [[clouds]] table {name!r}",
            hint=f"a cluster `vmrun up {name}` made here, or its vmrun.toml",
        )
    for entry in project_hosts(settings):
        if entry.label == label and name in entry.groups:
            return entry
    raise UsageError(
        f"{label} is no host of {name} in vmrun.toml", hint=f"its hosts: `vmrun hosts -H @{name}`"
    )


def _lost_and_source(
    provider: Provider, name: str, region: str, lost_id: str
) -> tuple[Instance | None, Instance]:
    """The lost instance (None when the cloud no longer lists it) and the one whose user
    data, image and zone the replacement takes: a running survivor, else any left."""
    from vmrun.providers.api import EVERY_STATE

    every = provider.describe(name, region, EVERY_STATE)
    lost = next((i for i in every if lost_id and i.id == lost_id), None)
    others = [i for i in every if i is not lost and i.state != "terminated"]
    left = [i for i in others if i.state == "running"] + [i for i in others if i.state != "running"]
    if lost is not None and lost.state != "terminated":
        left.append(lost)
    if not left:
        raise CloudError(
            f"no instance of {name} is left to copy a replacement from (its user data holds"
            " the cluster's host key)",
            hint=f"`vmrun down {name}` and `vmrun up {name}` again",
        )
    return lost, left[0]


def _cluster_key(provider: Provider, source: Instance, name: str) -> str:
    key = provider.host_key(source)
    if not key:
        raise CloudError(
            f"{source.id}'s user data holds no host key to pin a replacement's by",
            hint=f"`vmrun down {name}` and `vmrun up {name}` again",
        )
    return key


def _lost_index(lost: Instance | None, name: str, label: str) -> int:
    """The lost node's place: its instance's tag, else its host name's number."""
    if lost is not None and lost.index < 1_000_000:
        return lost.index
    number = label.removeprefix(f"{name}-")
    if not number.isdigit():
        raise UsageError(f"{label}: which node of {name} it was is not known")
    return int(number)


def _with_keys(user_data: str, keys: Sequence[str]) -> str:
    """The cluster's cloud-config with more login keys (one public key line each)."""
    for key in keys:
        if "\n" in key.strip() or not key.strip().startswith(("ssh-", "ecdsa-", "sk-")):
            raise UsageError(f"{key[:40]!r} is not an OpenSSH public key line")
    lines = "".join(f"  - {key.strip()}\n" for key in keys)
    head = "\nssh_authorized_keys:\n"
    if not lines or head in user_data:
        return user_data.replace(head, head + lines, 1)
    return user_data.rstrip("\n") + head + lines


def _replacement(table: dict[str, Any], source: Instance, user_data: str) -> Request:
    """One more instance as the cluster's [[clouds]] table asks, booting what the survivor
    booted (not a newer release of the image)."""
    from vmrun.providers.api import Request

    return Request(
        cluster=str(table["name"]),
        instance_type=source.instance_type or str(table.get("type", "")),
        region=source.region,
        zone=str(table.get("zone", "")),
        image=source.image_id or str(table.get("image", "dlami")),
        disk_gb=int(table.get("disk", 0) or 0),
        spot=bool(table.get("spot", False)),
        spot_fallback=bool(table.get("spot_fallback", False)),
        user_data=user_data,
        power_off="terminate" if table.get("autostop_terminate") else "stop",
        placement=False,  # `add` takes the cluster's own, if it has one
        creator=f"{getpass.getuser()}@{socket.gethostname()}",
        user=str(table.get("user", "")),
        store=str(table.get("store", "")),
    )


def _bring_up(
    settings: Settings,
    provider: Provider,
    entry: HostEntry,
    new: Instance,
    key: str,
    offer: Offer,
    ssh_timeout: float,
    out: Reporter,
) -> HostEntry:
    """Pin the cluster's key for the new address, wait for SSH, put autostop back, record
    the host; on any failure, or Ctrl-C, terminate the new instance alone."""
    from vmrun.providers.cloudinit import HostKey
    from vmrun.ssh.inventory import move_host

    spec = replace(entry.spec, host=new.public_addr, user=entry.spec.user or offer.user)
    values = {**entry.vars, "instance": new.id, "private_addr": new.private_addr}
    host = HostEntry(spec, entry.name, entry.groups, values)
    out.info(f"{host.label}: {new.id} running: {new.public_addr} (private {new.private_addr})")
    try:
        if not new.public_addr:
            raise CloudError(f"{new.id} has no public address")
        _pin(settings, [host], HostKey("", key))
        _wait_ssh([host], settings, ssh_timeout, out)
        _autostop(settings, [host], str(host.vars.get("autostop", "")))
        move_host(settings.project_dir or Path.cwd(), host)
    except BaseException:
        out.warn(f"{host.label}: terminating the new {new.id}")
        _drop_known(settings.known_hosts, [new.public_addr])
        try:
            provider.terminate_ids(new.region, [new.id])
        except Exception as exc:  # the failure that brought us here is the one to raise
            out.warn(f"{host.label}: could not terminate {new.id}: {exc}")
        raise
    if entry.spec.host != new.public_addr:
        _drop_known(settings.known_hosts, [entry.spec.host])
    return host
