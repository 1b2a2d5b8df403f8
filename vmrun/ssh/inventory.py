"""The project's hosts (`[[hosts]]` in vmrun.toml), which of them a command works on, and
recording hosts that `vmrun setup` set up.

Hosts come from `-H/--host` (repeatable), else `VMRUN_HOSTS`, else every host in the
project file. An item can be a host's `name` from vmrun.toml, `@group`, or a host spec.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from vmrun.config import PROJECT_FILE, Settings
from vmrun.errors import ConfigError, UsageError
from vmrun.ssh.hosts import HostSpec, parse_host

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
    """Parse the project file's hosts, naming the entry at fault on bad input."""
    where = f"{settings.project_dir / PROJECT_FILE}" if settings.project_dir else PROJECT_FILE
    return parse_entries(settings.project_data.get("hosts", []), where)


def parse_entries(raw: object, where: str) -> list[HostEntry]:
    """Hosts as TOML holds them: `[[hosts]]` tables or `hosts = [...]`, each item a table
    with an address or just the address as a string."""
    if not isinstance(raw, list):
        raise ConfigError(f"`hosts` in {where} must be an array of tables ([[hosts]])")
    entries: list[HostEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(raw, start=1):
        entry = _entry(index, {"address": item} if isinstance(item, str) else item, where)
        if entry.label in seen:
            raise ConfigError(f"host {entry.label!r} appears twice in {where}")
        seen.add(entry.label)
        entries.append(entry)
    return entries


def _entry(index: int, item: object, where: str) -> HostEntry:
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
    return HostEntry(
        spec=spec,
        name=name,
        groups=tuple(groups),
        vars={k: v for k, v in item.items() if k not in ("address", "name", "groups")},
    )


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
                " vmrun.toml with `vmrun setup user@host`",
                code="no-hosts",
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
            raise UsageError(
                f"no host in vmrun.toml is in group {item[1:]!r}", code="group-not-found"
            )
        return group
    return _matching(item, known) or [HostEntry(spec=parse_host(item))]


def find_entry(entries: Sequence[HostEntry], name: str) -> HostEntry | None:
    """The host `name` means among `entries`, matched as `-H name` matches: a vmrun.toml
    `name` (or label) first, else the host spec, `user@host[:port]` or an ~/.ssh/config alias
    as written in the host's address. None when no entry is that host; text that is neither
    a known name nor a host spec raises HostSpecError (exit 2), as `-H` does. For options
    such as `--master` and `logs --node` that name one of the hosts already chosen."""
    found = _matching(name.strip(), list(entries))
    return found[0] if found else None


def _matching(item: str, known: list[HostEntry]) -> list[HostEntry]:
    by_name = [e for e in known if item in (e.name, e.label)]
    if by_name:
        return by_name
    spec = parse_host(item)
    return [e for e in known if e.spec == spec]


@dataclass
class Recorded:
    """What record_hosts changed in vmrun.toml, and what it could not (one line each, naming
    the file and the change, for the user to make by hand)."""

    added: list[HostEntry] = field(default_factory=list)
    updated: list[HostEntry] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)


def record_hosts(project_dir: Path, entries: Sequence[HostEntry]) -> Recorded:
    """Add hosts that vmrun.toml lacks and update the values (e.g. `python`) of hosts it
    lists, keeping the user's comments and layout: `[[hosts]]` tables, `hosts = [...]` of
    inline tables or of bare addresses (which become inline tables when they get a value).

    Each edit is checked by parsing the result: it must say exactly what the old file said
    plus the change, or the change is reported in `not_applied` instead. The file is
    replaced by a rename, so a crash never leaves half a file.
    """
    path = project_dir / PROJECT_FILE
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    existing = parse_entries(_load(text).get("hosts", []), str(path))
    done = Recorded()
    for entry in entries:
        known = _known_entry(existing, entry)
        if known is None:
            if not any(e.spec == entry.spec for e in done.added):
                done.added.append(entry)
            continue
        changes = {k: v for k, v in entry.vars.items() if known.vars.get(k) != v}
        if not changes:
            continue
        edited = _unless_unwritable(partial(_with_values, text, known.spec, changes))
        if edited is None:
            done.not_applied.append(f"{path}: could not set {_describe(changes)} for {known.label}")
        else:
            text = edited
            done.updated.append(entry)
    if done.added:
        tables = [_table_of(e) for e in done.added]
        edited = _unless_unwritable(partial(_with_hosts, text, tables))
        if edited is None:
            labels = ", ".join(e.label for e in done.added)
            done.not_applied.append(f"{path}: could not add the host(s) {labels}")
            done.added = []
        else:
            text = edited
    if done.added or done.updated:
        _replace_file(path, text)
    return done


