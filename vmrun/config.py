"""Settings in one documented order: defaults < user config < project vmrun.toml < VMRUN_* < flags.

The user config is `$VMRUN_CONFIG`, else `$XDG_CONFIG_HOME/vmrun/config.toml`
(`~/.config/vmrun/config.toml`). The project file is the nearest `vmrun.toml` in the current
directory or its parents. Both hold the same top-level keys (see `FIELDS`); the project file
also lists hosts (see `vmrun.ssh.inventory`). Each resolved value remembers where it came from,
so `vmrun config` can say why a setting has the value it has.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun import setting_types as kinds
from vmrun.errors import ConfigError
from vmrun.setting_types import FILE_TYPES as _FILE_TYPES
from vmrun.setting_types import boolean as _boolean
from vmrun.setting_types import path as _path
from vmrun.setting_types import positive_float as _positive_float
from vmrun.setting_types import positive_int as _positive_int

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PROJECT_FILE = "vmrun.toml"


def _home(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("HOME") or os.path.expanduser("~"))


def _user_config_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or str(_home(environ) / ".config")
    return Path(base) / "vmrun"


@dataclass(frozen=True)
class Field:
    name: str
    parse: Callable[[str, Any], Any]
    default: Callable[[Mapping[str, str]], Any]
    doc: str

    @property
    def env(self) -> str:
        return "VMRUN_" + self.name.upper()


FIELDS: dict[str, Field] = {
    f.name: f
    for f in (
        Field(
            "connect_timeout",
            _positive_float,
            lambda env: 10.0,
            "seconds to wait for TCP connect, SSH handshake and authentication",
        ),
        Field(
            "parallel",
            _positive_int,
            lambda env: 64,
            "hosts worked on at once; the rest wait their turn (connections and commands)",
        ),
        Field(
            "jump_handshakes",
            _positive_int,
            lambda env: 8,
            "SSH handshakes at once through one jump host (below sshd's MaxStartups, 10)",
        ),
        Field(
            "keepalive_interval",
            _positive_float,
            lambda env: 5.0,
            "seconds between liveness probes on an open connection",
        ),
        Field(
            "keepalive_count_max",
            _positive_int,
            lambda env: 3,
            "unanswered probes before a connection is declared lost",
        ),
        Field(
            "accept_new_host_key",
            _boolean,
            lambda env: False,
            "trust a host's key on first use (never a changed key)",
        ),
        Field(
            "ssh_config",
            _path,
            lambda env: _home(env) / ".ssh" / "config",
            "OpenSSH client config to honour (User, Port, IdentityFile, ProxyJump...)",
        ),
        Field(
            "known_hosts",
            _path,
            lambda env: _user_config_dir(env) / "known_hosts",
            "vmrun's own known_hosts, read with ~/.ssh/known_hosts; new keys go here",
        ),
        # `vmrun autostop` (vmrun.autostop): each may also be given per host in vmrun.toml
        Field(
            "autostop",
            kinds.period_or_off,
            lambda env: kinds.OFF,
            "power a host off once idle this long (30m, 2h...), or off",
        ),
        Field(
            "autostop_command",
            kinds.command,
            lambda env: "",
            "the power-off command (a line, or a list of words); empty: sudo -n shutdown -h now",
        ),
        Field(
            "autostop_sessions",
            kinds.SESSIONS,
            lambda env: "active",
            "login sessions that keep a host up: active (input within the period), any, ignore",
        ),
        Field(
            "autostop_gpu_threshold",
            kinds.percent,
            lambda env: 10,
            "a GPU busy this much (%) or more keeps its host up",
        ),
        Field(
            "autostop_warn",
            kinds.period_or_off,
            lambda env: "5m",
            "warn logged-in users (wall) this long before powering off, or off",
        ),
        Field(
            "autostop_interval",
            kinds.period,
            lambda env: "1m",
            "how often the watchdog checks; it starts nothing more often than this",
        ),
        Field(
            "autostop_budget",
            kinds.period_or_off,
            lambda env: kinds.OFF,
            "power a host off once it has run this long in all, its runs stopped with their"
            " work saved first (`vmrun up --max-cost` sets it per VM from the price), or off",
        ),
        # `train --image` (vmrun.containers): each may also be given per host in vmrun.toml
        Field(
            "image",
            kinds.text,
            lambda env: "",
            "train inside this container image (REGISTRY/PATH:TAG or a .sif); empty: no image",
        ),
        Field(
            "mounts",
            kinds.words,
            lambda env: [],
            "host paths the image's container sees, SRC:DST[:ro] (with --mount)",
        ),
        Field(
            "pull",
            kinds.PULL,
            lambda env: "newer",
            "when the image is pulled: newer (the registry's if it answers, else the host's"
            " own), missing, always, never",
        ),
        Field(
            "container_runtime",
            kinds.CONTAINER_RUNTIME,
            lambda env: "auto",
            "what runs the image: auto (docker, else podman on hosts), or one by name",
        ),
        Field(
            "container_ulimits",
            kinds.words,
            lambda env: [],
            "the container's limits, NAME=SOFT[:HARD]; empty: NGC's memlock=-1 and 64 MiB stack",
        ),
        # buckets (vmrun.stores): `push s3://...`, `train --store`
        Field(
            "store",
            kinds.store,
            lambda env: "",
            "where runs' outputs go as they are written: s3://BUCKET/PREFIX (each run in"
            " PREFIX/RUN_ID); empty: nowhere",
        ),
        Field(
            "store_credentials",
            kinds.STORE_CREDENTIALS,
            lambda env: "auto",
            "what the hosts read a bucket with: auto (yours from here if found, else the"
            " host's own), host (an instance profile), mine",
        ),
        # `train --notify` (vmrun.notify)
        Field(
            "notify",
            kinds.words,
            lambda env: [],
            "where runs' ends are told: Apprise URLs (ntfy://TOPIC, slack://A/B/C, json://...)",
        ),
        Field(
            "notify_on",
            kinds.events,
            lambda env: ["end", "fail"],
            "which events are told: end, fail, all (requeues, stops, autostop's warning too)",
        ),
        # `train --recover`: a supervisor brings runs on hosts back (vmrun.recovery); a
        # Slurm job requeues itself (slurm_recover.bash)
        Field(
            "recover",
            _boolean,
            lambda env: False,
            "every run is brought back after a failure: on hosts by a supervisor (needs a"
            " store), on a cluster by its job",
        ),
        Field(
            "max_recoveries",
            _positive_int,
            lambda env: 5,
            "a run gives up after this many recoveries",
        ),
        Field(
            "spares",
            kinds.words,
            lambda env: [],
            "hosts that take a lost node's place (vmrun.toml names, aliases, user@host)",
        ),
        Field(
            "supervisor",
            kinds.text,
            lambda env: "",
            "where the supervisor runs; empty: the run's master",
        ),
        # `train --hang-timeout`: each node's hang watcher (hostside/hang_watch.py)
        Field(
            "hang_timeout",
            kinds.period_or_off,
            lambda env: "20m",
            "a run with no progress this long (no heartbeat, no line from a rank) is hung:"
            " said once, every rank's stacks taken; off: not watched",
        ),
        Field(
            "on_hang",
            kinds.ON_HANG,
            lambda env: "auto",
            "what a hung run does: wait, stop (a --recover run then restarts from its"
            " snapshot), auto (stop with --recover, else wait)",
        ),
        # `train --max-cost`: each node's budget watcher (hostside/budget_watch.py)
        Field(
            "max_cost",
            kinds.amount_or_off,
            lambda env: 0.0,
            "a run that has cost this much (its nodes' prices, in their currency) snapshots"
            " and stops; 0 or off: no cap",
        ),
    )
}


@dataclass
class Settings:
    """Resolved settings plus, for each, the layer it came from."""

    connect_timeout: float
    parallel: int
    jump_handshakes: int
    keepalive_interval: float
    keepalive_count_max: int
    accept_new_host_key: bool
    ssh_config: Path
    known_hosts: Path
    autostop: str
    autostop_command: str | list[str]
    autostop_sessions: str
    autostop_gpu_threshold: int
    autostop_warn: str
    autostop_interval: str
    autostop_budget: str
    image: str
    mounts: list[str]
    pull: str
    container_runtime: str
    container_ulimits: list[str]
    store: str
    store_credentials: str
    notify: list[str]
    notify_on: list[str]
    recover: bool
    max_recoveries: int
    spares: list[str]
    supervisor: str
    hang_timeout: str
    on_hang: str
    max_cost: float
    sources: dict[str, str] = field(default_factory=dict)
    project_dir: Path | None = None
    project_data: dict[str, Any] = field(default_factory=dict)
    user_data: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Any]:
        """A table such as [setup], user config first, project file over it."""
        merged: dict[str, Any] = {}
        for data in (self.user_data, self.project_data):
            table = data.get(name)
            if table is not None and not isinstance(table, dict):
                raise ConfigError(f"[{name}] must be a table in vmrun.toml / config.toml")
            merged.update(table or {})
        return merged


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    explicit = environ.get("VMRUN_CONFIG")
    return Path(explicit) if explicit else _user_config_dir(environ) / "config.toml"


def find_project_dir(start: Path | None = None) -> Path | None:
    """The nearest directory at or above `start` holding a vmrun.toml."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / PROJECT_FILE).is_file():
            return candidate
    return None


