"""Two shapes a playbook's values may take beyond plain strings: a param with a closed set of
values (`env: {default: venv, choices: [venv, uv, conda, python]}`), and a script with one
branch per value of such a param (`apply: {by: env, venv: "...", uv: "...", ...}`), of which
only the branch for the param's value runs, and only it is what --dry-run shows.

Both are checked strictly when the playbook loads: every branch a value the param allows, a
branch for every value it allows, each a string; any other input is one line naming the file,
the step and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vmrun.errors import ConfigError

_PARAM_KEYS = {"default", "choices"}


@dataclass(frozen=True)
class Branches:
    """A script chosen by a param's value: `scripts` has one per value the param allows."""

    by: str
    scripts: Mapping[str, str]

    def pick(self, params: Mapping[str, str]) -> str:
        value = params.get(self.by, "")
        if value not in self.scripts:
            raise ConfigError(
                f"{self.by}={value!r} has no branch; use {_either(list(self.scripts))}"
            )
        return self.scripts[value]

    def as_json(self) -> dict[str, Any]:
        return {"by": self.by, "scripts": dict(self.scripts)}


def kind(value: Any) -> str:
    """How a YAML value reads to the person who wrote it, for an error message."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _either(values: list[str]) -> str:
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def param_value(key: str, value: Any, source: str) -> tuple[str, tuple[str, ...]]:
    """A param's default and its choices (none: any string): a plain value, or a mapping of
    `default` and `choices`."""
    where = f"{source}: param {key}"
    if isinstance(value, dict):
        unknown = sorted(map(str, set(value) - _PARAM_KEYS))
        missing = [k for k in sorted(_PARAM_KEYS) if k not in value]
        if unknown or missing:
            said = f"unknown field(s) {', '.join(unknown)}" if unknown else f"no {missing[0]}"
            raise ConfigError(
                f"{where}: {said}; a param given as a mapping holds default and choices"
            )
        choices = value["choices"]
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise ConfigError(f"{where}: choices must be a list of strings, not {kind(choices)}")
        default, _ = param_value(key, value["default"], source)
        if default not in choices:
            raise ConfigError(f"{where}: default {default!r} is not one of its choices")
        return default, tuple(choices)
    if isinstance(value, bool) or not isinstance(value, (str, int, float, type(None))):
        raise ConfigError(f"{where}: must be a string (quote it), not {kind(value)}")
    return "" if value is None else str(value), ()


def script(
    value: Any, where: str, what: str, choices: Mapping[str, tuple[str, ...]] | None
) -> str | Branches:
    """A step's script: a string, or branches by a param that has choices."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where}: {what} must be a string or a mapping with `by:`, not {kind(value)}"
        )
    by = value.get("by")
    allowed = (choices or {}).get(by) if isinstance(by, str) else None
    if not isinstance(by, str) or not allowed:
        raise ConfigError(
            f"{where}: {what}.by must name a param with choices (a param given as"
            f" {{default: ..., choices: [...]}}), not {kind(by)}"
        )
    scripts = {k: v for k, v in value.items() if k != "by"}
    unknown = [str(k) for k in scripts if k not in allowed]
    if unknown:
        raise ConfigError(
            f"{where}: unknown branch(es) {what}.{', '.join(unknown)};"
            f" {by} is one of {', '.join(allowed)}"
        )
    missing = [c for c in allowed if c not in scripts]
    if missing:
        raise ConfigError(f"{where}: {what} has no branch for {by}={_either(missing)}")
    for key, text in scripts.items():
        if not isinstance(text, str):
            raise ConfigError(f"{where}: {what}.{key} must be a string, not {kind(text)}")
    return Branches(by, {c: scripts[c] for c in allowed})