def _load(text: str) -> dict[str, Any]:
    from vmrun.config import tomllib

    return tomllib.loads(text)


def _known_entry(existing: Sequence[HostEntry], entry: HostEntry) -> HostEntry | None:
    for known in existing:
        if known.spec == entry.spec or (entry.name is not None and known.name == entry.name):
            return known
    return None


def _unless_unwritable(edit: Callable[[], str | None]) -> str | None:
    """The edit's text, or None for a value TOML cannot hold (None, an object...)."""
    import tomlkit

    try:
        return edit()
    except tomlkit.exceptions.TOMLKitError:
        return None


def _describe(values: Mapping[str, Any]) -> str:
    import tomlkit

    parts = []
    for key, value in values.items():
        try:
            parts.append(f"{key} = {tomlkit.item(value).as_string()}")
        except tomlkit.exceptions.TOMLKitError:
            parts.append(f"{key} = {value!r}")
    return ", ".join(parts)


def _checked(new: str, expected: dict[str, Any]) -> str | None:
    """`new` if it parses to exactly `expected`: tomlkit kept everything else as it was."""
    from vmrun.config import tomllib

    try:
        return new if _load(new) == _plain(expected) else None
    except tomllib.TOMLDecodeError:
        return None


def _plain(value: Any) -> Any:
    """Tuples as TOML reads them back (lists), to compare data with a parsed file."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _with_values(text: str, spec: HostSpec, values: Mapping[str, Any]) -> str | None:
    """`text` with `values` set in the host of `spec`: in its table, or in an inline table
    that replaces its bare address."""
    import tomlkit

    doc, data = tomlkit.parse(text), _load(text)
    for hosts, inline in ((doc["hosts"], tomlkit.inline_table()), (data["hosts"], {})):
        for index, item in enumerate(hosts):
            if isinstance(item, str) and parse_host(item) == spec:
                inline.update({"address": str(item), **_plain(dict(values))})
                hosts[index] = inline
                break
            if isinstance(item, dict) and _spec_of(item) == spec:
                item.update(_plain(dict(values)))
                break
    return _checked(tomlkit.dumps(doc), data)


def _with_hosts(text: str, tables: list[dict[str, Any]]) -> str | None:
    """`text` with hosts appended in the file's own layout: into `hosts = [...]` (a bare
    address where there is nothing else to say), else as `[[hosts]]` tables."""
    import tomlkit

    doc, data = tomlkit.parse(text), _load(text)
    hosts = doc.get("hosts")
    if isinstance(hosts, tomlkit.items.Array):
        for table in tables:
            item = table["address"] if len(table) == 1 else tomlkit.inline_table()
            if not isinstance(item, str):
                item.update(table)
            hosts.append(item)
            data["hosts"].append(item if isinstance(item, str) else table)
        return _checked(tomlkit.dumps(doc), data)
    data.setdefault("hosts", []).extend(tables)
    if isinstance(hosts, tomlkit.items.AoT):
        for table in tables:
            block = tomlkit.table()
            block.update(table)
            if hosts[-1].as_string().endswith("\n\n"):  # a blank line, then more tables
                block.add(tomlkit.nl())
            else:
                hosts[-1].add(tomlkit.nl())
            hosts.append(block)
        return _checked(tomlkit.dumps(doc), data)
    gap = "" if not text else "\n" if text.endswith("\n") else "\n\n"
    return _checked(text + gap + tomlkit.dumps({"hosts": tables}), data)


def _table_of(entry: HostEntry) -> dict[str, Any]:
    table: dict[str, Any] = {"address": entry.spec.label}
    if entry.name:
        table["name"] = entry.name
    if entry.groups:
        table["groups"] = list(entry.groups)
    return {**table, **_plain(dict(entry.vars))}


def _spec_of(item: Mapping[str, Any]) -> HostSpec | None:
    try:
        return parse_host(item["address"]) if isinstance(item.get("address"), str) else None
    except UsageError:
        return None


def _replace_file(path: Path, text: str) -> None:
    """Write `text` to a new file beside `path` and rename it over. The new file keeps the
    old one's mode, or, for a first file, gets 0666 less the umask from the kernel itself
    (reading the umask means setting it, process-wide: not safe with threads)."""
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def forget_group(project_dir: Path, group: str) -> list[str]:
    """Remove from vmrun.toml every host whose only group is `group` (what `vmrun up` made);
    the labels removed. Hosts the user put in the group beside others stay."""
    path = project_dir / PROJECT_FILE
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    data = _load(text)
    entries = parse_entries(data.get("hosts", []), str(path))
    gone = [e for e in entries if e.groups == (group,)]
    if not gone:
        return []
    import tomlkit

    doc = tomlkit.parse(text)
    hosts = doc["hosts"]
    keep = [i for i, e in enumerate(entries) if e not in gone]
    data["hosts"] = [data["hosts"][i] for i in keep]
    for index in reversed(range(len(entries))):
        if index not in keep:
            del hosts[index]
    if not data["hosts"]:
        del doc["hosts"], data["hosts"]
    new = _checked(tomlkit.dumps(doc), data)
    if new is None:
        raise ConfigError(f"{path}: could not remove the hosts of {group}; remove them by hand")
    _replace_file(path, new)
    return [e.label for e in gone]


def move_host(project_dir: Path, entry: HostEntry) -> None:
    """Give the host named `entry.name` the entry's address and values where it stands in
    vmrun.toml (a replaced VM): its other values, its place among the hosts and the file's
    comments stay. record_hosts never changes an address; forget and add would move it."""
    path = project_dir / PROJECT_FILE
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    entries = parse_entries(_load(text).get("hosts", []), str(path))
    known = next((e for e in entries if entry.name is not None and e.name == entry.name), None)
    if known is None:
        raise ConfigError(f"{path} has no host named {entry.name!r}")
    values: dict[str, Any] = {"address": entry.spec.label}
    values.update({k: v for k, v in entry.vars.items() if known.vars.get(k) != v})
    edited = _unless_unwritable(partial(_with_values, text, known.spec, values))
    if edited is None:
        raise ConfigError(f"{path}: could not set {_describe(values)} for {known.label}")
    _replace_file(path, edited)


def record_table(project_dir: Path, array: str, values: Mapping[str, Any]) -> None:
    """Add (or replace) the `[[array]]` table whose name is values["name"], keeping the rest
    of vmrun.toml as it is (`vmrun up` records its `[[clouds]]` table so)."""
    import tomlkit

    path = project_dir / PROJECT_FILE
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    doc, data = tomlkit.parse(text), _load(text)
    tables = data.setdefault(array, [])
    names = [t.get("name") if isinstance(t, dict) else None for t in tables]
    block = tomlkit.table()
    block.update(_plain(dict(values)))
    if values["name"] in names:
        index = names.index(values["name"])
        doc[array][index] = block
        tables[index] = _plain(dict(values))
    else:
        if array not in doc:
            if text:
                doc.add(tomlkit.nl())
            doc.add(array, tomlkit.aot())
        doc[array].append(block)
        tables.append(_plain(dict(values)))
    new = _checked(tomlkit.dumps(doc), data)
    if new is None:
        raise ConfigError(f"{path}: could not record [[{array}]] {values['name']!r}")
    _replace_file(path, new)


def forget_table(project_dir: Path, array: str, name: str) -> bool:
    """Remove the `[[array]]` table named `name`; False when there was none."""
    import tomlkit

    path = project_dir / PROJECT_FILE
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    doc, data = tomlkit.parse(text), _load(text)
    tables = data.get(array, [])
    names = [t.get("name") if isinstance(t, dict) else None for t in tables]
    if name not in names:
        return False
    index = names.index(name)
    del doc[array][index]
    del tables[index]
    if not tables:
        del doc[array], data[array]
    new = _checked(tomlkit.dumps(doc), data)
    if new is None:
        raise ConfigError(f"{path}: could not remove [[{array}]] {name!r}; remove it by hand")
    _replace_file(path, new)
    return True