def read_toml(path: Path, *, project: bool = False) -> dict[str, Any]:
    """A config file's data, every key checked (see `check_file`); {} if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); fix the file and retry") from None
    check_file(data, text, str(path), project=project)
    return data


# Tables whose keys their own command checks ([setup]: the playbook's parameters).
SECTIONS = ("setup",)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_price(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


_PRICE = (
    _is_price,
    "an amount per hour, a number such as 0.526 (USD unless `currency` says;"
    " `vmrun up` records the cloud's)",
)


def _is_currency(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 3 and value.isascii() and value.isupper()


_CURRENCY = (_is_currency, 'a currency\'s ISO 4217 code, such as "DKK" (prices are USD without it)')


def _is_env_table(value: Any) -> bool:
    scalars = (str, int, float, bool)
    return isinstance(value, dict) and all(isinstance(v, scalars) for v in value.values())


# What a host in vmrun.toml may say, and the type each key must have. A key here is read by
# the code that needs it (`entry.vars.get(KEY)`): add it here when adding such a read.
HOST_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "address": (_is_str, 'a string, "user@host[:port]"'),
    "name": (_is_str, "a string"),
    "groups": (_is_str_list, "a list of strings"),
    "python": (_is_str, "a path in quotes"),
    "private_addr": (_is_str, "an address in quotes"),
    "ifname": (_is_str, "an interface name in quotes"),
    "env": (_is_env_table, 'a table of NAME = "value"'),
    "nvidia_smi": (_is_str, "a path in quotes"),
    "instance": (_is_str, "a cloud instance id (`vmrun up` records it)"),
    "store_role": (_is_str, "the bucket place the host's own role reaches (`vmrun up --store`)"),
    "price": _PRICE,  # what the machine costs an hour (vmrun.results.cost)
    "currency": _CURRENCY,  # the price's (`vmrun up --cloud ucloud` records DKK)
    **{
        key: (kinds.accepts(FIELDS[key].parse), kinds.FILE_TYPES[FIELDS[key].parse][1])
        for key in FIELDS
        if key.startswith(("autostop", "image", "mounts", "pull", "container_"))
    },
}
# What a Slurm cluster in vmrun.toml may say (`[[clusters]]`; read by vmrun.backends.slurm.cluster).
CLUSTER_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_is_str, "a string"),
    "login": (_is_str, 'a string, "user@login-node[:port]" or an ssh_config alias'),
    "partition": (_is_str, "a string"),
    "account": (_is_str, "a string"),
    "qos": (_is_str, "a string"),
    "workdir": (_is_str, 'a path in quotes ("{user}" is the login user)'),
    "modules": (_is_str_list, "a list of strings"),
    "python": (_is_str, "a path in quotes"),
    "env": (_is_env_table, 'a table of NAME = "value"'),
    "sbatch_args": (_is_str_list, "a list of strings"),
    "price": _PRICE,  # per node an hour (vmrun.results.cost)
    "currency": _CURRENCY,
    # each run's --max-cost on this cluster, unless given (hostside/slurm_job.bash)
    "max_cost": (_is_price, "an amount, a number such as 25, in the price's currency"),
    # the hosts vmrun made this cluster of (`setup --slurm`; vmrun.operations.queue)
    "nodes": (_is_str_list, "a list of hosts"),
    # false: no folder every node sees; each run's project is synced to every node
    "shared": (lambda v: isinstance(v, bool), "true or false"),
    "accounting": (lambda v: isinstance(v, bool), "true or false"),  # slurmdbd (setup --slurm)
    **{
        key: (kinds.accepts(FIELDS[key].parse), kinds.FILE_TYPES[FIELDS[key].parse][1])
        for key in FIELDS
        if key.startswith(("image", "mounts", "pull", "container_"))
    },
}


def _is_cidr(value: Any) -> bool:
    import ipaddress

    try:
        return isinstance(value, str) and bool(ipaddress.ip_network(value, strict=False))
    except ValueError:
        return False


CLOUDS = ("aws", "ucloud")  # the providers vmrun.providers builds
_BOOL = (kinds.accepts(kinds.boolean), "true or false")
# What a cloud cluster in vmrun.toml may say (`[[clouds]]`, as `vmrun up` writes and reads
# it: the flags of `vmrun up NAME`; read by vmrun.operations.cloud and `vmrun cloud`).
CLOUD_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_is_str, "a string"),
    "cloud": (lambda v: v in CLOUDS, " or ".join(f'"{c}"' for c in CLOUDS)),
    "type": (_is_str, 'an instance type in quotes, such as "g4dn.2xlarge"'),
    "count": (kinds.accepts(kinds.positive_int), "a whole number, 1 or more"),
    "region": (_is_str, "a region in quotes"),
    "zone": (_is_str, "a zone in quotes"),
    "spot": _BOOL,
    "spot_fallback": _BOOL,
    "disk": (kinds.accepts(kinds.positive_int), "a size in GB, a whole number"),
    "image": (_is_str, '"dlami", "ubuntu" or an image id, in quotes'),
    "user": (_is_str, "a login user in quotes"),
    "autostop": (kinds.accepts(kinds.period_or_off), kinds.FILE_TYPES[kinds.period_or_off][1]),
    "autostop_terminate": _BOOL,
    "ssh_from": (_is_cidr, 'an address range in quotes, such as "203.0.113.7/32"'),
    "profile": (_is_str, "an AWS profile name in quotes"),
    "placement": _BOOL,
    "store": (kinds.accepts(kinds.store), kinds.FILE_TYPES[kinds.store][1]),
    # the cluster's cap (`up --max-cost`): each VM powers off once it has run its share
    "max_cost": (_is_price, "an amount, a number such as 25, in the cloud's currency"),
    # what `vmrun setup` was asked on its VMs (vmrun.operations.setup.replayable): a new VM
    # in a lost one's place is set up so
    "setup": (lambda v: isinstance(v, dict), "a table of `vmrun setup`'s options"),
}
_ARRAYS = {
    "hosts": ("host", HOST_KEYS),
    "clusters": ("cluster", CLUSTER_KEYS),
    "clouds": ("cloud", CLOUD_KEYS),
}


def check_file(data: Mapping[str, Any], text: str, path: str, *, project: bool) -> None:
    """Refuse what vmrun would otherwise ignore: an unknown key, or a value of the wrong
    type, anywhere in the user config or vmrun.toml, named by file, line and key."""
    for key, value in data.items():
        where = _where(path, text, key)
        if key in FIELDS:
            fld = FIELDS[key]
            types, what = _FILE_TYPES[fld.parse]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise ConfigError(f"{where}: {key} must be {what}, got {_shown(value)}")
            fld.parse(f"{key} (from {where})", value)
        elif key in _ARRAYS and project:
            _check_tables(key, value, text, path)
        elif key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key} must be a table, [{key}]")
        else:
            known = ", ".join(
                [*FIELDS, *(f"[{t}]" for t in SECTIONS), *([f"[[{a}]]" for a in _ARRAYS] * project)]
            )
            raise ConfigError(f"{where}: unknown setting {key!r}; known: {known}")


def _check_tables(array: str, tables: Any, text: str, path: str) -> None:
    """`[[hosts]]`, `[[clusters]]` or `[[clouds]]`: every key known and of its type, named
    by line."""
    noun, keys = _ARRAYS[array]
    if not isinstance(tables, list):
        where = _where(path, text, array)
        raise ConfigError(
            f"{where}: {array} must be [[{array}]] tables or a list, got {_shown(tables)}"
        )
    for index, table in enumerate(tables):
        if not isinstance(table, dict) and array == "clouds":
            where = _where(path, text, array)
            raise ConfigError(f"{where}: {noun} #{index + 1} must be a [[{array}]] table")
        if not isinstance(table, dict):
            continue  # a bare address, or not a table: the reader says which
        for key, value in table.items():
            where = _where(path, text, key, host=index, array=array)
            if key not in keys:
                hint = "; settings go at the top of the file" if key in FIELDS else ""
                raise ConfigError(
                    f"{where}: unknown key {key!r} in {noun} #{index + 1}{hint}; a {noun}'s"
                    f" keys: {', '.join(keys)}"
                )
            check, what = keys[key]
            if not check(value):
                raise ConfigError(
                    f"{where}: {key} of {noun} #{index + 1} must be {what}, got {_shown(value)}"
                )


def _shown(value: Any) -> str:
    """A value as TOML writes it, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    return repr(value)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")


