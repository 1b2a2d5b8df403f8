"""The project's hosts (`[[hosts]]` in vmrun.toml) and which of them a command works on.

Hosts come from `-H/--host` (repeatable), else `VMRUN_HOSTS`, else every host in the
project file. An item can be a host's `name` from vmrun.toml, `@group`, or a host spec.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun.config import PROJECT_FILE, Settings
from vmrun.errors import ConfigError, UsageError
from vmrun.hosts import HostSpec, parse_host, parse_hosts

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class HostEntry:
    """A host and what the project says about it (python env, GPUs, private address...)."""

    spec: HostSpec
    name: str | None = None
    groups: tuple[str, ...] = ()
    vars: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name or self.spec.label


def project_hosts(settings: Settings) -> list[HostEntry]:
    """Parse `[[hosts]]` from the project file, naming the entry at fault on bad input."""
    raw = settings.project_data.get("hosts", [])
    where = f"{settings.project_dir / PROJECT_FILE}" if settings.project_dir else PROJECT_FILE
    if not isinstance(raw, list):
        raise ConfigError(f"`hosts` in {where} must be an array of tables ([[hosts]])")
    entries: list[HostEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(raw, start=1):
        if not isinstance(item, dict) or not isinstance(item.get("address"), str):
            raise ConfigError(f'host #{index} in {where} needs address = "user@host[:port]"')
        try:
            spec = parse_host(item["address"])
        except UsageError as exc:
            raise ConfigError(f"host #{index} in {where}: {exc.message}") from None
        name = item.get("name")
        if name is not None and not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ConfigError(f"host #{index} in {where}: name must be letters, digits, . _ -")
        groups = item.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ConfigError(f"host #{index} in {where}: groups must be a list of names")
        entry = HostEntry(
            spec=spec,
            name=name,
            groups=tuple(groups),
            vars={k: v for k, v in item.items() if k not in ("address", "name", "groups")},
        )
        if entry.label in seen:
            raise ConfigError(f"host {entry.label!r} appears twice in {where}")
        seen.add(entry.label)
        entries.append(entry)
    return entries


def select_hosts(
    requested: Sequence[str] | None, settings: Settings, environ: Mapping[str, str] | None = None
) -> list[HostEntry]:
    """The hosts a command works on, in the order given, without repeats."""
    environ = os.environ if environ is None else environ
    known = project_hosts(settings)
    items = [i for text in (requested or []) for i in re.split(r"[,\s]+", text) if i]
    if not items and environ.get("VMRUN_HOSTS", "").strip():
        items = [i for i in re.split(r"[,\s]+", environ["VMRUN_HOSTS"]) if i]
    if not items:
        if not known:
            raise UsageError(
                "no hosts given: pass -H user@host, set VMRUN_HOSTS, or record hosts in"
                " vmrun.toml with `vmrun setup user@host`"
            )
        return known
    chosen: list[HostEntry] = []
    for item in items:
        for entry in _match(item, known):
            if entry not in chosen:
                chosen.append(entry)
    return chosen


def _match(item: str, known: list[HostEntry]) -> list[HostEntry]:
    if item.startswith("@"):
        group = [e for e in known if item[1:] in e.groups]
        if not group:
            raise UsageError(f"no host in vmrun.toml is in group {item[1:]!r}")
        return group
    by_name = [e for e in known if e.name == item]
    if by_name:
        return by_name
    (spec,) = parse_hosts([item])
    return [e for e in known if e.spec == spec] or [HostEntry(spec=spec)]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to vmrun.toml")


def record_hosts(project_dir: Path, entries: Sequence[HostEntry]) -> list[HostEntry]:
    """Append hosts that vmrun.toml lacks, keeping the user's text and comments as they are.

    Written to a temporary file and renamed, so a crash never leaves half a file.
    """
    path = project_dir / PROJECT_FILE
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    from vmrun.config import load_settings

    existing = project_hosts(load_settings(cwd=project_dir)) if text else []
    have = {e.spec for e in existing} | {e.name for e in existing if e.name}
    added = [e for e in entries if e.spec not in have and (e.name is None or e.name not in have)]
    if not added:
        return []
    blocks = []
    for entry in added:
        lines = ["[[hosts]]", f"address = {_toml_value(entry.spec.label)}"]
        if entry.name:
            lines.append(f"name = {_toml_value(entry.name)}")
        if entry.groups:
            lines.append(f"groups = {_toml_value(list(entry.groups))}")
        lines += [f"{key} = {_toml_value(val)}" for key, val in entry.vars.items()]
        blocks.append("\n".join(lines) + "\n")
    if text and not text.endswith("\n"):
        text += "\n"
    new_text = text + ("\n" if text else "") + "\n".join(blocks)
    fd, tmp = tempfile.mkstemp(dir=project_dir, prefix=".vmrun.toml.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(new_text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return added
