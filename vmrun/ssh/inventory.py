"""The project's hosts (`[[hosts]]` in vmrun.toml) and which of them a command works on.

Hosts come from `-H/--host` (repeatable), else `VMRUN_HOSTS`, else every host in the
project file. An item can be a host's `name` from vmrun.toml, `@group`, or a host spec.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun.config import PROJECT_FILE, Settings
from vmrun.errors import ConfigError, UsageError
from vmrun.ssh.hosts import HostSpec, parse_host, parse_hosts

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


@dataclass
class Recorded:
    """What record_hosts changed in vmrun.toml."""

    added: list[HostEntry] = field(default_factory=list)
    updated: list[HostEntry] = field(default_factory=list)


def record_hosts(project_dir: Path, entries: Sequence[HostEntry]) -> Recorded:
    """Append hosts that vmrun.toml lacks and update the values (e.g. `python`) of hosts it
    lists, editing the text in place so the user's comments and other lines stay as they are.

    Written to a temporary file with the original's mode and renamed, so a crash never leaves
    half a file and a shared 0644 file does not turn 0600.
    """
    path = project_dir / PROJECT_FILE
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    from vmrun.config import load_settings

    existing = project_hosts(load_settings(cwd=project_dir)) if text else []
    done = Recorded()
    lines = text.splitlines(keepends=True)
    for entry in entries:
        known = _known_entry(existing, entry)
        if known is None:
            if entry not in done.added:
                done.added.append(entry)
            continue
        changes = {k: v for k, v in entry.vars.items() if known.vars.get(k) != v}
        if changes:
            edited = _set_values(lines, known.spec, changes)
            if edited is not None:
                lines = edited
                done.updated.append(entry)
    if not done.added and not done.updated:
        return done
    text = "".join(lines)
    blocks = [_host_block(entry) for entry in done.added]
    if blocks:
        if text and not text.endswith("\n"):
            text += "\n"
        text += ("\n" if text else "") + "\n".join(blocks)
    _replace_file(path, text)
    return done


def _known_entry(existing: Sequence[HostEntry], entry: HostEntry) -> HostEntry | None:
    for known in existing:
        if known.spec == entry.spec or (entry.name is not None and known.name == entry.name):
            return known
    return None


def _host_block(entry: HostEntry) -> str:
    lines = ["[[hosts]]", f"address = {_toml_value(entry.spec.label)}"]
    if entry.name:
        lines.append(f"name = {_toml_value(entry.name)}")
    if entry.groups:
        lines.append(f"groups = {_toml_value(list(entry.groups))}")
    lines += [f"{key} = {_toml_value(val)}" for key, val in entry.vars.items()]
    return "\n".join(lines) + "\n"


_HOSTS_HEADER = re.compile(r"^\s*\[\[\s*hosts\s*\]\]\s*(#.*)?$")
_ANY_HEADER = re.compile(r"^\s*\[\[?[^\[\]=,]+\]\]?\s*(#.*)?$")
_STRING_THEN_COMMENT = re.compile(r"""^("(?:[^"\\]|\\.)*"|'[^']*')(\s*#.*)?$""")


def _set_values(lines: list[str], spec: HostSpec, values: Mapping[str, Any]) -> list[str] | None:
    """`lines` with `values` set in the [[hosts]] table of `spec`; None if the text is laid out
    in a way this line editor cannot change safely (the file is then left as it is)."""
    span = _host_table(lines, spec)
    if span is None:
        return None
    start, end = span
    new = list(lines)
    for key, value in values.items():
        pattern = re.compile(rf"^(\s*{re.escape(key)}\s*=\s*)(.*?)(\r?\n)?$")
        for index in range(start + 1, end):
            found = pattern.match(new[index])
            if found:
                rest = _STRING_THEN_COMMENT.match(found[2].rstrip())
                comment = (rest[2] or "") if rest else ""
                new[index] = f"{found[1]}{_toml_value(value)}{comment}{found[3] or ''}"
                break
        else:
            address = next(i for i in range(start + 1, end) if _key_of(new[i]) == "address")
            if not new[address].endswith("\n"):
                new[address] += "\n"
            new.insert(address + 1, f"{key} = {_toml_value(value)}\n")
            end += 1
    from vmrun.config import tomllib

    try:
        data = tomllib.loads("".join(new))
    except tomllib.TOMLDecodeError:
        return None
    for item in data.get("hosts", []):
        if isinstance(item, dict) and _spec_of(item) == spec:
            return new if all(item.get(k) == v for k, v in values.items()) else None
    return None


def _host_table(lines: list[str], spec: HostSpec) -> tuple[int, int] | None:
    """(header line, end) of the [[hosts]] table whose address is `spec`."""
    from vmrun.config import tomllib

    headers = [i for i, line in enumerate(lines) if _ANY_HEADER.match(line)] + [len(lines)]
    for here, after in itertools.pairwise(headers):
        if not _HOSTS_HEADER.match(lines[here]):
            continue
        try:
            body = tomllib.loads("".join(lines[here + 1 : after]))
        except tomllib.TOMLDecodeError:
            continue
        if _spec_of(body) == spec and any(_key_of(x) == "address" for x in lines[here:after]):
            return here, after
    return None


def _key_of(line: str) -> str:
    key, sep, _ = line.partition("=")
    return key.strip() if sep else ""


def _spec_of(item: Mapping[str, Any]) -> HostSpec | None:
    try:
        return parse_host(item["address"]) if isinstance(item.get("address"), str) else None
    except UsageError:
        return None


def _replace_file(path: Path, text: str) -> None:
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".vmrun.toml.")
    try:
        os.fchmod(fd, mode)  # mkstemp makes it 0600
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
