"""Rebooting a host mid-setup: launch the reboot detached (hostside/setup_reboot_launch.sh),
see it fail at once (its status file) or the host go down, then wait (bounded) for SSH to come
back on the same connection object."""

from __future__ import annotations

import time
from collections.abc import Mapping

from vmrun import remote_paths
from vmrun.errors import (
    AuthError,
    CommandFailed,
    ConnectionLostError,
    HostKeyError,
    RemoteError,
    UnreachableError,
    VmrunError,
)
from vmrun.hostside import source
from vmrun.setup.hostlog import HostLog
from vmrun.ssh.connection import Connection

STATUS_TAIL_LINES = 8  # the reboot command's last output lines, shown if it fails
_STATUS_ARGS = (remote_paths.SETUP_REBOOT_RC, remote_paths.SETUP_REBOOT_OUT, str(STATUS_TAIL_LINES))


def reboot(conn: Connection, env: Mapping[str, str], log: HostLog, timeout: float) -> None:
    """Reboot, wait for the connection to drop, then for SSH to come back (bounded)."""
    log.event("rebooting")
    command = env.get("VMRUN_REBOOT_COMMAND") or "$VMRUN_SUDO reboot"
    log.write(f"$ reboot: {command}")
    launch = source("setup_reboot_launch.sh")
    rc, out = remote_paths.SETUP_REBOOT_RC, remote_paths.SETUP_REBOOT_OUT
    conn.run(["sh", "-c", launch, "reboot", rc, out, command], env=env, check=True)
    deadline = time.monotonic() + timeout
    _wait_until_down(conn, log, command, deadline, timeout)
    conn.close()
    waited_from = time.monotonic()
    delay = 1.0
    while True:
        try:
            conn.open()
            break
        except (HostKeyError, AuthError):
            raise
        except VmrunError:
            if time.monotonic() + delay > deadline:
                raise UnreachableError(
                    f"the host did not come back within {timeout:g} s after rebooting",
                    host=conn.label,
                    hint="check its console; re-run setup once it is up",
                ) from None
            log.event(f"waiting for the host to come back ({time.monotonic() - waited_from:.0f} s)")
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    log.event(f"back after {time.monotonic() - waited_from:.0f} s")


def _wait_until_down(
    conn: Connection, log: HostLog, command: str, deadline: float, timeout: float
) -> None:
    """Poll the reboot command's status until the connection drops (the host going down)."""
    while time.monotonic() < deadline:
        try:
            status = conn.run(
                ["sh", "-c", source("setup_reboot_status.sh"), "reboot-status", *_STATUS_ARGS],
                timeout=5,
            )
        except (ConnectionLostError, CommandFailed, UnreachableError):
            return
        _raise_if_reboot_failed(conn, log, status.stdout_tail, command)
        time.sleep(0.5)
    raise RemoteError(
        f"the host did not go down within {timeout:g} s after the reboot command",
        host=conn.label,
    )


def _raise_if_reboot_failed(conn: Connection, log: HostLog, status: str, command: str) -> None:
    """The reboot command ended with an error while the host is still up: say so now,
    with its output. A status of 128 or more (killed by a signal) is what the shutdown
    itself may do to it, so that one keeps waiting for the host to go down."""
    first, _, output = status.partition("\n")
    try:
        code = int(first.strip())
    except ValueError:
        return  # still running (no status yet)
    if not 0 < code < 128:
        return
    output = output.strip()
    log.write(f"the reboot command exited {code}:\n{output or '(no output)'}")
    last = output.splitlines()[-1] if output else "no output"
    raise CommandFailed(
        f"the reboot command failed (exited {code}) and the host is still up: {last}",
        host=conn.label,
        hint="let this user reboot with passwordless sudo, or set --param"
        f" reboot_command=... (was: {command})",
        exit_status=1,
        output_tail=output,
    )
