"""Declarative setup playbooks: steps with a check, an apply, a verify and conditions.

A playbook is YAML a person can read (see playbooks/default.yaml for the fields). Each step's
fingerprint hashes its own definition, the params it uses and the run stamps of the steps
it needs, so a changed input re-runs that step and whatever depends on it, and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmrun.errors import ConfigError
from vmrun.setup.schema import Branches, kind, param_value, script

_STEP_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_PARAM_NAME = re.compile(r"[a-z][a-z0-9_]*")
_STEP_KEYS = {
    "name",
    "description",
    "when",
    "inputs",
    "needs",
    "sudo",
    "reboot",
    "check",
    "apply",
    "verify",
    "record",
    "relogin",
    "apt",
    "pip",
}
_WHEN_KEYS = {"gpu", "cluster", "env", "os", "param", "param_is", "param_not"}
_BOOK_KEYS = {"name", "description", "params", "steps"}
_FLAGS = ("sudo", "reboot", "record", "relogin")
# fields a step's definition hash holds only when set: added later, so that a step without
# them hashes as it did before and hosts set up then keep their state
_HASHED_WHEN_SET = ("branches", "picked", "relogin")
_SCRIPTS = ("check", "apply", "verify")


@dataclass(frozen=True)
class Step:
    name: str
    description: str = ""
    when: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    sudo: bool = False
    reboot: bool = False
    check: str = ""
    apply: str = ""
    verify: str = ""
    record: bool = False
    apt: tuple[str, ...] = ()  # sugar: packages that must be installed (check needs no sudo)
    pip: tuple[str, ...] = ()  # sugar: requirements pip-installed into the environment
    # scripts chosen by a param's value (field -> branches), until `resolved` picks them
    branches: Mapping[str, Branches] = field(default_factory=dict)
    picked: tuple[str, ...] = ()  # the params whose values picked this step's scripts
    # a new SSH session after it ran: a group it added (docker) is only in new logins' groups
    relogin: bool = False

    def definition_hash(self) -> str:
        body = json.dumps(
            {
                k: v
                for k, v in self.__dict__.items()
                if k != "description" and (v or k not in _HASHED_WHEN_SET)
            },
            sort_keys=True,
            default=lambda o: o.as_json() if isinstance(o, Branches) else list(o),
        )
        return hashlib.sha256(body.encode()).hexdigest()

    def resolved(self, params: Mapping[str, str]) -> Step:
        """The step with each branched script replaced by the branch its param's value picks:
        what runs, what --dry-run shows and what the fingerprint hashes."""
        if not self.branches:
            return self
        chosen = {name: branches.pick(params) for name, branches in self.branches.items()}
        picked = sorted({b.by for b in self.branches.values()} | set(self.picked))
        return replace(
            self,
            check=chosen.get("check", self.check),
            apply=chosen.get("apply", self.apply),
            verify=chosen.get("verify", self.verify),
            branches={},
            picked=tuple(picked),
        )

    @property
    def params_used(self) -> list[str]:
        """The params its fingerprint holds: its inputs and those that pick its scripts."""
        by = {b.by for b in self.branches.values()}
        return sorted(set(self.inputs) | set(self.picked) | by)


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    params: Mapping[str, str]
    steps: tuple[Step, ...]
    source: str
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # params' allowed values

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        known = ", ".join(s.name for s in self.steps)
        raise ConfigError(f"no step {name!r} in playbook {self.name}; its steps: {known}")

    def extended(self, extra: Sequence[Step], source: str) -> Playbook:
        names = {s.name for s in self.steps}
        for step in extra:
            if step.name in names:
                raise ConfigError(f"{source}: step {step.name!r} is already in {self.name}")
            names.add(step.name)
        book = Playbook(
            self.name,
            self.description,
            self.params,
            self.steps + tuple(extra),
            f"{self.source} + {source}",
            self.choices,
        )
        _check_needs(book)
        return book


def builtin_dir() -> Path:
    """Playbooks ship inside the wheel as vmrun/playbooks; a checkout has them at the top."""
    package = Path(__file__).resolve().parent.parent  # vmrun/
    for candidate in (package / "playbooks", package.parent / "playbooks"):
        if (candidate / "default.yaml").is_file():
            return candidate
    raise ConfigError("the built-in playbooks are missing from this installation; reinstall vmrun")


def load(path: Path | None = None) -> Playbook:
    """Load a playbook file (default: the built-in one) and validate every field."""
    import yaml

    path = path or builtin_dir() / "default.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"playbook {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"playbook {path} is not valid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ConfigError(f"playbook {path} must be a mapping with `steps:`")
    return parse(data, str(path))


def parse(data: Mapping[str, Any], source: str) -> Playbook:
    unknown = set(data) - _BOOK_KEYS
    if unknown:
        raise ConfigError(
            f"{source}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; known:"
            f" {', '.join(sorted(_BOOK_KEYS))}"
        )
    raw_params = data.get("params") or {}
    if not isinstance(raw_params, dict):
        raise ConfigError(f"{source}: params must be a mapping")
    params: dict[str, str] = {}
    choices: dict[str, tuple[str, ...]] = {}
    for key, value in raw_params.items():
        if not _PARAM_NAME.fullmatch(str(key)):
            raise ConfigError(f"{source}: bad param name {key!r} (lowercase letters, digits, _)")
        params[key], allowed = param_value(key, value, source)
        if allowed:
            choices[key] = allowed
    for key in ("name", "description"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{source}: {key} must be a string, not {kind(data[key])}")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ConfigError(f"{source}: `steps` must be a non-empty list")
    steps = parse_steps(raw_steps, source, set(params), choices)
    book = Playbook(
        name=str(data.get("name") or Path(source).stem),
        description=str(data.get("description") or ""),
        params=params,
        steps=tuple(steps),
        source=source,
        choices=choices,
    )
    _check_needs(book)
    return book


def parse_steps(
    raw_steps: Sequence[Any],
    source: str,
    params: set[str] | None = None,
    choices: Mapping[str, tuple[str, ...]] | None = None,
) -> list[Step]:
    """Steps, each field checked; `params` are the playbook's (None: not checked), and
    `choices` the allowed values of those a script may branch on."""
    steps: list[Step] = []
    for index, raw in enumerate(raw_steps, start=1):
        where = f"{source}: step #{index}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be a mapping")
        name = raw.get("name")
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
            raise ConfigError(f"{where} needs a name (lowercase letters, digits, - and _)")
        where = f"{source}: step {name!r}"
        unknown = set(raw) - _STEP_KEYS
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known:"
                f" {', '.join(sorted(_STEP_KEYS))}"
            )
        for flag in _FLAGS:
            if flag in raw and not isinstance(raw[flag], bool):
                raise ConfigError(f"{where}: {flag} must be true or false, not {kind(raw[flag])}")
        scripts = {f: script(raw.get(f), where, f, choices) for f in _SCRIPTS}
        plain = {f: s for f, s in scripts.items() if isinstance(s, str)}
        step = Step(
            name=name,
            description=_script(raw.get("description"), where, "description"),
            when=_when(raw.get("when"), where, params),
            inputs=_names(raw.get("inputs"), where, "inputs"),
            needs=_names(raw.get("needs"), where, "needs"),
            sudo=raw.get("sudo", False),
            reboot=raw.get("reboot", False),
            check=plain.get("check", ""),
            apply=plain.get("apply", ""),
            verify=plain.get("verify", ""),
            record=raw.get("record", False),
            relogin=raw.get("relogin", False),
            apt=_names(raw.get("apt"), where, "apt"),
            pip=_names(raw.get("pip"), where, "pip"),
            branches={f: s for f, s in scripts.items() if isinstance(s, Branches)},
        )
        if not (step.apply or step.apt or step.pip or "apply" in step.branches):
            raise ConfigError(f"{where} has nothing to do: give apply, apt or pip")
        if params is not None:
            missing = [p for p in step.inputs if p not in params]
            if missing:
                raise ConfigError(f"{where}: inputs {', '.join(missing)} are not params")
        if any(s.name == name for s in steps):
            raise ConfigError(f"{where} appears twice")
        steps.append(step)
    return steps


def _when(value: Any, where: str, params: set[str] | None) -> dict[str, Any]:
    """A step's conditions, each of the one type it means (a string where a list is meant
    would be iterated, and "false" is truthy: both are errors, not silent mismatches)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: when must be a mapping, not {kind(value)}")
    unknown = set(value) - _WHEN_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown condition(s) when.{', when.'.join(sorted(map(str, unknown)))};"
            f" when may hold {', '.join(sorted(_WHEN_KEYS))}"
        )
    when: dict[str, Any] = {}
    for key in ("gpu", "cluster"):
        if key in value:
            if not isinstance(value[key], bool):
                raise ConfigError(
                    f"{where}: when.{key} must be true or false, not {kind(value[key])}"
                )
            when[key] = value[key]
    for key in ("env", "os"):
        if key in value:
            when[key] = _values(value[key], where, f"when.{key}")
    if "param" in value:
        when["param"] = _param_name(value["param"], where, "when.param", params)
    for key in ("param_is", "param_not"):
        if key in value:
            when[key] = _param_values(value[key], where, f"when.{key}", params)
    return when


