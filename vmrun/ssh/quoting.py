"""The one place where argv lists become remote shell text.

Every remote command is built from an argv list and goes through `remote_command`, which
quotes each word for a POSIX shell (the login shell sshd starts) and wraps it in a small
`sh` script. The script reads environment values from stdin, so secrets never appear on a
command line (not in `ps`, not in sshd's logs), and it runs the command in its own process
group that is killed when the SSH channel goes away, so a dropped client never leaves an
orphaned process on the host. This module is pure: no I/O, no imports beyond the stdlib.
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


# Runs as: sh -c SCRIPT vmrun CWD BEAT CMD ARGS...   (stdin: env header, then held open)
# - exports the env header's variables; puts ~/.vmrun/bin first on PATH (tools that vmrun
#   installs, and shims a user wants every vmrun command to see); cd to CWD if not empty;
# - runs CMD in a new session (setsid) with stdin from /dev/null;
# - a watcher waits for EOF on the channel's stdin; EOF while CMD runs means the client
#   went away, so it kills CMD's whole process group (TERM, then KILL after 5 s), and
#   exits as soon as the group is gone.
# - BEAT (seconds, or empty): the client also sends a line at least that often, and BEAT
#   seconds without one count as gone too. EOF never arrives while the link is down, so
#   an endless command (watch-gpus) would otherwise outlive its client until sshd gives
#   up on the dead TCP connection (many minutes). One bash `read -t` loop: sh has no -t.
RUN_SCRIPT = r"""d=$1 h=$2; shift 2
while IFS= read -r l && [ -n "$l" ]; do
  k=${l%%=*}
  v=$(printf %s "${l#*=}" | base64 -d && echo x) || { echo "vmrun: bad env" >&2; exit 125; }
  export "$k=${v%x}"
done
PATH="$HOME/.vmrun/bin:$PATH"; export PATH
if [ -n "$d" ]; then cd "$d" || exit 126; fi
exec 3<&0
setsid "$@" </dev/null 3<&- &
c=$!
{ if [ -n "$h" ]; then bash -c 'while IFS= read -r -t "$1" _; do :; done' vmrun-beat "$h"
  else cat >/dev/null; fi
  kill -TERM -"$c" || exit 0; i=0
  while kill -0 -"$c" && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL -"$c"
} <&3 >/dev/null 2>&1 &
w=$!
exec 3<&-
wait "$c"; r=$?
kill "$w" 2>/dev/null
exit "$r"
"""


def remote_command(
    argv: Iterable[str], *, cwd: str | None = None, heartbeat: float | None = None
) -> str:
    """The full command string for an exec channel running `argv` under the run script;
    with `heartbeat`, the client must send a line at least every `heartbeat` seconds."""
    words = list(argv)
    if not words:
        raise ValueError("empty command")
    beat = "" if heartbeat is None else str(max(1, math.ceil(heartbeat)))
    return "exec /bin/sh -c " + join([RUN_SCRIPT, "vmrun", cwd or "", beat, *words])


def plain_command(argv: Iterable[str]) -> str:
    """A command string with no wrapper, for byte streams (`cat`, `tar`) that need raw stdin."""
    return join(argv)