def _where(path: str, text: str, key: str, *, host: int | None = None, array: str = "hosts") -> str:
    """`path line N`: where `key` is written at the top level, or in table number `host` of
    `array` (a [[hosts]] table, or an item of `hosts = [...]`); just `path` when not found."""
    plain = re.escape(key)
    name = rf"(?:{plain}|\"{plain}\"|'{plain}')\s*[=.]"
    written = re.compile(rf"^\s*{name}" if host is None else rf"(?:^|[{{,\s]){name}")
    table: str | None = None
    seen = -1  # [[array]] tables so far
    inline = False  # inside `array = [...]`
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        header = _HEADER.match(line)
        if header:
            table, inline = header[2], False
            seen += header[1] == "[[" and table == array
            parts = [p.strip().strip("\"'") for p in table.split(".")]
            # [key], [key.sub], [[key]] at the top; [hosts.key] in a host
            found = (parts[0] == key) if host is None else (parts == [array, key] and seen == host)
            if found:
                return f"{path} line {number}"
            continue
        if host is None:
            here = table is None and not inline
        else:
            here = inline or (table == array and seen == host)
        if here and written.search(line):
            return f"{path} line {number}"
        inline = inline or (table is None and re.match(rf"\s*{array}\s*=", line) is not None)
    return path


