"""`--env KEY[=VAL]` for exec and train: the values a remote command gets over its channel's
stdin (never on a command line), checked here before anything connects."""

from __future__ import annotations

import os

from vmrun.errors import UsageError
from vmrun.ssh.quoting import check_env_name


def parse_env(items: list[str] | None) -> dict[str, str]:
    """`KEY=VAL` sets a value; a bare `KEY` sends this machine's value of KEY (so a secret
    need not be typed on vmrun's own command line either)."""
    env: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            if name not in os.environ:
                raise UsageError(
                    f"--env {name}: {name} is not set here; use --env {name}=VALUE",
                    code="env-value-missing",
                )
            value = os.environ[name]
        try:
            check_env_name(name)
        except ValueError as exc:
            raise UsageError(f"--env {item!r}: {exc}") from None
        env[name] = value
    return env