def _param_values(raw: Any, where: str, what: str, params: set[str] | None) -> dict[str, str]:
    """`{param: value, ...}` of when.param_is and when.param_not."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: {what} must be a mapping of param: value, not {kind(raw)}")
    return {
        _param_name(k, where, what, params): _scalar(v, where, f"{what}.{k}")
        for k, v in raw.items()
    }


def _values(value: Any, where: str, what: str) -> list[str]:
    """One value or a list of them, each a string (an OS release must be quoted: 20.10 as a
    YAML number is 20.1)."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, str) and v for v in items):
        raise ConfigError(
            f"{where}: {what} must be a string or a list of strings (quote versions:"
            f' "22.04"), not {kind(value)}'
        )
    return list(items)


def _scalar(value: Any, where: str, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{where}: {what} must be a string, not {kind(value)}")
    return str(value)


def _param_name(value: Any, where: str, what: str, params: set[str] | None) -> str:
    if not isinstance(value, str) or not _PARAM_NAME.fullmatch(value):
        raise ConfigError(f"{where}: {what} must name a param, not {kind(value)}")
    if params is not None and value not in params:
        raise ConfigError(f"{where}: {what} names {value!r}, which is not a param")
    return value


def _names(value: Any, where: str, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {what} must be a list of names, not {kind(value)}")
    return tuple(value)


def _script(value: Any, where: str, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {what} must be a string, not {kind(value)}")
    return value


def _check_needs(book: Playbook) -> None:
    seen: set[str] = set()
    names = {s.name for s in book.steps}
    for step in book.steps:
        for need in step.needs:
            if need not in names:
                raise ConfigError(f"{book.source}: step {step.name!r} needs unknown step {need!r}")
            if need not in seen:
                raise ConfigError(
                    f"{book.source}: step {step.name!r} needs {need!r}, which comes"
                    " after it; order the steps so needs come first"
                )
        seen.add(step.name)


def applies(
    step: Step,
    *,
    gpu: bool,
    env: str,
    os_release: str,
    params: Mapping[str, str],
    cluster: bool = False,
) -> str | None:
    """None when the step applies to this host, else why it is skipped. On a cluster's
    login node (`setup -C`) a step that needs root (sudo, apt, reboot) does not apply unless
    its `when.cluster` says it does: the compute nodes' drivers and packages are the admins'."""
    when = step.when
    if "cluster" in when and when["cluster"] != cluster:
        return "a cluster's login node" if cluster else "not a cluster"
    if cluster and "cluster" not in when and (step.sudo or step.apt or step.reboot):
        return "needs root: a cluster's nodes are the admins'"
    if "gpu" in when and when["gpu"] != gpu:
        return "no NVIDIA GPU" if when["gpu"] else "host has a GPU"
    if "env" in when and env not in when["env"]:
        return f"env manager is {env}"
    if "os" in when and os_release not in when["os"]:
        return f"OS release {os_release or 'unknown'}"
    if "param" in when and not params.get(str(when["param"]), "").strip():
        return f"{when['param']} not set"
    for key, value in (when.get("param_is") or {}).items():
        if params.get(str(key), "") != str(value):
            return f"{key}={params.get(str(key), '')}"
    for key, value in (when.get("param_not") or {}).items():
        if params.get(str(key), "") == str(value):
            return f"{key}={value}"
    return None


def fingerprint(step: Step, params: Mapping[str, str], stamps: Mapping[str, str]) -> str:
    """What a step's success depends on: its definition, its params, its needs' run stamps."""
    body = {
        "step": step.definition_hash(),
        "params": {name: params.get(name, "") for name in step.params_used},
        "needs": {name: stamps.get(name, "") for name in step.needs},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
