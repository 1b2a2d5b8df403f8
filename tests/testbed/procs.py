"""Processes: finding them in /proc, killing them by pid until gone, running and waiting.

Everything here works by pid, never by name (no pkill/killall), and treats
zombies as dead: nobody may ever reap them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from .errors import TestbedError

T = TypeVar("T")


# --------------------------------------------------------------------------- waiting


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy; never sleep-and-hope."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TestbedError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --------------------------------------------------------------------------- /proc


def _proc_stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the comm field (index 0 = state, 1 = ppid)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """True for a live process; zombies count as dead (nobody may ever reap them)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X", "x")


def pid_starttime(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def _all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def ns_ident(path: Path | str) -> tuple[int, int] | None:
    """(device, inode) of a namespace file: equal for the same namespace."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def pids_in_netns(path: Path) -> list[int]:
    """Live pids in the network namespace bound at ``path`` (like ``ip netns pids``)."""
    ident = ns_ident(path)
    return [] if ident is None else pids_in_netns_idents({ident})


def pids_in_netns_idents(idents: set[tuple[int, int]]) -> list[int]:
    """Live pids whose network namespace is one of ``idents`` (see :func:`ns_ident`)."""
    if not idents:
        return []
    found = []
    for pid in _all_pids():
        if ns_ident(f"/proc/{pid}/ns/net") in idents and pid_alive(pid):
            found.append(pid)
    return found


def uid_pids(uids: Iterable[int]) -> list[int]:
    """Live pids whose real or effective uid is one of ``uids``."""
    wanted = set(uids)
    if not wanted:
        return []
    found = []
    for pid in _all_pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:"):
                real, effective = (int(x) for x in line.split()[1:3])
                if (real in wanted or effective in wanted) and pid_alive(pid):
                    found.append(pid)
                break
    return found


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        fields = _proc_stat(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    return children


def descendants(*roots: int) -> set[int]:
    """``roots`` and all their live descendants (sessions of an sshd are its descendants)."""
    children = _children_map()
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        if pid_alive(pid):
            found.add(pid)
        todo.extend(children.get(pid, []))
    return found


# --------------------------------------------------------------------------- killing


def kill_until_gone(
    list_pids: Callable[[], list[int]],
    *,
    timeout: float = 10.0,
    reap: Callable[[], object] | None = None,
) -> None:
    """SIGKILL by pid, repeatedly, until the listing is empty (processes may fork meanwhile)."""
    protected = {0, 1, os.getpid(), os.getppid()}
    deadline = time.monotonic() + timeout
    while True:
        if reap:
            reap()
        pids = [p for p in list_pids() if p not in protected]
        if not pids:
            return
        if time.monotonic() >= deadline:
            raise TestbedError(f"processes survived SIGKILL for {timeout}s: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def kill_tree(root: int, reap: Callable[[], object]) -> None:
    """SIGSTOP the whole tree first (stopped processes cannot fork or get reparented
    away from us), then SIGKILL every pid seen; killing the root first would orphan
    its children to init, out of reach of a descendants walk."""
    seen: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = descendants(root, *seen) - seen
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        seen |= new
    kill_until_gone(lambda: sorted(p for p in seen if pid_alive(p)), reap=reap)


# --------------------------------------------------------------------------- running


def run_process(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    input: bytes | str | None,
    timeout: float | None,
    check: bool,
    text: bool,
) -> subprocess.CompletedProcess[Any]:
    """Like subprocess.run, but a timeout kills the whole process group, not just the leader."""
    if isinstance(input, str) and not text:
        input = input.encode()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        text=text,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            # something that left our process group (setsid) still holds the pipes
            out, err = None, None
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            proc.wait()
        raise subprocess.TimeoutExpired(argv, timeout or 0, out, err) from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result
