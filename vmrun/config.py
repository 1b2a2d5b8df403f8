"""Settings in one documented order: defaults < user config < project vmrun.toml < VMRUN_* < flags.

The user config is `$VMRUN_CONFIG`, else `$XDG_CONFIG_HOME/vmrun/config.toml`
(`~/.config/vmrun/config.toml`). The project file is the nearest `vmrun.toml` in the current
directory or its parents. Both hold the same top-level keys (see `FIELDS`); the project file
also lists hosts (see `vmrun.ssh.inventory`). Each resolved value remembers where it came from,
so `vmrun config` can say why a setting has the value it has.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PROJECT_FILE = "vmrun.toml"


def _positive_float(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{name} must be greater than 0, got {value!r}")
    return number


def _positive_int(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{name} must be at least 1, got {value!r}")
    return number


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def _path(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigError(f"{name} must be a path, got {value!r}")
    return Path(os.path.expanduser(str(value)))


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
    )
}


@dataclass
class Settings:
    """Resolved settings plus, for each, the layer it came from."""

    connect_timeout: float
    keepalive_interval: float
    keepalive_count_max: int
    accept_new_host_key: bool
    ssh_config: Path
    known_hosts: Path
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


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); fix the file and retry") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def _apply(
    values: dict[str, Any],
    sources: dict[str, str],
    layer: Mapping[str, Any],
    origin: str,
    *,
    strict: bool,
) -> None:
    for key, raw in layer.items():
        fld = FIELDS.get(key)
        if fld is None:
            if strict:
                known = ", ".join(FIELDS)
                raise ConfigError(f"unknown setting {key!r} in {origin}; known settings: {known}")
            continue
        if raw is None:
            continue
        values[key] = fld.parse(f"{key} (from {origin})", raw)
        sources[key] = origin


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve every setting through the five layers, later layers winning."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {name: fld.default(environ) for name, fld in FIELDS.items()}
    sources = dict.fromkeys(FIELDS, "default")

    user_path = user_config_path(environ)
    user_data = read_toml(user_path)
    _apply(values, sources, _settings_part(user_data), str(user_path), strict=True)

    project_dir = find_project_dir(cwd)
    project_data: dict[str, Any] = {}
    if project_dir is not None:
        path = project_dir / PROJECT_FILE
        project_data = read_toml(path)
        _apply(values, sources, _settings_part(project_data), str(path), strict=True)

    env_layer = {name: environ[fld.env] for name, fld in FIELDS.items() if fld.env in environ}
    _apply(values, sources, env_layer, "environment", strict=False)
    _apply(values, sources, dict(flags or {}), "command line", strict=False)
    return Settings(
        **values,
        sources=sources,
        project_dir=project_dir,
        project_data=project_data,
        user_data=user_data,
    )


def _settings_part(data: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level scalar keys are settings; tables (`[[hosts]]`, `[setup]`...) belong elsewhere."""
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
