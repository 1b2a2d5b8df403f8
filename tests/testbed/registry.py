"""The registry of beds on this machine: state files, the lock, and removing beds.

Every bed records itself in ``/run/vmrun-testbed/<prefix>.json`` with its creating
pid and that pid's start time.  Allocation and sweeping happen under
``/run/vmrun-testbed/lock``.  A bed is removed by *name* (everything called
``<prefix>-*``), never from memory, so half-made and crashed beds go too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from .cgroups import prefix_cgroups, remove_cgroup_tree, top_cgroups
from .errors import TestbedError
from .files import listdir, write_atomic
from .layout import (
    DEFAULT_HOME_ROOT,
    DEFAULT_PREFIX_PATTERN,
    ETC_NETNS,
    NETNS_RUN_DIR,
    SWITCH_SUFFIX,
    guard_route_del,
    guard_routes,
    route_metric,
)
from .procs import (
    kill_until_gone,
    ns_ident,
    pid_alive,
    pid_starttime,
    pids_in_netns_idents,
    uid_pids,
)
from .tools import USERDEL, ip_batch, run_cmd

STATE_DIR = Path("/run/vmrun-testbed")


# --------------------------------------------------------------------------- state files


def _ensure_state_dir() -> None:
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


@contextlib.contextmanager
def registry_lock() -> Iterator[None]:
    """Serialise prefix/subnet allocation and sweeping between concurrent beds (and processes)."""
    _ensure_state_dir()
    fd = os.open(STATE_DIR / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def write_state(prefix: str, **fields: Any) -> None:
    """Record the bed ``prefix`` as owned by this process (plus ``fields``)."""
    _ensure_state_dir()
    state = {"prefix": prefix, "pid": os.getpid(), "starttime": pid_starttime(os.getpid())}
    write_atomic(state_path(prefix), json.dumps({**state, **fields}, indent=1) + "\n")


def read_states() -> dict[str, dict[str, Any]]:
    states: dict[str, dict[str, Any]] = {}
    if not STATE_DIR.is_dir():
        return states
    for path in STATE_DIR.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        states[path.stem] = data
    return states


def state_owner_alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    return pid_starttime(pid) == state.get("starttime")


# --------------------------------------------------------------------------- prefixes


def _names_with_prefix(names: Iterable[str], pattern: str) -> set[str]:
    rx = re.compile(rf"^({pattern})-")
    return {m.group(1) for n in names if (m := rx.match(n))}


def prefix_resources(prefix: str, home_root: Path) -> dict[str, list[Any]]:
    """Everything on the machine that belongs to ``prefix`` (found by name, not by memory)."""
    head = prefix + "-"
    namespaces = sorted(n for n in listdir(NETNS_RUN_DIR) if n.startswith(head))
    # host namespaces first, the switch last (it holds the bridges the hosts plug into)
    namespaces.sort(key=lambda n: n == f"{head}{SWITCH_SUFFIX}")
    users = [pw for pw in pwd.getpwall() if pw.pw_name.startswith(head)]
    links = [n for n in listdir(Path("/sys/class/net")) if n.startswith(head)]
    etc_dirs = [ETC_NETNS / n for n in listdir(ETC_NETNS) if n.startswith(head)]
    homes = [home_root / prefix] if (home_root / prefix).exists() else []
    homes += [Path(pw.pw_dir) for pw in users if Path(pw.pw_dir).exists()]
    return {
        "namespaces": namespaces,
        "users": users,
        "links": links,
        "etc_dirs": etc_dirs,
        "homes": homes,
        "cgroups": prefix_cgroups(prefix),  # the cgroup parents of its dockerds
    }


def prefix_in_use(prefix: str, home_root: Path) -> bool:
    """A state file or any resource named after ``prefix`` exists."""
    return state_path(prefix).exists() or any(prefix_resources(prefix, home_root).values())


def new_prefix() -> str:
    """A fresh ``vmt<4 hex>`` prefix (call under :func:`registry_lock`)."""
    while True:
        prefix = "vmt" + secrets.token_hex(2)
        if not prefix_in_use(prefix, DEFAULT_HOME_ROOT):
            return prefix


# --------------------------------------------------------------------------- removal


def userdel(name: str) -> None:
    """userdel, retrying while another process holds the passwd lock."""
    for attempt in range(50):
        proc = run_cmd([USERDEL, name], check=False)
        if proc.returncode in (0, 6):  # 6: no such user
            return
        if proc.returncode == 8:  # user logged in: kill raced a fork; force it
            run_cmd([USERDEL, "-f", name], check=False)
            return
        if attempt == 49:
            raise TestbedError(f"userdel {name} failed: {proc.stderr.strip()}")
        time.sleep(0.05)


def destroy_prefix(
    prefix: str, home_root: Path, reap: Callable[[], None] | None = None
) -> list[str]:
    """Remove every trace of ``prefix``; tolerant of half-made beds.  Returns what survived."""
    res = prefix_resources(prefix, home_root)
    idents = {i for n in res["namespaces"] if (i := ns_ident(NETNS_RUN_DIR / n))}
    uids = {pw.pw_uid for pw in res["users"]}

    def everything() -> list[int]:
        return sorted(set(pids_in_netns_idents(idents)) | set(uid_pids(uids)))

    problems: list[str] = []
    try:
        kill_until_gone(everything, reap=reap)
    except TestbedError as exc:
        problems.append(str(exc))
    # Root-namespace links first and explicitly: namespace teardown in the kernel is
    # asynchronous, an explicit delete is not.
    ip_batch((f"link del {n}" for n in res["links"]), force=True)
    if (metric := route_metric(prefix)) in guard_routes():
        ip_batch([guard_route_del(metric)], force=True)
    ip_batch((f"netns del {n}" for n in res["namespaces"]), force=True)
    for pw in res["users"]:
        try:
            userdel(pw.pw_name)
        except TestbedError as exc:
            problems.append(str(exc))
    for name in res["cgroups"]:  # empty now: every process in them was killed above
        remove_cgroup_tree(name)
    for path in res["homes"] + res["etc_dirs"]:
        shutil.rmtree(path, ignore_errors=True)
    for empty_dir in (home_root, ETC_NETNS):
        with contextlib.suppress(OSError):
            empty_dir.rmdir()  # only succeeds when no other bed uses it
    state_path(prefix).unlink(missing_ok=True)
    return problems + _left(prefix, home_root, idents)


def _left(prefix: str, home_root: Path, idents: set[tuple[int, int]]) -> list[str]:
    """What survived a bed's removal, one line per kind."""
    problems = [
        f"{kind} left: {items}"
        for kind, items in prefix_resources(prefix, home_root).items()
        if items
    ]
    if route_metric(prefix) in guard_routes():
        problems.append("guard route left")
    if idents and (pids := pids_in_netns_idents(idents)):
        problems.append(f"processes left in namespaces: {pids}")
    return problems


