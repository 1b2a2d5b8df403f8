"""The autostop watchdog on one host: checked, installed, read, removed, each in one round
trip; and the one-off power-off of `vmrun train --down-after-run`.

The scripts are vmrun/hostside/autostop_*.sh. Installing sends the watchdog's own text
(autostop_watch.sh, from the wheel) and its settings; the host writes them only where they
differ and starts it only where it is not running, so installing twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmrun import hostside
from vmrun.autostop.settings import Autostop
from vmrun.autostop.status import AutostopStatus, from_status_output
from vmrun.errors import RemoteError
from vmrun.remote_paths import AUTOSTOP_CONF, AUTOSTOP_LOG, AUTOSTOP_SCRIPT, AUTOSTOP_STATE
from vmrun.ssh.connection import Connection

CONF_VAR = "VMRUN_AUTOSTOP_CONF"  # the settings' text (autostop_install.sh, autostop_watch.sh)
WORD_VAR = "VMRUN_AUTOSTOP_WORD"  # the power-off command's program, which the host must have
NOTIFY_VAR = "VMRUN_AUTOSTOP_NOTIFY"  # the warning's notify.json (its URLs are secrets)
_REFUSED = 3  # the scripts' exit status for "FAIL <why>", "BUSY ...", "BLOCKED ..."


@dataclass(frozen=True)
class Installed:
    host: str
    script: str  # same | new
    conf: str  # same | new
    boot: str  # "cron present", "systemd added"...
    pid: int
    how: str  # running | started | restarted

    @property
    def changed(self) -> bool:
        return self.script == "new" or self.conf == "new" or self.how != "running"


@dataclass(frozen=True)
class Cancelled:
    host: str
    removed: tuple[str, ...]  # what it found and removed: unit, cron line, processes, files
    killed: tuple[int, ...]


def _install_argv(mode: str) -> list[str]:
    return [
        *hostside.command("autostop_install.sh"),
        mode,
        AUTOSTOP_CONF,
        AUTOSTOP_STATE,
        AUTOSTOP_SCRIPT,
        hostside.path("autostop_watch.sh"),
    ]


def conf_env(cfg: Autostop) -> dict[str, str]:
    """The settings go by stdin (the wrapper's environment header), never on the host's
    command line: the power-off command often carries a cloud API key."""
    return {CONF_VAR: cfg.conf_text(), WORD_VAR: cfg.command_word, NOTIFY_VAR: cfg.notify}


def _lines(
    conn: Connection, argv: list[str], what: str, after: str = "", env: dict[str, str] | None = None
) -> dict[str, str]:
    """Run one of the scripts; its KEY VALUE lines, or the host's one FAIL line raised.
    Managing and reading the watchdog is no activity that keeps the host up."""
    result = conn.run(argv, env=env, activity=False)
    values: dict[str, str] = {}
    for line in result.stdout_tail.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value.strip()
    if "FAIL" in values:
        raise RemoteError(
            f"autostop: {values['FAIL']}{after}", host=conn.label, code="autostop-failed"
        )
    if not result.ok:
        raise RemoteError(
            f"{what} failed: {result.output_tail(3)}", host=conn.label, code="autostop-failed"
        )
    return values


def check(conn: Connection, cfg: Autostop, *, boot: bool = True) -> str:
    """Can this host power itself off (and, with `boot`, start the watchdog at boot)?
    Changes nothing; raises with the host's one line when it cannot."""
    argv = _install_argv("check" if boot else "power")
    said = _lines(conn, argv, "the autostop check", "; nothing was installed", conf_env(cfg))
    return said.get("OK", "")


def install(conn: Connection, cfg: Autostop) -> Installed:
    values = _lines(conn, _install_argv("install"), "installing autostop", env=conf_env(cfg))
    pid, _, how = values.get("PID", "").partition(" ")
    if not pid.isdigit():
        raise RemoteError(
            "the autostop watchdog did not report its pid", host=conn.label, code="autostop-failed"
        )
    return Installed(
        conn.label,
        values.get("SCRIPT", "?"),
        values.get("CONF", "?"),
        values.get("BOOT", "?"),
        int(pid),
        how,
    )


def read_status(conn: Connection) -> AutostopStatus:
    argv = [*hostside.command("autostop_status.sh"), AUTOSTOP_CONF, AUTOSTOP_STATE, AUTOSTOP_SCRIPT]
    result = conn.run(argv, activity=False)
    if not result.ok:
        raise RemoteError(
            f"reading autostop failed: {result.output_tail(3)}",
            host=conn.label,
            code="autostop-failed",
        )
    return from_status_output(conn.label, result.stdout_tail)


def cancel(conn: Connection) -> Cancelled:
    """Remove the watchdog (unit or cron line, process, files) and check none is left."""
    lib, _, name = AUTOSTOP_SCRIPT.rpartition("/")
    argv = [
        *hostside.command("autostop_cancel.sh"),
        AUTOSTOP_CONF,
        AUTOSTOP_STATE,
        AUTOSTOP_LOG,
        lib,
        name,
    ]
    result = conn.run(argv, activity=False)
    removed: list[str] = []
    killed: tuple[int, ...] = ()
    left = ""
    for line in result.stdout_tail.splitlines():
        key, _, value = line.partition(" ")
        if key in ("UNIT", "CRON", "FILES"):
            names = {"UNIT": "systemd unit", "CRON": "@reboot cron line", "FILES": "its files"}
            removed.append(names[key])
        elif key == "KILLED":
            killed = tuple(int(p) for p in value.split() if p.isdigit())
        elif key == "LEFT":
            left = value
    if left or not result.ok:
        why = left or result.output_tail(3)
        raise RemoteError(
            f"autostop could not be removed completely: {why} is left",
            host=conn.label,
            code="autostop-failed",
        )
    return Cancelled(conn.label, tuple(removed), killed)


def power_off_now(conn: Connection, cfg: Autostop, why: str) -> str:
    """Power the host off now, unless a vmrun run is alive on it or a process that is no
    vmrun run's holds a GPU (raised as RemoteError). Returns the command's last output."""
    argv = [*hostside.command("autostop_watch.sh"), "now", why]
    result = conn.run(argv, env=conf_env(cfg), activity=False)
    lines = result.stdout_tail.strip().splitlines()
    last = lines[-1] if lines else ""
    key, _, value = last.partition(" ")
    if result.exit_status == _REFUSED and key in ("BUSY", "BLOCKED", "UNSURE"):
        raise RemoteError(f"not powered off: {value}", host=conn.label, code="power-off-failed")
    if key != "RAN":
        raise RemoteError(
            f"powering off failed: {result.output_tail(3)}",
            host=conn.label,
            code="power-off-failed",
        )
    if value != "0":
        said = "; ".join(lines[-4:-1]) or "no output"
        raise RemoteError(
            f"the power-off command failed (exit {value}): {said}",
            host=conn.label,
            code="power-off-failed",
        )
    return "; ".join(lines[:-1])