FLAGS = "command line"  # the layer of flags, in `Settings.sources`


def _apply(
    values: dict[str, Any], sources: dict[str, str], layer: Mapping[str, Any], origin: str
) -> None:
    """Parse a layer's settings over the values so far (files were checked on reading)."""
    for key, raw in layer.items():
        fld = FIELDS.get(key)
        if fld is None or raw is None:
            continue
        # a flag's own name where the user typed it (`--autostop '30x': not a period`)
        name = f"--{key.replace('_', '-')}" if origin == FLAGS else f"{key} (from {origin})"
        values[key] = fld.parse(name, raw)
        sources[key] = origin


SET = "--set"  # the layer of `--set KEY=VALUE` (git's -c): over VMRUN_*, under a command's flags


def parse_sets(given: Sequence[str]) -> dict[str, str]:
    """`--set KEY=VALUE` words as {key: value}: KEY a setting (a vmrun.toml key), VALUE as
    VMRUN_KEY would give it; one clear line for a word that is neither."""
    found: dict[str, str] = {}
    for word in given:
        key, sep, value = word.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in FIELDS:
            what = f"{key!r} is no setting" if sep else "it has no ="
            raise ConfigError(
                f"--set {word!r}: {what}",
                hint=f"--set KEY=VALUE, KEY one of: {', '.join(FIELDS)} (docs/settings.md)",
            )
        found[key] = value
    return found


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
    sets: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve every setting through the layers, later layers winning: defaults, the user's
    config, vmrun.toml, VMRUN_*, `--set`, the command's own flags."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {name: fld.default(environ) for name, fld in FIELDS.items()}
    sources = dict.fromkeys(FIELDS, "default")

    user_path = user_config_path(environ)
    user_data = read_toml(user_path)
    _apply(values, sources, _settings_part(user_data), str(user_path))

    project_dir = find_project_dir(cwd)
    project_data: dict[str, Any] = {}
    if project_dir is not None:
        path = project_dir / PROJECT_FILE
        project_data = read_toml(path, project=True)
        _apply(values, sources, _settings_part(project_data), str(path))

    env_layer = {name: environ[fld.env] for name, fld in FIELDS.items() if fld.env in environ}
    _apply(values, sources, env_layer, "environment")
    _apply(values, sources, dict(sets or {}), SET)
    _apply(values, sources, dict(flags or {}), FLAGS)
    return Settings(
        **values,
        sources=sources,
        project_dir=project_dir,
        project_data=project_data,
        user_data=user_data,
    )


def _settings_part(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a (checked) file: its other keys are `hosts` and the sections."""
    return {k: v for k, v in data.items() if k in FIELDS}
