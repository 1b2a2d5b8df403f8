"""A run's container that its runtime refused to start, named from what the runtime said in
the run's output: runc (docker's; crun under podman) not permitted to set a limit the
container asks for, `error setting rlimits for ready process: error setting rlimit type 8:
operation not permitted` (a daemon without CAP_SYS_RESOURCE, and NGC's `memlock=-1`). The
run then ends with the client's own status (docker's 125), which says nothing of why; the
run's failure is raised instead as `container-rlimits`, naming the limit and the setting
that fixes it (`container_ulimits`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from vmrun.errors import CommandFailed, VmrunError
from vmrun.reporting import Passing, Progress, Reporter

# runc: `error setting rlimit type 8: operation not permitted`; crun: `setrlimit
# `RLIMIT_MEMLOCK`: Operation not permitted`
_REFUSED = re.compile(rb"(?i)(?:error setting rlimit|setrlimit\b)[^\n]*?operation not permitted")
_WHICH = re.compile(rb"rlimit type (\d+)|RLIMIT_([A-Z]+)")
# Linux's RLIMIT_* by number (runc names a limit so), as `--ulimit` and container_ulimits do
_NAMES = (
    "cpu",
    "fsize",
    "data",
    "stack",
    "core",
    "rss",
    "nproc",
    "nofile",
    "memlock",
    "as",
    "locks",
    "sigpending",
    "msgqueue",
    "nice",
    "rtprio",
    "rttime",
)


def refused_limit(text: bytes) -> str | None:
    """The limit a container runtime says it was not permitted to set, as container_ulimits
    names it (`memlock`; "" where it does not say which); None: no such refusal in `text`."""
    found = _REFUSED.search(text)
    if found is None:
        return None
    which = _WHICH.search(found.group(0))
    if which is None:
        return ""
    if which.group(1) is None:
        return which.group(2).decode().lower()
    number = int(which.group(1))
    return _NAMES[number] if number < len(_NAMES) else f"rlimit {number}"


def rlimits_refused(failure: VmrunError, limit: str) -> CommandFailed:
    """The run's failure (`run R exited with 125`) with its cause and fix, its status kept."""
    status = failure.exit_status if isinstance(failure, CommandFailed) else 1
    which = f"its {limit} limit" if limit else "a limit of it"
    return CommandFailed(
        f"{failure.message}: its container did not start: the runtime was not permitted to"
        f" set {which} (the container daemon lacks CAP_SYS_RESOURCE)",
        host=failure.host,
        hint="set container_ulimits in vmrun.toml (or the host's [[hosts]] table) within the"
        " host's hard limits (`ulimit -H -a` there), e.g. container_ulimits ="
        ' ["memlock=BYTES", "stack=67108864"]; or give the daemon CAP_SYS_RESOURCE',
        exit_status=status,
        code="container-rlimits",
    )


class RefusalWatch(Passing):
    """Passes a run's output on (and the rest as told), keeping the limit its container
    runtime refused when such a line goes by."""

    def __init__(self, out: Reporter):
        super().__init__(out)
        self.limit: str | None = None

    def output(self, data: bytes) -> None:
        self.out.output(data)
        if self.limit is None:
            self.limit = refused_limit(data)

    def progress(self, *, several: bool = False, live: bool = True) -> Progress:
        return self.out.progress(several=several, live=live)


@contextmanager
def naming_refusals(out: Reporter) -> Iterator[Reporter]:
    """`out`, watched while a run is followed: its failure (`run-failed`) raised in the
    block is raised as `container-rlimits` when its runtime refused a limit on the way."""
    watch = RefusalWatch(out)
    try:
        yield watch
    except VmrunError as failure:
        if watch.limit is None or failure.code != "run-failed":
            raise
        raise rlimits_refused(failure, watch.limit) from None
