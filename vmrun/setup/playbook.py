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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmrun.errors import ConfigError

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
    "apt",
    "pip",
}
_WHEN_KEYS = {"gpu", "env", "os", "param", "param_not"}


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

    def definition_hash(self) -> str:
        body = json.dumps(
            {k: v for k, v in self.__dict__.items() if k != "description"},
            sort_keys=True,
            default=list,
        )
        return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    params: Mapping[str, str]
    steps: tuple[Step, ...]
    source: str

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
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: params must be a mapping")
    for key in params:
        if not _PARAM_NAME.fullmatch(str(key)):
            raise ConfigError(f"{source}: bad param name {key!r} (lowercase letters, digits, _)")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ConfigError(f"{source}: `steps` must be a non-empty list")
    steps = parse_steps(raw_steps, source, {str(k) for k in params})
    book = Playbook(
        name=str(data.get("name") or Path(source).stem),
        description=str(data.get("description") or ""),
        params={str(k): "" if v is None else str(v) for k, v in params.items()},
        steps=tuple(steps),
        source=source,
    )
    _check_needs(book)
    return book


def parse_steps(
    raw_steps: Sequence[Any], source: str, params: set[str] | None = None
) -> list[Step]:
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
        when = raw.get("when") or {}
        if not isinstance(when, dict) or set(when) - _WHEN_KEYS:
            raise ConfigError(f"{where}: when may hold {', '.join(sorted(_WHEN_KEYS))}")
        step = Step(
            name=name,
            description=str(raw.get("description") or ""),
            when=when,
            inputs=_names(raw.get("inputs"), where, "inputs"),
            needs=_names(raw.get("needs"), where, "needs"),
            sudo=bool(raw.get("sudo", False)),
            reboot=bool(raw.get("reboot", False)),
            check=_script(raw.get("check"), where, "check"),
            apply=_script(raw.get("apply"), where, "apply"),
            verify=_script(raw.get("verify"), where, "verify"),
            record=bool(raw.get("record", False)),
            apt=_names(raw.get("apt"), where, "apt"),
            pip=_names(raw.get("pip"), where, "pip"),
        )
        if not (step.apply or step.apt or step.pip):
            raise ConfigError(f"{where} has nothing to do: give apply, apt or pip")
        if params is not None:
            missing = [p for p in step.inputs if p not in params]
            if missing:
                raise ConfigError(f"{where}: inputs {', '.join(missing)} are not params")
        if any(s.name == name for s in steps):
            raise ConfigError(f"{where} appears twice")
        steps.append(step)
    return steps


def _names(value: Any, where: str, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {what} must be a list of names")
    return tuple(value)


def _script(value: Any, where: str, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {what} must be a shell script (a string)")
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
    step: Step, *, gpu: bool, env: str, os_release: str, params: Mapping[str, str]
) -> str | None:
    """None when the step applies to this host, else why it is skipped."""
    when = step.when
    if "gpu" in when and bool(when["gpu"]) != gpu:
        return "no NVIDIA GPU" if when["gpu"] else "host has a GPU"
    if "env" in when and env not in when["env"]:
        return f"env manager is {env}"
    if "os" in when and os_release not in [str(v) for v in when["os"]]:
        return f"OS release {os_release or 'unknown'}"
    if "param" in when and not params.get(str(when["param"]), "").strip():
        return f"{when['param']} not set"
    for key, value in (when.get("param_not") or {}).items():
        if params.get(str(key), "") == str(value):
            return f"{key}={value}"
    return None


def fingerprint(step: Step, params: Mapping[str, str], stamps: Mapping[str, str]) -> str:
    """What a step's success depends on: its definition, its params, its needs' run stamps."""
    body = {
        "step": step.definition_hash(),
        "params": {name: params.get(name, "") for name in step.inputs},
        "needs": {name: stamps.get(name, "") for name in step.needs},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
