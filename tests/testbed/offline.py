"""Running a command with no network at all, so a test's lookups never reach real DNS.

``offline_argv(argv)`` runs ``argv`` in a network namespace of its own that has no
interface up (not even ``lo``): every connect fails at once, and a DNS lookup fails at
once too (the resolver's nameserver is unreachable: "Temporary failure in name
resolution"), so a made-up name such as ``no-such-host.invalid`` is "cannot resolve"
without a single packet leaving the machine. ``/etc/hosts`` still answers (``localhost``).
As root that is ``unshare --net``; otherwise ``unshare --map-root-user --net``, where the
kernel allows user namespaces (``skip_reason_no_offline()`` says when it does not).
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence

from .tools import UNSHARE


def offline_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` in an empty network namespace (unshare execs it: the pid is the command)."""
    flags = ["--net"] if os.geteuid() == 0 else ["--map-root-user", "--net"]
    return [UNSHARE, *flags, "--", *argv]


@functools.cache
def skip_reason_no_offline() -> str | None:
    """None when ``offline_argv`` works here; otherwise why not, as a skip reason."""
    try:
        probe = subprocess.run(
            offline_argv(["true"]), capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {UNSHARE}: {exc}"
    if probe.returncode != 0:
        return f"no empty network namespace here ({probe.stderr.strip() or probe.returncode})"
    return None
