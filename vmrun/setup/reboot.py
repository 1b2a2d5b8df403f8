"""Rebooting a host mid-setup: launch the reboot detached (hostside/setup_reboot_launch.sh),
see it fail at once (its status file), then wait (bounded) for the host to answer from a NEW
boot on the same connection object. The host's boot_id before and after decides: a status
query that times out on a loaded host, or a dropped connection, is no proof of a reboot."""

from __future__ import annotations

import time
from collections.abc import Mapping

from vmrun import hostside, remote_paths
from vmrun.errors import (
    AuthError,
    CommandFailed,
    HostKeyError,
    RemoteError,
    UnreachableError,
    VmrunError,
)
from vmrun.setup.hostlog import HostLog
from vmrun.ssh.connection import Connection

STATUS_TAIL_LINES = 8  # the reboot command's last output lines, shown if it fails
STATUS_TIMEOUT_S = 5.0  # one status query; longer: the host is going down, or loaded
POLL_S = 0.5  # between status queries while the host still runs its old boot
_STATUS_ARGS = (remote_paths.SETUP_REBOOT_RC, remote_paths.SETUP_REBOOT_OUT, str(STATUS_TAIL_LINES))


def reboot(conn: Connection, env: Mapping[str, str], log: HostLog, timeout: float) -> None:
    """Reboot, then wait (within `timeout`) until the host answers with another boot_id."""
    log.event("rebooting")
    command = env.get("VMRUN_REBOOT_COMMAND") or "$VMRUN_SUDO reboot"
    log.write(f"$ reboot: {command}")
    rc, out = remote_paths.SETUP_REBOOT_RC, remote_paths.SETUP_REBOOT_OUT
    launched = conn.run(
        hostside.command("setup_reboot_launch.sh", rc, out, command), env=env, check=True
    )
    before = launched.stdout_tail.split("\n", 1)[0].strip()
    _wait_for_new_boot(conn, log, command, before, time.monotonic() + timeout, timeout)


def _wait_for_new_boot(
    conn: Connection, log: HostLog, command: str, before: str, deadline: float, timeout: float
) -> None:
    """Ask the host its boot_id until it is another one than `before` (with no boot_id to
    compare, as on a host without /proc: until it answers again after a silence)."""
    started = time.monotonic()
    went_quiet = False
    delay = 1.0
    while True:
        try:
            status = conn.run(
                [*hostside.command("setup_reboot_status.sh"), *_STATUS_ARGS],
                timeout=STATUS_TIMEOUT_S,
            )
        except (HostKeyError, AuthError):
            raise
        except VmrunError:  # down, coming back, or too loaded to answer: not a new boot yet
            went_quiet = True
            conn.close()
            if time.monotonic() + delay > deadline:
                raise UnreachableError(
                    f"the host did not come back within {timeout:g} s after rebooting",
                    host=conn.label,
                    hint="check its console; re-run setup once it is up",
                ) from None
            log.event(f"waiting for the host to come back ({time.monotonic() - started:.0f} s)")
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
            continue
        boot, _, rest = status.stdout_tail.partition("\n")
        if (boot.strip() != before) if before else went_quiet:
            log.event(f"back after {time.monotonic() - started:.0f} s")
            return
        _raise_if_reboot_failed(conn, log, rest, command)
        if time.monotonic() > deadline:
            raise RemoteError(
                f"the host did not reboot within {timeout:g} s after the reboot command: it"
                f" still answers from the same boot (boot_id {before})",
                host=conn.label,
                hint="check that the reboot command reboots this host (--param"
                " reboot_command=...), or raise --reboot-timeout",
                code="reboot-failed",
            )
        time.sleep(POLL_S)


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
