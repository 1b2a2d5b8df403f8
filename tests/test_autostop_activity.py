"""Autostop and vmrun's own work, without a host (quick tier): the markers that the command
wrapper and the raw-command marker leave while a command runs, the watchdog's decision with a
live marker and a stale one, and the power-off command kept off command lines, logs and
readable files. The scripts run here by sh against a home of their own (the test hosts' side
is tests/test_cli_autostop.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import local_argv
from test_autostop import _home

from vmrun.autostop.settings import for_host
from vmrun.autostop.watchdog import _install_argv, conf_env
from vmrun.config import load_settings
from vmrun.hostside import source
from vmrun.remote_paths import ACTIVE_DIR, AUTOSTOP_CONF
from vmrun.reporting import QUIET
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry
from vmrun.ssh.quoting import env_header, plain_command, remote_command

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
SECRET = "s3cr3t-API-KEY"


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _wait(what: str, check: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _markers(home: Path) -> list[str]:
    folder = home / ACTIVE_DIR
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("how", ["wrapped", "raw"])
def test_a_command_leaves_a_live_marker_while_it_runs_and_none_after(
    tmp_path: Path, how: str
) -> None:
    home, env = _home(tmp_path)
    argv = ["sleep", "30"]
    text = remote_command(argv) if how == "wrapped" else plain_command(argv)
    proc = subprocess.Popen(["sh", "-c", text], env=env, stdin=subprocess.PIPE)
    try:
        assert proc.stdin is not None
        proc.stdin.write(env_header(None))
        proc.stdin.flush()
        _wait("the marker", lambda: [m for m in _markers(home) if m.isdigit()])
        (name,) = [m for m in _markers(home) if m.isdigit()]
        marker = home / ACTIVE_DIR / name
        _wait("its start time", lambda: marker.read_text().strip())
        # the shell that waits for the command (`exec /bin/sh` keeps the pid): its start time
        assert int(name) == proc.pid and marker.read_text().strip() == _start_time(proc.pid)
        assert not (home / ACTIVE_DIR / ".ended").exists()
    finally:
        if how == "wrapped":
            proc.stdin.close()  # type: ignore[union-attr]  # the channel closes: killed
        else:
            for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                os.kill(int(child), 9)  # the command ends (the marker's shell goes on)
        proc.wait(timeout=20)
    assert _markers(home) == [".ended"]


def _held(text: str, env: dict[str, str]) -> int:
    """Run a command string as sshd would, its stdin held open (a channel) until it ends."""
    proc = subprocess.Popen(["sh", "-c", text], env=env, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a raw `true` may be gone already
        proc.stdin.write(env_header(None))
        proc.stdin.flush()
    status = proc.wait(timeout=20)
    with contextlib.suppress(BrokenPipeError):  # closing flushes what the write left buffered
        proc.stdin.close()
    return status


def test_what_only_looks_leaves_no_marker_and_work_that_ended_says_so(tmp_path: Path) -> None:
    home, env = _home(tmp_path)
    for text in (remote_command(["true"], activity=False), plain_command(["true"], activity=False)):
        assert _held(text, env) == 0
    assert _markers(home) == []
    assert _held(remote_command(["sh", "-c", "exit 3"]), env) == 3
    assert _markers(home) == [".ended"]


def _now(env: dict[str, str], command: list[str]) -> subprocess.CompletedProcess[str]:
    cfg = for_host(
        load_settings({"autostop_command": command}, cwd=Path(env["HOME"]), environ=env),
        HostEntry(parse_host("x")),
        one_off=True,
    )
    return subprocess.run(
        ["sh", "-c", source("autostop_watch.sh"), "vmrun-autostop", "now", "a test"],
        env={**env, **conf_env(cfg)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_live_vmrun_command_keeps_the_host_up_and_a_stale_marker_is_ignored(
    tmp_path: Path,
) -> None:
    home, env = _home(tmp_path)
    folder = home / ACTIVE_DIR
    folder.mkdir(parents=True)
    alive = subprocess.Popen(["sleep", "60"])
    try:
        (folder / str(alive.pid)).write_text(_start_time(alive.pid) + "\n")
        busy = _now(env, ["poweroff-standin"])
        assert busy.returncode == 3, busy
        assert busy.stdout == f"BUSY vmrun command pid {alive.pid} is still running\n", busy
        # the same pid, another start time: a later process that reuses the number
        (folder / str(alive.pid)).write_text("1\n")
        done = _now(env, ["poweroff-standin"])
    finally:
        alive.kill()
        alive.wait()
    assert done.returncode == 0 and done.stdout.endswith("RAN 0\n"), done
    assert (home / "calls").read_text() == "called \n"
    assert not (folder / str(alive.pid)).exists()  # the stale marker is gone


def test_without_its_settings_the_one_off_never_powers_off(tmp_path: Path) -> None:
    _home_dir, env = _home(tmp_path)
    done = subprocess.run(
        ["sh", "-c", source("autostop_watch.sh"), "vmrun-autostop", "now", "a test"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3 and done.stdout.startswith("UNSURE"), done


def test_the_power_off_command_is_never_on_a_command_line_in_the_log_or_readable(
    tmp_path: Path,
) -> None:
    """Installing: the settings go by the environment header (stdin), the conf file is 0600
    (also one that was there before, with the same text), the watchdog's command line and its
    log never hold the command, not even when it runs, and an older watchdog's logs become
    the user's alone."""
    home, env = _home(tmp_path)
    crontab = home / "bin" / "crontab"
    crontab.write_text(
        '#!/bin/sh\n# STAND-IN crontab: a file in the home\nf="$HOME/crontab"\n'
        'case $1 in -l) cat "$f" 2>/dev/null ;; -) cat > "$f" ;; esac\n'
    )
    crontab.chmod(0o755)
    command = ["poweroff-standin", "--token", SECRET]
    settings = load_settings(
        {
            "autostop_command": command,
            "autostop": "2s",
            "autostop_interval": "1s",
            "autostop_sessions": "ignore",
        },
        cwd=home,
        environ=env,
    )
    cfg = for_host(settings, HostEntry(parse_host("x")))
    assert cfg is not None
    argv = _install_argv("install")
    assert not any(SECRET in word for word in argv)
    wrapped = remote_command(argv, activity=False)
    assert SECRET not in wrapped
    assert SECRET not in env_header(conf_env(cfg)).decode()  # base64, on stdin

    def install() -> str:  # as the wrapper runs it, with the header's variables exported
        done = subprocess.run(
            local_argv(argv, home),
            env={**env, **conf_env(cfg)},
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done
        return done.stdout.decode()

    log = home / ".vmrun" / "autostop.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for old in (log, log.with_name("autostop.log.1")):  # an older watchdog's, readable by all
        old.write_text("an older watchdog's line\n")
        old.chmod(0o644)
    said = install()
    pid = int(next(line for line in said.splitlines() if line.startswith("PID ")).split()[1])
    try:
        conf = home / AUTOSTOP_CONF
        assert conf.stat().st_mode & 0o777 == 0o600 and SECRET in conf.read_text()
        conf.chmod(0o644)  # written by an older vmrun
        again = install()
        assert "CONF same" in again and conf.stat().st_mode & 0o777 == 0o600, again
        assert SECRET.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        _wait("the power-off", lambda: (home / "calls").exists(), 30)
        assert (home / "calls").read_text().startswith(f"called --token {SECRET}")
        _wait("its exit in the log", lambda: "power-off command ran" in log.read_text(), 30)
        assert SECRET not in log.read_text() and "--token" not in log.read_text()
        assert log.stat().st_mode & 0o077 == 0
        assert log.with_name("autostop.log.1").stat().st_mode & 0o077 == 0
    finally:
        os.killpg(pid, 9)


def test_reading_or_following_a_log_is_looking_not_work() -> None:
    """`vmrun logs` (once, -f, the line times) leaves no marker: a dashboard polling a
    finished run's log every few minutes must not keep its host up forever."""
    from vmrun.backends.hosts import records
    from vmrun.ssh.result import CommandResult

    asked: list[bool] = []

    class Conn:
        label = "h1"

        def run(self, argv: list[str], **kw: object) -> CommandResult:
            asked.append(bool(kw.get("activity", True)))
            return CommandResult("h1", tuple(argv), 0, "", "", 0.0)

    conn = Conn()
    records.read_log(conn, "r1", QUIET)  # type: ignore[arg-type]
    records.follow(conn, "r1", QUIET)  # type: ignore[arg-type]
    records.log_times(conn, "r1")  # type: ignore[arg-type]
    assert asked == [False, False, False]
