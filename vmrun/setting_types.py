"""The kinds of value a setting can have: how each is read (from a file, `VMRUN_*` or a
flag), and how a config file must write it.

A parser takes the setting's name (for the message) and the raw value, and returns the value
or raises ConfigError with one line naming what is wrong. vmrun.config builds its settings
from these; `vmrun autostop` reads its periods with `period_seconds`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vmrun.errors import ConfigError


def positive_float(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{name} must be greater than 0, got {value!r}")
    return number


def positive_int(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{name} must be at least 1, got {value!r}")
    return number


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, got {value!r}")


def path(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigError(f"{name} must be a path, got {value!r}")
    return Path(os.path.expanduser(str(value)))


# -- periods ("30m", "1h30m", "90s"; a bare number is seconds) --------------------------------

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PERIOD = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
OFF = "off"


def period_seconds(text: str | int | float, *, what: str = "period") -> int:
    """`30m`, `2h`, `1h30m`, `90s`, `1d` or a number of seconds -> whole seconds (> 0)."""
    if isinstance(text, bool):
        raise ConfigError(f"{what} must be a period such as 30m, got {text!r}")
    if isinstance(text, (int, float)):
        seconds = int(text)
    else:
        word = text.strip().lower().replace(" ", "")
        match = _PERIOD.fullmatch(word)
        if word.isdigit():
            seconds = int(word)
        elif not word or match is None:
            raise ConfigError(
                f"{what} {text!r}: not a period; write it as 30m, 2h, 1h30m or 90s (d, h, m, s)"
            )
        else:
            counts = zip(match.groups(), _UNITS.values(), strict=True)
            seconds = sum(int(n) * unit for n, unit in counts if n)
    if seconds < 1:
        raise ConfigError(f"{what} must be at least 1s, got {text!r}")
    return seconds


def format_period(seconds: float) -> str:
    """Whole seconds as the shortest period text: 5400 -> `1h30m`, 90 -> `1m30s`."""
    rest, parts = int(seconds), list[str]()
    for unit, size in _UNITS.items():
        if rest >= size or (unit == "s" and not parts):
            count, rest = divmod(rest, size)
            parts.append(f"{count}{unit}")
    return "".join(parts)


def period(name: str, value: Any) -> str:
    """A period setting, kept in its shortest text form (`vmrun config` prints it back)."""
    return format_period(period_seconds(value, what=name))


def period_or_off(name: str, value: Any) -> str:
    """A period, or `off` (nothing to apply)."""
    if isinstance(value, str) and value.strip().lower() in (OFF, ""):
        return OFF
    return period(name, value)


def amount_or_off(name: str, value: Any) -> float:
    """A sum of money (in the machines' prices' currency), or `off`/0 (no cap): 0.0."""
    if isinstance(value, str) and value.strip().lower() in (OFF, ""):
        return 0.0
    try:
        number = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        number = -1.0
    if number < 0 or number != number or number == float("inf"):
        raise ConfigError(f"{name} must be an amount such as 25 or 7.5 (or off), got {value!r}")
    return number


def percent(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{name} must be a percentage 1-100, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a percentage 1-100, got {value!r}") from None
    if not 1 <= number <= 100:
        raise ConfigError(f"{name} must be a percentage 1-100, got {value!r}")
    return round(number)


def command(name: str, value: Any) -> str | list[str]:
    """A command: a line of shell text (run by `sh -c`), or a list of words (an argv); ""
    for the default."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and value and all(isinstance(w, str) and w for w in value):
        return list(value)
    raise ConfigError(f"{name} must be a command line in quotes or a list of words, got {value!r}")


def choice(*choices: str) -> Callable[[str, Any], str]:
    """A word out of `choices`."""

    def parse(name: str, value: Any) -> str:
        word = str(value).strip().lower()
        if not isinstance(value, str) or word not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        return word

    parse.__name__ = f"choice_{'_'.join(choices)}"
    return parse


SESSIONS = choice("active", "any", "ignore")
CONTAINER_RUNTIME = choice("auto", "docker", "podman", "pyxis", "apptainer", "shifter")
PULL = choice("newer", "missing", "always", "never")
STORE_CREDENTIALS = choice("auto", "host", "mine")
ON_HANG = choice("auto", "wait", "stop")


def text(name: str, value: Any) -> str:
    """A string as written; "" for none (an image reference is checked where it is used)."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string in quotes, got {value!r}")
    return value.strip()


def store(name: str, value: Any) -> str:
    """A bucket place, s3://BUCKET/PREFIX, checked as written ("" for none)."""
    from vmrun.errors import UsageError
    from vmrun.store_url import parse_store

    place = text(name, value)
    if place:
        try:
            parse_store(place)
        except UsageError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return place


def words(name: str, value: Any) -> list[str]:
    """A list of strings; from the environment or a flag, one string of comma-separated ones."""
    if isinstance(value, str):
        return [w.strip() for w in value.split(",") if w.strip()]
    if isinstance(value, list) and all(isinstance(w, str) and w.strip() for w in value):
        return [w.strip() for w in value]
    raise ConfigError(f"{name} must be a list of strings, got {value!r}")


EVENTS = ("end", "fail", "all")


def events(name: str, value: Any) -> list[str]:
    """Which of a run's events are told (`notify_on`): end, fail, all."""
    found = words(name, value)
    for word in found:
        if word not in EVENTS:
            raise ConfigError(f"{name}: {word!r} is not one of {', '.join(EVENTS)}")
    return found


# -- how each kind must be written in a config file ---------------------------------------------

FILE_TYPES: dict[Callable[[str, Any], Any], tuple[tuple[type, ...], str]] = {
    positive_float: ((int, float), "a number of seconds"),
    positive_int: ((int,), "a whole number"),
    boolean: ((bool,), "true or false"),
    path: ((str,), "a path in quotes"),
    period: ((str, int), 'a period in quotes, such as "30m"'),
    period_or_off: ((str, int), 'a period in quotes, such as "30m", or "off"'),
    percent: ((int, float), "a percentage, 1-100"),
    amount_or_off: ((int, float, str), 'an amount, such as 25 or 7.5, or "off"'),
    command: ((str, list), "a command line in quotes, or a list of words"),
    SESSIONS: ((str,), '"active", "any" or "ignore"'),
    CONTAINER_RUNTIME: ((str,), '"auto", "docker", "podman", "pyxis", "apptainer" or "shifter"'),
    PULL: ((str,), '"newer", "missing", "always" or "never"'),
    STORE_CREDENTIALS: ((str,), '"auto", "host" or "mine"'),
    ON_HANG: ((str,), '"auto", "wait" or "stop"'),
    text: ((str,), "a string in quotes"),
    store: ((str,), 'a bucket place in quotes, "s3://BUCKET/PREFIX"'),
    words: ((list,), 'a list of strings, ["a", "b"]'),
    events: ((list,), 'a list of "end", "fail", "all"'),
}


def accepts(parse: Callable[[str, Any], Any]) -> Callable[[Any], bool]:
    """A host key's check (vmrun.config.HOST_KEYS): the value has the type a file must write
    and its parser takes it."""
    types = FILE_TYPES[parse][0]

    def check(value: Any) -> bool:
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return False
        try:
            parse("value", value)
        except ConfigError:
            return False
        return True

    return check
