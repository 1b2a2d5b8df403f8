"""Putting a run's supervisor on its host (`train --recover`), from this machine:

1. an env of its own there (`~/.vmrun/supervisor/env-<hash>`), made with pip from wheels
   this machine sends (the host needs no package index): vmrun's own requirements at the
   versions this vmrun runs with, for the host's Python and architecture. They come from
   `VMRUN_SUPERVISOR_WHEELS` (a folder, for offline use and the tests) or are downloaded
   once here into vmrun's cache (`pip download`, for that platform);
2. vmrun's own code (this package's files) beside it, `~/.vmrun/supervisor/code/<hash>`;
3. its folder for the run, `~/.vmrun/supervisor/runs/RUN_ID/`: what it is asked
   (spec.json), the run's hosts and spares as this machine reaches them (addresses,
   ports, users, their host keys from this machine's known_hosts: it checks them as
   strictly), and a key pair made there for it alone, whose public half each node and
   spare allows (tagged, taken off again when the run ends); the user's key never leaves
   this machine;
4. started detached (hostside/supervisor_start.sh), what it needs to reach the bucket sent
   over stdin into a 0600 file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun import hostside
from vmrun.config import Settings
from vmrun.errors import RemoteError, UnknownHostKeyError, UsageError
from vmrun.recovery.journal import TAG, Spec
from vmrun.recovery.policy import DEFAULT_MAX_RECOVERIES
from vmrun.reporting import Reporter
from vmrun.setting_types import OFF
from vmrun.ssh.connection import Connection
from vmrun.ssh.group import Group, raise_for_failures
from vmrun.ssh.inventory import HostEntry

if TYPE_CHECKING:
    from vmrun.backends.api import RunRef
    from vmrun.runs.plan import Plan

HOME_DIR = ".vmrun/supervisor"
PACKAGES = ("typer", "rich", "paramiko", "PyYAML", "tomlkit")  # vmrun's own requirements
WITH_STORE = ("boto3",)  # reading the run's bucket (its record, a resume from there)


@dataclass(frozen=True)
class Reached:
    """A node or spare as the supervisor is to reach it (this machine's view of it)."""

    label: str
    host: str
    port: int
    user: str
    key_name: str  # its name in known_hosts
    keys: dict[str, str]  # key type -> base64
    vars: dict[str, object]  # what vmrun.toml says of it


@dataclass(frozen=True)
class Placed:
    host: str
    folder: str  # the run's supervisor folder there, relative to its home
    pid: int


@dataclass(frozen=True)
class Prepared:
    """What a supervisor needs on its host whatever the run (its env, vmrun's code, the
    tools): made while the run is staged, so the run is supervised soon after it starts."""

    home: str
    env: str  # relative to the home
    code: str
    made: int  # packages installed now (0: the env was there already)


def prepare(conn: Connection, python: str, *, store: bool, tools: bool) -> Prepared:
    """The supervisor's env, vmrun's code and (`tools`) py-spy's wheels on `conn`'s host."""
    home, interpreter, machine = _probe(conn, python)
    reqs = requirements(store)
    env, made = _install_env(conn, interpreter, machine, reqs)
    code = _install_code(conn)
    if tools:
        _send_tools(conn)
    return Prepared(home, env, code, len(reqs) if made else 0)


def requirements(store: bool) -> list[str]:
    """vmrun's requirements, pinned to the versions this vmrun runs with."""
    names = [*PACKAGES, *(WITH_STORE if store else ())]
    pinned = []
    for name in names:
        try:
            pinned.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pinned.append(name)
    return pinned


def wheels_key(reqs: Sequence[str]) -> str:
    """What names a folder of these requirements' wheels (a cache, the tests' wheelhouse)."""
    return hashlib.sha256(" ".join(reqs).encode()).hexdigest()[:8]


def wheels_for(python: str, machine: str, reqs: Sequence[str]) -> Path:
    """A folder of wheels for a host's CPython `python` ("3.11") on `machine` (x86_64,
    aarch64): VMRUN_SUPERVISOR_WHEELS, else vmrun's cache, filled once by pip here."""
    given = os.environ.get("VMRUN_SUPERVISOR_WHEELS")
    if given:
        return Path(given)
    key = hashlib.sha256(" ".join([python, machine, *reqs]).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "vmrun" / "supervisor-wheels" / key
    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            python,
            "--platform",
            f"manylinux2014_{machine}",
            "-d",
            str(folder),
            *reqs,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RemoteError(
            f"could not download the supervisor's packages for Python {python} on {machine}:"
            f" {said}",
            hint="give a folder of those wheels in VMRUN_SUPERVISOR_WHEELS",
            code="supervisor-failed",
        )
    (folder / ".complete").touch()
    return folder


def deploy(
    settings: Settings,
    spec: Spec,
    supervisor: HostEntry,
    hosts: Sequence[HostEntry],
    out: Reporter,
    secrets: dict[str, str] | None = None,
    files: Sequence[str] = (),
    reached: list[Reached] | None = None,
    tools: bool = False,
    prepared: Prepared | None = None,
) -> Placed:
    """Put the supervisor of `spec`'s run on `supervisor` and start it; `hosts`: the run's
    nodes and spares, which its key is allowed on; `files`: the project's files a script's
    run syncs (none for the template); `tools`: the run is watched for hangs, so the
    supervisor gets the py-spy wheels this machine sent the nodes (a node it brings in
    needs one, and the supervisor's host may have no package index); `prepared`: what
    `prepare` made there already (else it is made now)."""
    from vmrun.transfer.upload import upload

    reached = reached if reached is not None else _reach(settings, hosts)
    project = settings.project_dir or Path.cwd()
    everyone = list({e.label: e for e in [supervisor, *hosts]}.values())
    with Group(everyone, settings) as group:
        conn = group.connections[supervisor.label]
        if prepared is None:
            prepared = prepare(conn, _python_of(supervisor), store=bool(spec.store), tools=tools)
        if prepared.made:
            out.info(f"{conn.label}: the supervisor's env made ({prepared.made} packages)")
        home, env, code = prepared.home, prepared.env, prepared.code
        folder = f"{HOME_DIR}/runs/{spec.run_id}"
        if files:  # a script's run: its project, where a resume finds the script
            sent = upload(
                conn, project, f"{folder}/project", files=[f for f in files if f != "vmrun.toml"]
            )
            if not sent.ok:
                raise RemoteError(
                    "could not send the project to the supervisor",
                    host=conn.label,
                    code="supervisor-failed",
                )
        _write_folder(conn, folder, home, spec, reached, _cluster_table(settings, spec.cluster))
        tag = TAG.format(run=spec.run_id)
        made = conn.run(
            hostside.command("supervisor_keys.sh", "make", tag, f"{home}/{folder}"),
            what="the supervisor's key",
        )
        line = made.stdout_tail.strip().splitlines()[-1:] if made.ok else []
        if not line or not line[0].startswith("ssh-"):
            raise RemoteError(
                f"no key for the supervisor: {made.output_tail(3)}",
                host=conn.label,
                code="supervisor-failed",
            )
        allowed = group.map(
            lambda e, c: c.run(
                hostside.command("supervisor_keys.sh", "allow", tag, line[0]), check=True
            ),
            only={e.label for e in hosts},
        )
        raise_for_failures(allowed)
        started = conn.run(
            hostside.command("supervisor_start.sh", "start", folder, env, code, spec.run_id),
            env={
                "VMRUN_SUPERVISOR_SECRETS": "\n".join(
                    f"{k}={v}" for k, v in (secrets or {}).items()
                )
            },
            what="the supervisor's start",
        )
        said = started.stdout_tail.strip().split()
        if not started.ok or len(said) < 2 or not said[-1].isdigit():
            raise RemoteError(
                f"the supervisor did not start: {started.output_tail(5)}",
                host=conn.label,
                code="supervisor-failed",
            )
    return Placed(supervisor.label, folder, int(said[-1]))


def _reach(settings: Settings, hosts: Sequence[HostEntry]) -> list[Reached]:
    """Each host as the supervisor is to reach it: its label, where this machine's ssh
    config sends it, the keys this machine knows for it (strict there as here)."""
    from vmrun.ssh.hostkeys import known_keys
    from vmrun.ssh.sshconfig import resolve

    reached: list[Reached] = []
    for entry in hosts:
        target = resolve(entry.spec, settings.ssh_config)
        if target.proxy_jump or target.proxy_command:
            raise UsageError(
                f"--recover: {entry.label} is reached through a jump host, which"
                " the supervisor cannot use yet",
                code="flags-conflict",
            )
        keys: dict[str, str] = {}
        for path in (settings.known_hosts, *target.known_hosts_files):
            if path.is_file():
                for kind, key in known_keys(path, target.host_key_name).items():
                    keys.setdefault(kind, key.get_base64())
        if not keys:
            raise UnknownHostKeyError(
                f"--recover: no known host key for {entry.label} here, to give its supervisor",
                host=entry.label,
                hint=f"connect to it once first (`vmrun exec -H {entry.label} true`)",
            )
        plain: dict[str, object] = {
            k: v for k, v in entry.vars.items() if isinstance(v, (str, int, float, dict))
        }
        reached.append(
            Reached(
                entry.label,
                target.hostname,
                target.port,
                target.user,
                target.host_key_name,
                keys,
                plain,
            )
        )
    return reached


def _probe(conn: Connection, python: str) -> tuple[str, str, str]:
    """The host's home, its interpreter (an absolute path) and its version, its machine."""
    got = conn.run(
        [
            "sh",
            "-c",
            'echo "$HOME"; command -v "$1" || echo -; "$1" -c "import sys,'
            " platform; print('%d.%d' % sys.version_info[:2], platform.machine())\"",
            "probe",
            python,
        ],
        what="the supervisor's host",
    )
    lines = got.stdout_tail.strip().splitlines()
    if not got.ok or len(lines) < 3 or lines[1] == "-":
        raise RemoteError(
            f"no {python} there for the supervisor",
            host=conn.label,
            hint="`vmrun setup` the host first",
            code="supervisor-failed",
        )
    version, machine = lines[2].split()
    return lines[0], lines[1], f"{version} {machine}"


def _install_env(conn: Connection, python: str, found: str, reqs: list[str]) -> tuple[str, bool]:
    """The env's path (relative to the home) and whether it was made now."""
    from vmrun.transfer.upload import upload

    version, machine = found.split()
    wheels = wheels_for(version, machine, reqs)
    sent = upload(conn, wheels, f"{HOME_DIR}/wheels")
    if not sent.ok:
        raise RemoteError(
            "could not send the supervisor's packages", host=conn.label, code="supervisor-failed"
        )
    key = hashlib.sha256(" ".join([found, *reqs]).encode()).hexdigest()[:12]
    env = f"{HOME_DIR}/env-{key}"
    made = conn.run(
        hostside.command("supervisor_install.sh", env, f"{HOME_DIR}/wheels", python, *reqs),
        what="the supervisor's env",
    )
    if not made.ok:
        raise RemoteError(
            f"the supervisor's env could not be made: {made.output_tail(5)}",
            host=conn.label,
            code="supervisor-failed",
        )
    return env, made.stdout_tail.strip().endswith("MADE")


def _send_tools(conn: Connection) -> None:
    """py-spy's wheels, as this machine has them, into the cache where the supervisor's
    vmrun looks first (vmrun.runs.stack_tool): none there, it would try a download."""
    from vmrun.runs import stack_tool
    from vmrun.transfer.upload import upload

    for wheel in stack_tool.wheels():
        if not upload(conn, wheel, f".cache/vmrun/tools/{wheel.name}").ok:
            raise RemoteError(
                "could not send py-spy's wheel to the supervisor",
                host=conn.label,
                code="supervisor-failed",
            )


def _install_code(conn: Connection) -> str:
    """This vmrun's package files (and the built-in playbooks, beside the package in a
    checkout: a new VM's setup replays them), under a folder named by their hash."""
    from vmrun.setup.playbook import builtin_dir
    from vmrun.transfer.upload import upload

    package = Path(__file__).resolve().parent.parent
    parts = {"vmrun": package}
    if builtin_dir().parent != package:
        parts["playbooks"] = builtin_dir()
    digest = hashlib.sha256()
    for name, top in parts.items():
        files = (p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for path in sorted(files):
            digest.update(f"{name}/{path.relative_to(top)}".encode() + b"\0" + path.read_bytes())
    code = f"{HOME_DIR}/code/{digest.hexdigest()[:12]}"
    for name, top in parts.items():
        if not upload(conn, top, f"{code}/{name}", exclude=("__pycache__",)).ok:
            raise RemoteError(
                "could not send vmrun's code", host=conn.label, code="supervisor-failed"
            )
    return code


def supervisor_toml(spec: Spec, reached: list[Reached], clouds: dict[str, Any] | None) -> str:
    """The supervisor's vmrun.toml: the store, the hosts as it reaches them and, for a
    `vmrun up` cluster, its table and the hosts' group (what a new VM in a lost one's place
    is made from; the profile left out: the credentials come with the secrets)."""
    import tomlkit

    doc = tomlkit.document()
    if spec.store:
        doc["store"] = spec.store
    hosts = tomlkit.aot()
    for r in reached:
        table = tomlkit.table()
        table["name"] = r.label
        table["address"] = f"{r.user}@{r.host}:{r.port}"
        for key, value in r.vars.items():
            if key not in ("name", "address", "groups"):
                table[key] = value
        if clouds and r.label in spec.renewable:
            table["groups"] = [spec.cluster]
        hosts.append(table)
    doc["hosts"] = hosts
    if clouds:
        cluster = tomlkit.aot()
        cluster.append({k: v for k, v in clouds.items() if k != "profile"})
        doc["clouds"] = cluster
    return tomlkit.dumps(doc)


def _write_folder(
    conn: Connection,
    folder: str,
    home: str,
    spec: Spec,
    reached: list[Reached],
    clouds: dict[str, Any] | None = None,
) -> None:
    """spec.json, the settings (config.toml, project/vmrun.toml), ssh_config, known_hosts."""
    from vmrun.transfer.upload import upload

    at = f"{home}/{folder}"
    with tempfile.TemporaryDirectory(prefix="vmrun-supervisor-") as tmp:
        local = Path(tmp) / "run"
        (local / "project").mkdir(parents=True)
        spec.save(local / "spec.json")
        known = "".join(
            f"{r.key_name} {kind} {key}\n" for r in reached for kind, key in r.keys.items()
        )
        (local / "known_hosts").write_text(known)
        (local / "ssh_config").write_text(
            f"Host *\n  IdentityFile {at}/id_ed25519\n  IdentitiesOnly yes\n"
        )
        (local / "config.toml").write_text(
            f'ssh_config = "{at}/ssh_config"\nknown_hosts = "{at}/known_hosts"\n'
        )
        (local / "project" / "vmrun.toml").write_text(supervisor_toml(spec, reached, clouds))
        sent = upload(conn, local, folder)
        if not sent.ok:
            raise RemoteError(
                "could not write the supervisor's folder", host=conn.label, code="supervisor-failed"
            )


@dataclass
class Supervised:
    """`train --recover`, checked before the run starts; `start` gives what puts the
    supervisor on its host once the run has started."""

    plan: Plan
    nodes: list[HostEntry]
    spares: list[HostEntry]
    supervisor: HostEntry
    settings: Settings
    max_recoveries: int
    reached: list[Reached]  # the nodes and spares as the supervisor reaches them
    cluster: str = ""  # the `vmrun up` cluster the nodes are VMs of (a lost one: a new VM)
    cloud: dict[str, str] = field(default_factory=dict)  # what it makes VMs with (secrets)
    ahead: Ahead | None = None  # its host prepared while the run is staged (`begin`)

    @classmethod
    def check(
        cls,
        plan: Plan,
        nodes: list[HostEntry],
        settings: Settings,
        *,
        spares: Sequence[str] = (),
        supervisor: str | None = None,
        max_recoveries: int | None = None,
    ) -> Supervised:
        from vmrun.ssh.inventory import select_hosts

        if plan.store is None:
            raise UsageError(
                "--recover needs the run's snapshots somewhere its nodes are not: a bucket",
                hint="add --store s3://BUCKET/PREFIX (or store = ... in vmrun.toml)",
                code="flags-conflict",
            )
        limit = DEFAULT_MAX_RECOVERIES if max_recoveries is None else max_recoveries
        if limit < 1:
            raise UsageError(f"--max-recoveries {limit}: 1 or more", code="flags-conflict")
        spared = select_hosts(list(spares), settings) if spares else []
        both = sorted({s.label for s in spared} & {n.label for n in nodes})
        if both:
            raise UsageError(
                f"--spare {', '.join(both)}: already a node of the run", code="flags-conflict"
            )
        chosen = select_hosts([supervisor], settings)[0] if supervisor else nodes[0]
        reached = _reach(settings, [*nodes, *spared])  # one it could not reach: refused now
        cluster = cluster_of(nodes, settings)  # its credentials found now, or refused now
        if cluster and chosen.label in {n.label for n in nodes}:
            cluster = ""  # a supervisor on a node of it would make VMs in its own place
        cloud = _cloud_secrets(settings, cluster)
        return cls(plan, list(nodes), spared, chosen, settings, limit, reached, cluster, cloud)

    def begin(self) -> None:
        """Start preparing the supervisor's host (its env, vmrun's code: 15 s and more the
        first time) beside the run's staging rather than after the run has started."""
        tools = self.settings.hang_timeout != OFF
        self.ahead = Ahead(self.settings, self.supervisor, store=True, tools=tools)

    def start(self, out: Reporter) -> Callable[[RunRef], None]:
        def started(ref: RunRef) -> None:
            from vmrun.backends.hosts.backend import _synced_files
            from vmrun.remote_paths import remote_workdir

            cluster = self.cluster
            spec = Spec(
                run_id=ref.run_id,
                nodes=list(ref.nodes),
                spares=[s.label for s in self.spares],
                max_recoveries=self.max_recoveries,
                store=str(self.plan.store),
                workdir=remote_workdir(self.plan.project),
                started=time.time(),
                cluster=cluster,
                renewable=[n.label for n in self.nodes] if cluster else [],
            )
            where = self.supervisor.label
            if where == ref.nodes[0]:
                out.warn(
                    f"the supervisor runs on the master {where}: should {where} itself be"
                    " lost, nothing brings the run back (--supervisor HOST: one that stays)"
                )
            try:
                told = _secrets(self.plan) | self.cloud | _notify(self.settings)
                placed = deploy(
                    self.settings,
                    spec,
                    self.supervisor,
                    [*self.nodes, *self.spares],
                    out,
                    secrets=told,
                    files=_synced_files(self.plan) or (),
                    reached=self.reached,
                    tools=self.settings.hang_timeout != OFF,
                    prepared=self.ahead.wait() if self.ahead else None,
                )
            except BaseException:  # asked to be recovered, it must not run unsupervised
                out.warn(f"run {ref.run_id}: no supervisor, so the run is stopped")
                self._stop(ref)
                raise
            spares = ", ".join(spec.spares) or "none"
            out.info(
                f"run {ref.run_id}: its supervisor runs on {placed.host} (pid {placed.pid}):"
                f" it brings the run back when a rank crashes or a node is lost, up to"
                f" {spec.max_recoveries} times; spares: {spares}"
            )

        return started

    def _stop(self, ref: RunRef) -> None:
        from vmrun.backends.hosts import records

        nodes = [n for n in self.nodes if n.label in ref.nodes]
        with Group(nodes, self.settings) as group:
            group.map(lambda e, conn: records.stop(conn, ref.run_id, grace=5))


class Ahead:
    """`prepare` on a connection of its own, in a thread of its own; `wait` gives what it
    made or raises what stopped it. A run that never starts leaves it unfinished: the env
    is recorded made only once it is whole (supervisor_install.sh), so nothing half made is
    ever used."""

    def __init__(self, settings: Settings, entry: HostEntry, *, store: bool, tools: bool):
        self._made: Prepared | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main,
            args=(settings, entry, store, tools),
            daemon=True,
            name="supervisor-prepare",
        )
        self._thread.start()

    def _main(self, settings: Settings, entry: HostEntry, store: bool, tools: bool) -> None:
        conn = Connection(entry.spec, settings, label=entry.label)
        try:
            self._made = prepare(conn, _python_of(entry), store=store, tools=tools)
        except BaseException as exc:  # told by `wait`, in the caller's thread
            self._error = exc
        finally:
            conn.close()

    def wait(self) -> Prepared:
        while self._thread.is_alive():  # in steps: Ctrl-C is heard while waiting
            self._thread.join(0.5)
        if self._error is not None:
            raise self._error
        assert self._made is not None
        return self._made


def _python_of(entry: HostEntry) -> str:
    return str(entry.vars.get("python") or "python3")


RUN_ENV = "VMRUN_RUN_ENV"  # the run's --env values, for its resumes (one secret line)
CLOUD_PREFIX = "VMRUN_CLOUD_"  # + AWS_*: what the supervisor makes VMs with


def run_env(env: dict[str, str]) -> str:
    """--env values as one line (base64 of JSON: a value may hold anything)."""
    import base64
    import json

    return base64.b64encode(json.dumps(env).encode()).decode()


def run_env_of(text: str) -> list[str]:
    """run_env's line back as --env KEY=VALUE items."""
    import base64
    import json

    try:
        env = json.loads(base64.b64decode(text))
    except ValueError:
        return []
    return [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else []


def _cluster_table(settings: Settings, name: str) -> dict[str, Any] | None:
    """Its `[[clouds]]` table in vmrun.toml (as `vmrun up` recorded it), if any."""
    for table in settings.project_data.get("clouds", []) or [] if name else []:
        if isinstance(table, dict) and table.get("name") == name:
            return dict(table)
    return None


def cluster_of(nodes: Sequence[HostEntry], settings: Settings) -> str:
    """The `vmrun up` cluster whose VMs every node is ("" if they are not): a lost one
    may then be replaced by a new VM of the same spec."""
    groups = {tuple(n.groups) for n in nodes}
    if len(groups) != 1 or any(not n.vars.get("instance") for n in nodes):
        return ""
    (names,) = groups
    found = [g for g in names if _cluster_table(settings, str(g))]
    return str(found[0]) if len(found) == 1 else ""


def _cloud_secrets(settings: Settings, cluster: str) -> dict[str, str]:
    """What the supervisor makes a VM with: the credentials this machine makes them with
    (the cluster's profile, resolved here: the supervisor's host has no such profile),
    frozen; a session token's expiry bounds how long it can."""
    table = _cluster_table(settings, cluster)
    if table is None:
        return {}
    from vmrun.providers.aws.session import Session

    session = Session(str(table.get("profile") or "") or None)
    session.check_credentials()
    frozen = session.frozen_credentials()
    told = {
        "AWS_ACCESS_KEY_ID": frozen[0],
        "AWS_SECRET_ACCESS_KEY": frozen[1],
        "AWS_SESSION_TOKEN": frozen[2],
    }
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):  # a stand-in's, in tests
        told[name] = os.environ.get(name, "")
    # names of their own: the bucket's keys and endpoint (the run's store) are not these
    return {f"{CLOUD_PREFIX}{k}": v for k, v in told.items() if v}


def _notify(settings: Settings) -> dict[str, str]:
    """Where the run's recoveries are told (the notify settings: its URLs may hold tokens,
    so they travel with the secrets, not in the supervisor's vmrun.toml)."""
    if not settings.notify:
        return {}
    return {
        "VMRUN_NOTIFY": ",".join(settings.notify),
        "VMRUN_NOTIFY_ON": ",".join(settings.notify_on),
    }


def _secrets(plan: Plan) -> dict[str, str]:
    """The run's --env values (never recorded, and a resume needs them again) and what the
    supervisor reads the run's bucket with: the user's keys, when the run's copy uses them
    (else the host's own, nothing sent)."""
    told = {RUN_ENV: run_env(plan.env)} if plan.env else {}
    access = plan.store_access
    if access is None:
        return told
    told["AWS_DEFAULT_REGION"] = access.region
    if access.endpoint:
        told["AWS_ENDPOINT_URL"] = access.endpoint
    if not access.from_host:
        told |= {"AWS_ACCESS_KEY_ID": access.key_id, "AWS_SECRET_ACCESS_KEY": access.secret}
        if access.token:
            told["AWS_SESSION_TOKEN"] = access.token
    return told
