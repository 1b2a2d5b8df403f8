"""The one place where argv lists become remote shell text.

Every remote command is built from an argv list and goes through `remote_command`, which
quotes each word for a POSIX shell (the login shell sshd starts) and wraps it in a small
`sh` script (vmrun/hostside/command_wrapper.sh, run by its path on the host like every
host-side file: a `HostPath` word is written `"$HOME"/path`). The script reads environment
values from stdin, so secrets never appear on a command line (not in `ps`, not in sshd's
logs), and it runs the command in its own process group that is killed when the SSH channel
goes away, so a dropped client never leaves an orphaned process on the host. While a
command runs, both the wrapper and the raw commands' vmrun/hostside/command_mark.sh leave a
marker that the host's autostop counts as vmrun's work (`activity=False` for what only
looks). Nothing here touches a host; the only I/O is reading those scripts once.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable, Mapping

_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote(word: str) -> str:
    """Quote one word so a POSIX shell reads it back byte for byte.

    Single quotes keep everything literal (`$`, backticks, `;`, newlines, unicode);
    a single quote itself is written as `'"'"'`. NUL cannot be passed in argv at all.
    """
    if not isinstance(word, str):
        raise TypeError(f"argv words must be str, not {type(word).__name__}")
    if "\x00" in word:
        raise ValueError("a command argument cannot contain a NUL byte")
    from vmrun.hostside import HostPath

    if isinstance(word, HostPath):  # a host-side file by path: absolute whatever the cwd
        return '"$HOME"/' + quote(str(word))
    if word and _SAFE.fullmatch(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def join(argv: Iterable[str]) -> str:
    """Quote and join an argv list into one shell command line."""
    words = [quote(w) for w in argv]
    if not words:
        raise ValueError("empty command")
    return " ".join(words)


def check_env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"invalid environment variable name {name!r}: use letters, digits and _")
    return name


def env_header(env: Mapping[str, str] | None) -> bytes:
    """The stdin preamble that `remote_command`'s script turns into exported variables.

    One `NAME=base64(value)` line per variable and an empty line to end it; base64 lets
    values hold newlines and any bytes without a second quoting scheme.
    """
    lines = []
    for name, value in (env or {}).items():
        check_env_name(name)
        if "\x00" in value:
            raise ValueError(f"environment value of {name} cannot contain a NUL byte")
        encoded = base64.b64encode(value.encode("utf-8", "surrogateescape")).decode("ascii")
        lines.append(f"{name}={encoded}\n")
    return ("".join(lines) + "\n").encode("ascii")


def run_script() -> str:
    """The wrapper every remote command runs under (vmrun/hostside/command_wrapper.sh: the
    environment from stdin, ~/.vmrun/bin on PATH, a session of its own that is killed when
    the channel goes away), by its path on the host."""
    from vmrun.hostside import path

    return quote(path("command_wrapper.sh"))


def remote_command(
    argv: Iterable[str],
    *,
    cwd: str | None = None,
    heartbeat: float | None = None,
    activity: bool = True,
) -> str:
    """The full command string for an exec channel running `argv` under the run script;
    with `heartbeat`, the client must send a line at least every `heartbeat` seconds.
    `activity`: the host's autostop counts it as work while it runs (False: it only looks)."""
    words = list(argv)
    if not words:
        raise ValueError("empty command")
    beat = "" if heartbeat is None else str(max(1, math.ceil(heartbeat)))
    from vmrun.remote_paths import ACTIVE_DIR, BIN_DIR

    mark = ACTIVE_DIR if activity else ""
    return f"exec /bin/sh {run_script()} " + join([cwd or "", beat, BIN_DIR, mark, *words])


def plain_command(argv: Iterable[str], *, activity: bool = True) -> str:
    """A command string with no wrapper, for byte streams (`cat`, `tar`) that need raw stdin.
    `activity`: as for `remote_command` (a marker while it runs: command_mark.sh)."""
    words = list(argv)
    if not words or not activity:
        return join(words)
    from vmrun.hostside import command
    from vmrun.remote_paths import ACTIVE_DIR

    return "exec /bin/" + join([*command("command_mark.sh", ACTIVE_DIR), *words])