def cleanup_stale(
    prefix_pattern: str = DEFAULT_PREFIX_PATTERN, home_root: Path = DEFAULT_HOME_ROOT
) -> list[str]:
    """Remove leftovers of beds whose creating process is dead; returns the prefixes removed.

    A prefix counts as live only while its state file names a running pid with the
    same start time (so pid reuse cannot keep garbage alive).  Resources matching
    ``<prefix_pattern>-`` with no state file at all are leftovers too.
    """
    if os.geteuid() != 0:
        return []
    with registry_lock():
        return cleanup_stale_locked(prefix_pattern, home_root)


def cleanup_stale_locked(prefix_pattern: str, home_root: Path) -> list[str]:
    """:func:`cleanup_stale` for a caller that holds :func:`registry_lock`."""
    rx = re.compile(rf"^(?:{prefix_pattern})$")
    states = {p: s for p, s in read_states().items() if rx.match(p)}
    live = {p for p, s in states.items() if state_owner_alive(s)}
    candidates = set(states)
    candidates |= _names_with_prefix(listdir(NETNS_RUN_DIR), prefix_pattern)
    candidates |= _names_with_prefix((pw.pw_name for pw in pwd.getpwall()), prefix_pattern)
    candidates |= _names_with_prefix(listdir(Path("/sys/class/net")), prefix_pattern)
    candidates |= _names_with_prefix(listdir(ETC_NETNS), prefix_pattern)
    candidates |= _names_with_prefix(top_cgroups(), prefix_pattern)
    candidates |= {n for n in listdir(home_root) if rx.match(n)}
    removed = []
    for prefix in sorted(candidates - live):
        state_home = states.get(prefix, {}).get("home_root")
        destroy_prefix(prefix, Path(state_home) if state_home else home_root)
        removed.append(prefix)
    # probe namespaces of skip_reason_no_netns() whose process died mid-probe
    for name in listdir(NETNS_RUN_DIR):
        m = re.fullmatch(r"vmtprobe(\d+)", name)
        if m and not pid_alive(int(m.group(1))):
            ip_batch([f"netns del {name}"], force=True)
    # guard routes nobody owns any more (their bed's prefix no longer known at all)
    live_metrics = {route_metric(p) for p, s in read_states().items() if state_owner_alive(s)}
    orphans = set(guard_routes()) - live_metrics
    ip_batch((guard_route_del(m) for m in orphans), force=True)
    return removed


def cleanup_on_sigterm() -> bool:
    """Opt-in: turn SIGTERM into KeyboardInterrupt so pytest still runs its teardown.

    ``timeout 900 pytest`` ends with SIGTERM, which skips atexit and fixture teardown;
    the next bed would sweep the leftovers, but this removes them at once.  Only
    installs itself over the default handler, in the main thread.  Returns whether it did.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    return True
