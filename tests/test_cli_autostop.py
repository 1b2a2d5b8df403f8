"""`vmrun autostop` end to end: the real CLI installs the real watchdog (POSIX sh) on real sshd
test hosts, with short periods (seconds) and a 1 s check interval.

STAND-INs, where the real thing cannot be had here: the power-off (a `sudo` that records
`shutdown -h now` with the time instead of running it, or a configured command that does the
same), `wall` in most tests (records the warning and when; one test reads the real wall's
broadcast in a real session's terminal, where only test logins are in utmp) and nvidia-smi
(tests/standins/nvidia-smi: no GPU here). Everything else is real: the run records and their
processes, `who` and the utmp entries sshd writes for a real `ssh -tt` session, `crontab` for
the @reboot line, and a reboot (every process of the host killed), after which the @reboot
lines run as cron would run them at boot (`boot_like_cron`, the stand-in for cron's start).
The test hosts share this machine's utmp, so tests other than the session ones set sessions
= "ignore": another suite's terminal must not keep these hosts up.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    TORCH_SPEC,
    Client,
    clean_host,
    error_in,
    errors_in,
    install_hostlib,
    install_standin,
    local_argv,
    run_id_of,
    template_out,
    wait_for,
)
from testbed import NetnsBed, TestHost

from vmrun.backends.hosts import records
from vmrun.hostside import lib_dir
from vmrun.results.record import RunRecord
from vmrun.ssh.connection import Connection

STANDIN_SMI = ROOT / "tests" / "standins" / "nvidia-smi"
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
SCRIPT = ".vmrun/lib/autostop_watch.sh"

SUDO = r"""# passwordless sudo that runs nothing as root: `true` (vmrun's check) succeeds, and
# `shutdown -h now` is the STAND-IN power-off: it records that it was called, and when
while [ "${1#-}" != "$1" ]; do shift; done
case "$*" in
  true) exit 0 ;;
  "shutdown -h now")
    echo "called at $(date +%s): shutdown -h now" >> "$HOME/poweroff.calls"; exit 0 ;;
esac
echo "STAND-IN sudo: refusing $*" >&2
exit 1
"""
# behaves like real `sudo -n` for a user whose sudo asks for a password
PASSWORD_SUDO = 'echo "sudo: a password is required" >&2\nexit 1\n'
# a configured power-off command (as a cloud CLI's stop would be): records it was called
POWEROFF = 'echo "called at $(date +%s): poweroff-standin $*" >> "$HOME/poweroff.calls"\n'
WALL = 'echo "$(date +%s) $*" >> "$HOME/wall.calls"\n'


def _host(bed: NetnsBed, name: str) -> TestHost:
    try:
        return bed[name]
    except KeyError:
        return bed.add_host(name)


def watchdogs(host: TestHost) -> list[int]:
    """The host user's processes running the watchdog script; not the subshells a watchdog
    forks for a moment (a `$(...)` carries its parent's command line)."""
    found = {}
    for pid in host.user_pids():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if any(a.endswith(SCRIPT.encode()) for a in args[1:3]):
            found[pid] = int(stat.rsplit(")", 1)[1].split()[1])  # its parent's pid
    return sorted(pid for pid, parent in found.items() if parent not in found)


def commands(host: TestHost) -> list[str]:
    """The host user's processes, for messages."""
    found = []
    for pid in host.user_pids():
        with contextlib.suppress(OSError):
            found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()!r}")
    return found


def crontab(host: TestHost) -> str:
    done = host.run(["crontab", "-l", "-u", host.user], check=False, text=True)
    return done.stdout if done.returncode == 0 else ""


def _clean(host: TestHost) -> None:
    for pid in watchdogs(host):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not watchdogs(host), 10, f"no watchdog left on {host.name}")
    host.run(["crontab", "-r", "-u", host.user], check=False)
    shutil.rmtree(host.home / ".vmrun", ignore_errors=True)
    for name in ("poweroff.calls", "wall.calls"):
        (host.home / name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def hosts(bed: NetnsBed) -> dict[str, TestHost]:
    """Hosts of their own (no other test's files)."""
    return {name: _host(bed, name) for name in ("as1", "as2")}


@pytest.fixture(scope="module")
def utmp() -> Iterator[Path]:
    """/run/utmp, where sshd records logins with a terminal and `who` reads them. A booted
    Linux has it (systemd-update-utmp, or the init scripts, create it); a container may not:
    then it is made for these tests (root:utmp 0664, as Debian makes it) and removed after."""
    path = Path("/run/utmp")
    made = not path.exists()
    if made:
        path.touch(mode=0o664)
        with contextlib.suppress(KeyError):
            import grp

            os.chown(path, 0, grp.getgrnam("utmp").gr_gid)
    yield path
    if made:
        path.unlink(missing_ok=True)


@pytest.fixture
def as1(hosts: dict[str, TestHost]) -> Iterator[TestHost]:
    """Cleaned before and after: no watchdog, no crontab, no ~/.vmrun."""
    _clean(hosts["as1"])
    yield hosts["as1"]
    _clean(hosts["as1"])


@pytest.fixture
def as2(hosts: dict[str, TestHost]) -> Iterator[TestHost]:
    _clean(hosts["as2"])
    yield hosts["as2"]
    _clean(hosts["as2"])


@pytest.fixture
def ac(bed: NetnsBed, bed_client: Client, hosts: dict[str, TestHost]) -> Client:
    """A client that reaches as1/as2, checking every second, sessions not counted."""
    (bed_client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (bed_client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    bed_client.extra_env.update(VMRUN_AUTOSTOP_INTERVAL="1s", VMRUN_AUTOSTOP_SESSIONS="ignore")
    return bed_client


def calls(host: TestHost, name: str = "poweroff.calls") -> list[tuple[int, str]]:
    path = host.home / name
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        match = re.match(r"(?:called at )?(\d+):? (.*)", line)
        if match:
            found.append((int(match.group(1)), match.group(2)))
    return found


def state(host: TestHost) -> dict[str, str]:
    path = host.home / ".vmrun/autostop.state"
    text = path.read_text() if path.exists() else ""
    return dict(p.split("=", 1) for p in text.rstrip("\n").split("\t") if "=" in p)


def checked_after(host: TestHost, moment: float) -> bool:
    """The watchdog has made a check after `moment` (its two check marks hold the times)."""
    marks = [host.home / f".vmrun/autostop.state.m{i}" for i in (0, 1)]
    times = [int(m.read_text().strip() or 0) for m in marks if m.exists()]
    return max(times, default=0) > moment


def outlast_the_period(host: TestHost, seconds: float = 5) -> None:
    """Wait until the watchdog has checked again `seconds` (more than the period) from now:
    a host that is not idle must still be up then."""
    moment = time.time() + seconds
    wait_for(lambda: checked_after(host, moment), seconds + 20, "a check after the period")


def log(host: TestHost) -> str:
    path = host.home / ".vmrun/autostop.log"
    return path.read_text() if path.exists() else ""


def installed_pid(out: str, host: str) -> int:
    match = re.search(rf"{host}: autostop .*watchdog pid (\d+)", out)
    assert match, out
    return int(match.group(1))


def gpu_standin(host: TestHost, fixture: str, apps: str | None = None) -> Path:
    """The nvidia-smi STAND-IN in ~/.vmrun/bin replaying `fixture`; returns its replay dir."""
    bin_dir = host.home / ".vmrun" / "bin"
    host.run(["mkdir", "-p", str(bin_dir)], as_user=True)
    replay = bin_dir / "nvidia-smi-replay"
    shutil.rmtree(replay, ignore_errors=True)
    replay.mkdir()
    shutil.copy(STANDIN_SMI, bin_dir / "nvidia-smi")
    for item in (FIXTURES / fixture).iterdir():
        shutil.copy(item, replay / item.name)
    if apps is not None:
        (replay / "query-compute-apps.txt").write_text(apps)
    (replay / "starts.log").touch()
    for path in (bin_dir / "nvidia-smi", replay, *replay.iterdir()):
        os.chown(path, host.uid, host.gid)
    return replay


def apps_replay(*pids: int) -> str:
    """A compute-apps recording (t4x2_training's layout) with these pids on GPU 0."""
    head = (FIXTURES / "t4x2_training" / "query-compute-apps.txt").read_text().splitlines()
    keep = [line for line in head if line.startswith("#")]
    rows = [
        f"2023/08/29 11:04:31.206, GPU-5d0c1a47-2f1e-7a3b-9c64-0e8f2d1b7a11, {pid}, 1324, python"
        for pid in pids
    ]
    return "\n".join([*keep, *rows]) + "\n"


def test_an_idle_host_powers_off_after_the_period_warning_first(ac: Client, as1: TestHost) -> None:
    """The default command (sudo -n shutdown -h now) after 4 s idle, a wall warning 2 s
    before; installing twice changes nothing; --status says when; the log says why."""
    install_standin(as1, "sudo", SUDO)
    install_standin(as1, "wall", WALL)
    start = time.time()
    done = ac.vmrun("autostop", "4s", "-H", "as1", env={"VMRUN_AUTOSTOP_WARN": "2s"})
    assert done.returncode == 0, done.stderr
    assert "as1: autostop powers off after 4s idle (checked every 1s; sudo -n shutdown -h now)" in (
        done.stdout
    )
    pid = installed_pid(done.stdout, "as1")
    assert "started; at boot: crontab @reboot" in done.stdout, done.stdout
    assert watchdogs(as1) == [pid]
    line = r"^@reboot /bin/sh .*autostop_watch\.sh.* # vmrun autostop$"
    assert re.search(line, crontab(as1), re.M), crontab(as1)

    again = ac.vmrun("autostop", "4s", "-H", "as1", env={"VMRUN_AUTOSTOP_WARN": "2s"})
    assert again.returncode == 0, again.stderr
    assert f"already so, nothing changed (watchdog pid {pid};" in again.stdout, again.stdout
    assert watchdogs(as1) == [pid]
    assert crontab(as1).count("# vmrun autostop") == 1

    status = ac.vmrun("autostop", "--status", "-H", "as1")
    assert status.returncode == 0, status.stderr
    row = status.stdout.splitlines()[1].split()
    assert row[:2] == ["as1", "4s"] and re.fullmatch(r"\d+s", row[2]), status.stdout
    assert re.fullmatch(r"\d\d:\d\d", row[-1]), status.stdout

    off = wait_for(lambda: calls(as1), 30, "the STAND-IN power-off")
    called_at, what = off[0]  # type: ignore[index]
    assert what == "shutdown -h now"
    # not before the period (the watchdog's clock is whole seconds), not much after it
    assert start + 3 <= called_at <= start + 9, (start, called_at)
    warned = calls(as1, "wall.calls")
    assert warned and called_at - 4 <= warned[0][0] <= called_at, (warned, called_at)
    assert "powers off at" in warned[0][1] and "vmrun autostop --cancel" in warned[0][1]
    # the watchdog logs the command's exit once it has returned: a moment after the call
    text = str(
        wait_for(
            lambda: "the power-off command ran" in log(as1) and log(as1),
            30,
            "the power-off's exit in the log",
        )
    )
    for said in (
        "started (pid",
        "idle: no vmrun run, no GPU",
        "warned logged-in users",
        "powering off: idle since",
        "the power-off command ran (exit 0)",
    ):
        assert said in text, text
    assert watchdogs(as1) == [pid]  # still there: a real shutdown takes it down


def test_a_live_run_keeps_the_host_up_and_a_run_that_starts_resets_the_clock(
    ac: Client, as1: TestHost
) -> None:
    install_standin(as1, "sudo", SUDO)
    rid = "autostop-20250101-000000-abcd"
    with Connection("as1", ac.settings()) as conn:
        records.start(conn, rid, ".", ["sleep", "600"], RunRecord())
    done = ac.vmrun("autostop", "3s", "-H", "as1")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: state(as1).get("awake") == f"run {rid}", 10, "the run to keep it awake")
    status = ac.vmrun("autostop", "--status", "-H", "as1")
    assert f"run {rid}" in status.stdout and status.stdout.rstrip().endswith("-"), status.stdout
    outlast_the_period(as1)
    assert calls(as1) == []
    stopped = ac.vmrun("stop", rid, "-H", "as1", "--grace", "1")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: state(as1).get("since"), 10, "the host to be idle")
    # a run that starts and ends between two checks still resets the clock
    time.sleep(1.5)
    with Connection("as1", ac.settings()) as conn:
        short = time.time()
        records.start(conn, rid + "x", ".", ["true"], RunRecord())
    off = wait_for(lambda: calls(as1), 20, "the power-off after the runs")
    assert off[0][0] >= short + 2, (off, short)  # type: ignore[index]
    assert f"awake: run {rid}" in log(as1)


def test_a_long_vmrun_exec_keeps_the_host_up_and_the_host_goes_down_after_it(
    ac: Client, as1: TestHost
) -> None:
    """vmrun's own work counts as activity: an `exec` that outlasts the period (a marker in
    ~/.vmrun/active while it runs), then the period from its end."""
    install_standin(as1, "sudo", SUDO)
    done = ac.vmrun("autostop", "3s", "-H", "as1")
    assert done.returncode == 0, done.stderr
    go = as1.home / "exec.go"
    go.unlink(missing_ok=True)
    script = 'while ! [ -e "$HOME/exec.go" ]; do sleep 0.2; done; echo finished'
    proc = ac.popen("exec", "-H", "as1", "--", "sh", "-c", script)
    try:
        wait_for(lambda: state(as1).get("awake") == "a vmrun command", 20, "the exec to count")
        outlast_the_period(as1)
        assert calls(as1) == [], log(as1)
        go.touch()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = time.time()
    assert proc.returncode == 0 and "finished" in out, err
    off = wait_for(lambda: calls(as1), 20, "the power-off after the exec")
    assert off[0][0] >= ended + 1, (off, ended)  # type: ignore[index]
    assert "awake: a vmrun command" in log(as1)
    assert not [p for p in (as1.home / ".vmrun/active").iterdir() if p.name.isdigit()]


def test_a_busy_gpu_keeps_it_up_with_one_nvidia_smi_per_check(ac: Client, as1: TestHost) -> None:
    install_standin(as1, "sudo", SUDO)
    replay = gpu_standin(as1, "t4x2_training", apps="")
    done = ac.vmrun("autostop", "3s", "-H", "as1")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: state(as1).get("awake") == "GPU 0 93%, GPU 1 93%", 10, "busy GPUs")
    outlast_the_period(as1)
    assert calls(as1) == []
    status = ac.vmrun("autostop", "--status", "-H", "as1")
    assert "GPU 0 93%, GPU 1 93%" in status.stdout, status.stdout
    started = replay.joinpath("starts.log").read_text().splitlines()
    assert all("--query-gpu=index,utilization.gpu" in line for line in started), started
    ticks = 1 + int(time.time() - (as1.home / ".vmrun/autostop.state.pid").stat().st_mtime)
    assert 4 <= len(started) <= ticks + 1, (len(started), ticks)
    for item in (FIXTURES / "t4_idle").iterdir():  # the GPUs go idle
        shutil.copy(item, replay / item.name)
    wait_for(lambda: calls(as1), 20, "the power-off once the GPUs are idle")
    started = replay.joinpath("starts.log").read_text().splitlines()
    assert any("--query-compute-apps=pid" in line for line in started), started


def test_a_gpu_process_that_is_no_vmrun_run_blocks_the_power_off(ac: Client, as1: TestHost) -> None:
    install_standin(as1, "sudo", SUDO)
    other = as1.popen(["sleep", "600"], as_user=True)  # a notebook holding the GPU, say
    try:
        gpu_standin(as1, "t4_idle", apps=apps_replay(other.pid))
        done = ac.vmrun("autostop", "2s", "-H", "as1")
        assert done.returncode == 0, done.stderr
        blocked = f"non-vmrun GPU process pid {other.pid}"
        wait_for(lambda: state(as1).get("block") == blocked, 10, "the block")
        outlast_the_period(as1)
        assert calls(as1) == []
        status = ac.vmrun("autostop", "--status", "-H", "as1")
        assert f"{blocked}: never powers off while it runs" in status.stdout, status.stdout
        said = f"never powering off while a process that is no vmrun run's holds a GPU: {blocked}"
        assert said in log(as1), log(as1)
    finally:
        other.kill()
        other.wait()
    wait_for(lambda: calls(as1), 20, "the power-off once that process has gone")


def test_a_vmrun_runs_process_on_a_gpu_does_not_block(ac: Client, as1: TestHost) -> None:
    install_standin(as1, "sudo", SUDO)
    env = {"VMRUN_RUN_ID": "gone-20250101-000000-abcd"}  # left over from a run: no record
    ours = as1.popen(["sleep", "600"], as_user=True, env=env)
    try:
        gpu_standin(as1, "t4_idle", apps=apps_replay(ours.pid))
        done = ac.vmrun("autostop", "2s", "-H", "as1")
        assert done.returncode == 0, done.stderr
        wait_for(lambda: calls(as1), 20, "the power-off")
        assert "never powering off" not in log(as1)
    finally:
        ours.kill()
        ours.wait()


def ssh_session(client: Client, host: str) -> subprocess.Popen[bytes]:
    """A real interactive session: OpenSSH's client with a terminal (-tt), held open."""
    return subprocess.Popen(
        [
            "ssh",
            "-tt",
            "-F",
            str(client.ssh_dir / "config"),
            "-o",
            f"UserKnownHostsFile={client.ssh_dir / 'known_hosts'}",
            "-o",
            "BatchMode=yes",
            host,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_an_interactive_session_keeps_it_up_until_it_ends(
    ac: Client, as1: TestHost, utmp: Path
) -> None:
    """sessions = "active" (the default): a login with a terminal in use keeps the host up;
    vmrun's own connections (no terminal) never count."""
    install_standin(as1, "sudo", SUDO)
    session = ssh_session(ac, "as1")
    try:
        who = lambda: as1.user in as1.run(["who"], text=True).stdout  # noqa: E731
        wait_for(who, 15, "the session in utmp")
        done = ac.vmrun("autostop", "3s", "-H", "as1", env={"VMRUN_AUTOSTOP_SESSIONS": "active"})
        assert done.returncode == 0, done.stderr
        wait_for(lambda: state(as1).get("awake") == "1 login session", 10, "the session to count")
        outlast_the_period(as1)
        assert calls(as1) == []
    finally:
        os.killpg(session.pid, signal.SIGTERM)
        session.wait(10)
    wait_for(lambda: calls(as1), 30, "the power-off once the session has ended")
    assert "awake: 1 login session" in log(as1)


def boot_like_cron(host: TestHost) -> list[subprocess.Popen[bytes]]:
    """STAND-IN for cron starting at boot (the test hosts run no cron daemon): each @reboot
    line of the user's crontab, run as cron runs it: `/bin/sh -c LINE` as the user, in the
    host, with cron's environment (HOME, LOGNAME, SHELL=/bin/sh, PATH=/usr/bin:/bin)."""
    started = []
    for line in crontab(host).splitlines():
        if line.startswith("@reboot "):
            env = {"SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}
            started.append(
                host.popen(
                    ["/bin/sh", "-c", line[len("@reboot ") :]],
                    as_user=True,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    return started


def test_a_reboot_keeps_the_watchdog(ac: Client, as1: TestHost) -> None:
    install_standin(as1, "sudo", SUDO)
    done = ac.vmrun("autostop", "1h", "-H", "as1")
    assert done.returncode == 0, done.stderr
    before = installed_pid(done.stdout, "as1")
    as1.stop_sshd()  # a reboot: every process of the host dies
    assert watchdogs(as1) == []
    boot_like_cron(as1)
    as1.start_sshd()
    after = wait_for(lambda: watchdogs(as1), 10, "the watchdog to start at boot")
    assert after != [before], commands(as1)
    status = ac.vmrun("autostop", "--status", "-H", "as1")
    assert status.returncode == 0 and "1h" in status.stdout, status.stdout
    # and it still powers the host off when idle, once given a short period
    again = ac.vmrun("autostop", "2s", "-H", "as1")
    assert "settings updated: watchdog pid" in again.stdout, again.stdout
    assert watchdogs(as1) == after, commands(as1)
    wait_for(lambda: calls(as1), 20, "the power-off after the reboot")


def test_cancel_removes_everything(ac: Client, as1: TestHost) -> None:
    install_standin(as1, "sudo", SUDO)
    done = ac.vmrun("autostop", "1h", "-H", "as1")
    pid = installed_pid(done.stdout, "as1")
    cancelled = ac.vmrun("autostop", "--cancel", "-H", "as1")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == (
        f"as1: autostop removed: watchdog pid {pid} stopped, @reboot cron line removed, its files"
        " removed"
    )
    assert watchdogs(as1) == [] and "vmrun autostop" not in crontab(as1)
    scripts = as1.home / lib_dir()  # vmrun's own scripts, not the watchdog's install
    left = [p for p in (as1.home / ".vmrun").rglob("autostop*") if scripts not in p.parents]
    assert not left, left
    status = ac.vmrun("autostop", "--status", "-H", "as1")
    assert status.stdout.splitlines()[1].split()[:3] == ["as1", "not", "installed"], status.stdout
    twice = ac.vmrun("autostop", "--cancel", "-H", "as1")
    assert twice.stdout.strip() == "as1: autostop was not installed; nothing to remove"


def test_bad_input_and_hosts_that_cannot_power_off_get_one_line_and_nothing(
    ac: Client, as1: TestHost, as2: TestHost
) -> None:
    bad = ac.vmrun("autostop", "30x", "-H", "as1")
    assert bad.returncode == 2
    assert errors_in(bad.stderr) == [("bad-config", bad.stderr.strip().split(": ", 2)[2])]
    assert "'30x'" in error_in(bad.stderr)[1], bad.stderr
    (ac.cwd / "vmrun.toml").write_text('[[hosts]]\naddress = "as1"\nautostop = "30x"\n')
    toml = ac.vmrun("autostop")
    assert toml.returncode == 2 and error_in(toml.stderr)[0] == "bad-config", toml.stderr
    assert "vmrun.toml line 3" in error_in(toml.stderr)[1], toml.stderr
    (ac.cwd / "vmrun.toml").unlink()
    # as1: sudo asks for a password; as2 has no sudo at all: neither gets anything
    install_standin(as1, "sudo", PASSWORD_SUDO)
    refused = ac.vmrun("autostop", "30m", "-H", "as1", "-H", "as2")
    assert refused.returncode == 14, refused.stderr
    lines = errors_in(refused.stderr)
    assert [code for code, _ in lines] == ["autostop-failed", "autostop-failed", "hosts-failed"]
    assert lines[0][1].startswith("as1: autostop: sudo needs a password"), lines
    assert lines[0][1].endswith("nothing was installed"), lines
    assert lines[1][1].startswith("as2: autostop: there is no sudo"), lines
    assert "installed on no host" in lines[2][1], lines
    for host in (as1, as2):
        assert watchdogs(host) == [] and crontab(host) == ""
        assert not (host.home / ".vmrun" / "lib" / "autostop_watch.sh").exists()
        assert not (host.home / ".vmrun" / "autostop.conf").exists()


def test_settings_from_vmrun_toml_per_host_and_a_configured_command(
    ac: Client, as1: TestHost, as2: TestHost
) -> None:
    """`autostop` for the project and per host; `vmrun autostop` with no period applies it;
    autostop_command as a list of words, run instead of shutdown (no sudo needed)."""
    install_standin(as1, "poweroff-standin", POWEROFF)
    (ac.cwd / "vmrun.toml").write_text(
        'autostop = "1h"\n\n[[hosts]]\naddress = "as1"\nautostop = "2s"\n'
        'autostop_command = ["poweroff-standin", "--instance", "i-0abc"]\n\n'
        '[[hosts]]\naddress = "as2"\nautostop = "off"\n'
    )
    done = ac.vmrun("autostop")
    assert done.returncode == 0, done.stderr
    said = "as1: autostop powers off after 2s idle (checked every 1s; poweroff-standin ...)"
    assert said in done.stdout and "i-0abc" not in done.stdout, done.stdout
    assert 'as2: autostop is off for it (autostop = "off"); left as it is' in done.stdout
    assert watchdogs(as2) == []
    off = wait_for(lambda: calls(as1), 20, "the configured power-off command")
    assert off[0][1] == "poweroff-standin --instance i-0abc"  # type: ignore[index]
    # the command may hold a secret: not on the watchdog's command line, nor in its log
    assert not [c for c in commands(as1) if "i-0abc" in c and "poweroff-standin" not in c]
    wait_for(lambda: "power-off command ran" in log(as1), 20, "the power-off's exit in the log")
    assert "i-0abc" not in log(as1)
    assert (as1.home / ".vmrun/autostop.conf").stat().st_mode & 0o777 == 0o600
    (ac.cwd / "vmrun.toml").write_text('[[hosts]]\naddress = "as2"\n')
    missing = ac.vmrun("autostop")
    code, said = error_in(missing.stderr)
    assert missing.returncode == 2 and code == "usage" and "as2" in said, missing.stderr


def test_status_and_watch_gpus_show_what_autostop_says(ac: Client, as1: TestHost) -> None:
    """One more column where a host has a watchdog: `status` per run row, `watch-gpus` beside
    the host's first GPU (and in --json)."""
    install_standin(as1, "sudo", SUDO)
    gpu_standin(as1, "t4x2_training", apps="")
    rid = "autostop-20250101-000000-beef"
    with Connection("as1", ac.settings()) as conn:
        records.start(conn, rid, ".", ["sleep", "600"], RunRecord())
    done = ac.vmrun("autostop", "1h", "-H", "as1")
    assert done.returncode == 0, done.stderr
    awake = f"awake: run {rid}, GPU 0 93%, GPU 1 93%"
    wait_for(lambda: state(as1).get("awake") == awake[len("awake: ") :], 10, "the watchdog's view")
    status = ac.vmrun("status", "-H", "as1")
    assert status.returncode == 0, status.stderr
    head, row = status.stdout.splitlines()[:2]
    assert head.split()[-1] == "AUTOSTOP" and row.startswith(rid) and row.endswith(awake), status
    watch = ac.vmrun("watch-gpus", "--once", "-H", "as1")
    assert watch.returncode == 0, watch.stderr
    lines = watch.stdout.splitlines()
    assert lines[1].split()[-1] == "autostop" and lines[2].endswith(awake), watch.stdout
    as_json = ac.vmrun("watch-gpus", "--once", "--json", "-H", "as1")
    said = json.loads(as_json.stdout)["autostop"]
    assert said["awake"] == awake[len("awake: ") :] and said["running"] is True, said
    stopped = ac.vmrun("stop", rid, "-H", "as1", "--grace", "1")
    assert stopped.returncode == 0, stopped.stderr
    for item in (FIXTURES / "t4_idle").iterdir():
        shutil.copy(item, as1.home / ".vmrun/bin/nvidia-smi-replay" / item.name)
    wait_for(lambda: state(as1).get("since"), 10, "the host to be idle")
    status = ac.vmrun("status", "-H", "as1")
    off = r"idle \d+s, off (\d\d-\d\d )?\d\d:\d\d$"  # the date too when it is tomorrow
    assert re.search(off, status.stdout.splitlines()[1]), status.stdout
    other = ac.vmrun("status", "-H", "as2")  # no watchdog there: no column
    assert "AUTOSTOP" not in other.stdout + other.stderr


def test_setup_installs_autostop_after_it_succeeds(
    ac: Client, as1: TestHost, host_python: Path
) -> None:
    install_standin(as1, "sudo", SUDO)
    bad = ac.vmrun("setup", "as1", "--python", str(host_python), "--autostop", "30x")
    assert bad.returncode == 2, bad.stderr
    code, said = error_in(bad.stderr)
    assert code == "bad-config" and said.startswith("--autostop '30x'"), bad.stderr
    assert not (as1.home / ".vmrun" / "setup").exists()  # nothing ran
    done = ac.vmrun(
        "setup",
        "as1",
        "--python",
        str(host_python),
        "--torch",
        TORCH_SPEC,
        "--autostop",
        "3s",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "as1: autostop powers off after 3s idle" in done.stdout, done.stdout
    assert installed_pid(done.stdout, "as1") in watchdogs(as1)
    wait_for(lambda: calls(as1), 20, "the power-off")


@pytest.fixture
def trainer(ac: Client, as1: TestHost, host_python: Path) -> Iterator[Client]:
    """A project whose vmrun.toml knows as1 with the shared interpreter (torch on CPU)."""
    (ac.cwd / "vmrun.toml").write_text(f'[[hosts]]\naddress = "as1"\npython = "{host_python}"\n')
    ac.extra_env["OMP_NUM_THREADS"] = "1"
    yield ac
    clean_host(as1)


def test_down_after_run_powers_off_once_the_results_are_here(
    trainer: Client, as1: TestHost
) -> None:
    install_standin(as1, "sudo", SUDO)
    done = trainer.vmrun(
        "train",
        "-H",
        "as1",
        "--epochs",
        "2",
        "--save-every",
        "1",
        "--fetch-every",
        "1",
        "--down-after-run",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    local = trainer.cwd / "results" / rid / "finalmodel.pt"
    remote = template_out(as1, trainer, rid) / "finalmodel.pt"
    assert local.read_bytes() == remote.read_bytes()
    off = calls(as1)
    assert [what for _, what in off] == ["shutdown -h now"], off
    assert off[0][0] >= int(local.stat().st_ctime)  # after the final fetch, not before
    fetched = done.stderr.index(f"vmrun: run {rid} finished on as1; its files are in results/")
    said = f"vmrun: as1: powering off (sudo -n shutdown -h now): run {rid} ended, its files are"
    assert fetched < done.stderr.index(said), done.stderr
    assert f"powering off now (run {rid} ended and its results were fetched" in log(as1)


def test_down_after_run_refusals_and_what_keeps_the_host_up(trainer: Client, as1: TestHost) -> None:
    for args, said in (
        (["--down-after-run"], "it needs --fetch-every SECONDS, and vmrun following the run"),
        (["--fetch-every", "1", "--detach", "--down-after-run"], "--fetch-every needs"),
        (["--local", "--down-after-run"], "--down-after-run is for runs on hosts (-H)"),
        (["-C", "hpc", "--down-after-run"], "--down-after-run is for runs on hosts (-H); Slurm"),
    ):
        bad = trainer.vmrun("train", *args)
        assert bad.returncode == 2 and said in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # no sudo on the host: refused before the run starts
    refused = trainer.vmrun("train", "-H", "as1", "--fetch-every", "1", "--down-after-run")
    assert refused.returncode == 14, refused.stderr
    code, said = error_in(refused.stderr)
    assert said.startswith("as1: ") and "no sudo" in said, refused.stderr
    assert code == "autostop-failed", refused.stderr
    assert not (as1.home / ".vmrun" / "runs").exists()  # nothing started
    # another run alive on the host: this one ends, its results come, the host stays up
    install_standin(as1, "sudo", SUDO)
    other = "other-20250101-000000-abcd"
    with Connection("as1", trainer.settings()) as conn:
        records.start(conn, other, ".", ["sleep", "600"], RunRecord())
    done = trainer.vmrun(
        "train",
        "-H",
        "as1",
        "--epochs",
        "1",
        "--save-every",
        "1",
        "--fetch-every",
        "1",
        "--down-after-run",
        "--allow-concurrent",
        timeout=300,
    )
    assert done.returncode == 14, done.stderr
    rid = run_id_of(done.stderr)
    assert (trainer.cwd / "results" / rid / "finalmodel.pt").exists()
    code, said = error_in(done.stderr)
    assert code == "power-off-failed" and said.startswith("as1: ") and other in said, done.stderr
    assert calls(as1) == []


def test_down_after_run_never_powers_off_when_the_final_fetch_failed(
    trainer: Client, as1: TestHost
) -> None:
    """The script leaves a file nobody can read: its results cannot all come here."""
    install_standin(as1, "sudo", SUDO)
    (trainer.cwd / "unreadable.py").write_text(
        "import pathlib\np = pathlib.Path('out.bin')\np.write_bytes(b'x' * 64)\np.chmod(0)\n"
    )
    done = trainer.vmrun(
        "train",
        "unreadable.py",
        "--launcher",
        "python",
        "-H",
        "as1",
        "--fetch-every",
        "1",
        "--down-after-run",
        timeout=300,
    )
    rid = run_id_of(done.stderr)
    assert done.returncode == 14, done.stderr
    code, said = error_in(done.stderr)
    assert code == "remote-failed" and rid in said and "as1" in said, done.stderr
    assert calls(as1) == []


def test_down_after_run_after_a_failed_run_fetches_what_it_made_then_powers_off(
    trainer: Client, as1: TestHost
) -> None:
    install_standin(as1, "sudo", SUDO)
    (trainer.cwd / "crash.py").write_text(
        "import pathlib, sys\npathlib.Path('partial.txt').write_text('epoch 1')\nsys.exit(3)\n"
    )
    done = trainer.vmrun(
        "train",
        "crash.py",
        "--launcher",
        "python",
        "-H",
        "as1",
        "--fetch-every",
        "1",
        "--down-after-run",
        timeout=300,
    )
    rid = run_id_of(done.stderr)
    assert done.returncode != 0, done.stderr  # the run's failure, as without the flag
    assert (trainer.cwd / "results" / rid / "partial.txt").read_text() == "epoch 1"
    assert [what for _, what in calls(as1)] == ["shutdown -h now"], done.stderr
    assert f"as1: powering off (sudo -n shutdown -h now): run {rid} ended" in done.stderr


def test_wall_warns_the_terminal_of_a_logged_in_user(ac: Client, as1: TestHost, utmp: Path) -> None:
    """The real `wall`, seen in a real session's terminal: sessions = "ignore", so the
    session does not keep the host up and its user is warned before the power-off. wall
    writes to every terminal in this machine's utmp, so this runs only where the suite made
    utmp itself (nobody else is logged in to see it)."""
    if utmp.stat().st_size and not _only_test_logins(utmp):
        pytest.skip("this machine has logins of its own: wall would write to their terminals")
    install_standin(as1, "sudo", SUDO)
    session = ssh_session(ac, "as1")
    seen = bytearray()

    def read() -> None:
        assert session.stdout is not None
        for chunk in iter(lambda: session.stdout.read1(4096), b""):  # type: ignore[union-attr]
            seen.extend(chunk)

    threading.Thread(target=read, daemon=True).start()
    try:
        wait_for(lambda: as1.user in as1.run(["who"], text=True).stdout, 15, "the session")
        done = ac.vmrun("autostop", "4s", "-H", "as1", env={"VMRUN_AUTOSTOP_WARN": "3s"})
        assert done.returncode == 0, done.stderr
        wait_for(lambda: b"vmrun autostop: vmt-as1 has been idle since" in seen, 20, "wall")
        text = re.sub(r"\r*\n", "", bytes(seen).decode(errors="replace"))  # wall wraps at 79
        assert "To keep it up: start a vmrun run, or `vmrun autostop --cancel`" in text, text
        assert calls(as1) == []  # warned first
        wait_for(lambda: calls(as1), 20, "the power-off after the warning")
    finally:
        os.killpg(session.pid, signal.SIGTERM)
        session.wait(10)


def _only_test_logins(utmp: Path) -> bool:
    """Every login in utmp is a test host user's (vmt<hex>-<name>)."""
    who = subprocess.run(["who"], capture_output=True, text=True, check=False).stdout
    return all(re.match(r"vmt[0-9a-f]{4}-", line) for line in who.splitlines())


SYSTEMCTL = r"""#!/bin/sh
# STAND-IN for systemctl (no systemd in the test bed): records its arguments; `start` and
# `restart` run the unit's ExecStart as systemd would (detached, a session of its own),
# `disable --now` stops what runs it
echo "systemctl $*" >> "$HOME/systemctl.calls"
case $1 in
  start | restart)
    cmd=$(sed -n 's/^ExecStart=//p' "/etc/systemd/system/$2")
    setsid -f sh -c "exec $cmd" < /dev/null > /dev/null 2>&1 ;;
  disable)
    pid=$(cat "$HOME/.vmrun/autostop.state.pid" 2>/dev/null)
    [ -z "$pid" ] || kill -TERM -"$pid" ;;
esac
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root")
def test_where_systemd_runs_a_unit_starts_the_watchdog(tmp_path: Path) -> None:
    """The systemd branch of the host scripts, run here as root in a mount namespace of its
    own whose /run/systemd/system says systemd runs (tmpfs, also over /etc/systemd/system:
    nothing of this machine changes), with a STAND-IN systemctl: the unit written and
    enabled, the watchdog started by it, installing again changes nothing, cancel removes
    the unit and stops only the watchdog (the shell driving this has the script's path among
    its arguments). Root needs no sudo."""
    from vmrun.autostop.settings import Autostop
    from vmrun.autostop.watchdog import _install_argv, conf_env
    from vmrun.hostside import source
    from vmrun.remote_paths import AUTOSTOP_CONF, AUTOSTOP_LOG, AUTOSTOP_STATE

    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "systemctl").write_text(SYSTEMCTL)
    (home / "bin" / "systemctl").chmod(0o755)
    install_hostlib(home)
    cfg = Autostop(3600, 1, 300, 10, "ignore", "true")
    install = local_argv(_install_argv("install"), home)[1:]  # after `sh`
    cancel = [
        source("autostop_cancel.sh"),
        "x",
        AUTOSTOP_CONF,
        AUTOSTOP_STATE,
        AUTOSTOP_LOG,
        ".vmrun/lib",
        "autostop_watch.sh",
    ]
    status = [source("autostop_status.sh"), "x", AUTOSTOP_CONF, AUTOSTOP_STATE, SCRIPT]
    steps = (
        "mount -t tmpfs none /run/systemd && mkdir /run/systemd/system"
        " && mount -t tmpfs none /etc/systemd/system || exit 99\n"
        'sh "$I" "$@"; echo ==; sh "$I" "$@"; echo ==; cat /etc/systemd/system/*.service;'
        ' echo ==; sh -c "$S" $SA; echo ==; sh -c "$C" $CA; echo ==; ls /etc/systemd/system'
    )
    env = {
        "HOME": str(home),
        "PATH": f"{home / 'bin'}:/usr/bin:/bin",
        "I": install[0],
        "S": status[0],
        "SA": " ".join(status[1:]),
        "C": cancel[0],
        "CA": " ".join(cancel[1:]),
        **conf_env(cfg),
    }
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", steps, "ns", *install[1:]],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    left = _pids_running(str(home / SCRIPT))
    for pid in left:
        os.killpg(pid, signal.SIGKILL)
    assert done.returncode == 0, done.stdout + done.stderr
    first, second, unit, stat, gone, listing = done.stdout.split("==\n")
    assert "BOOT systemd added" in first and re.search(r"PID \d+ started", first), first
    assert "BOOT systemd present" in second and re.search(r"PID \d+ running", second), second
    assert f'ExecStart=/bin/sh "{home}/{SCRIPT}" {AUTOSTOP_CONF}' in unit, unit
    assert "User=root" in unit and "WantedBy=multi-user.target" in unit, unit
    assert "ALIVE 1" in stat and "BOOT systemd" in stat, stat
    assert "UNIT removed" in gone and "LEFT" not in gone, gone
    assert listing.strip() == "" and left == []
    calls = (home / "systemctl.calls").read_text().splitlines()
    assert calls == [
        "systemctl daemon-reload",
        "systemctl enable vmrun-autostop-root.service",
        "systemctl restart vmrun-autostop-root.service",
        "systemctl disable --now vmrun-autostop-root.service",
        "systemctl daemon-reload",
    ], calls


def _pids_running(script: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if script.encode() in proc.joinpath("cmdline").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
    return found


def test_the_warning_is_told_to_the_notify_targets_once(
    ac: Client, as1: TestHost, bed: NetnsBed
) -> None:
    """With `notify` set, the warning before a power-off also reaches the user wherever they
    are (the watchdog's copy of the stdlib sender posts to the webhook), once per idle
    period; its URL is only in a 0600 file, never in the watchdog's CONF or command line;
    `--cancel` removes it."""
    from test_notify import TOKEN, Receiver

    install_standin(as1, "sudo", SUDO)
    install_standin(as1, "wall", WALL)
    receiver = Receiver(bed.root_addr)
    try:
        env = {"VMRUN_AUTOSTOP_WARN": "2s", "VMRUN_NOTIFY": receiver.url(bed.root_addr)}
        done = ac.vmrun("autostop", "4s", "-H", "as1", env=env)
        assert done.returncode == 0, done.stderr
        wait_for(lambda: calls(as1), 30, "the STAND-IN power-off")
        wait_for(lambda: receiver.posts, 30, "the warning's message")
        (message,) = receiver.messages()
        assert message["title"].startswith(f"vmrun: {'as1'} powers off at ")
        assert "has been idle since" in message["message"], message
        told = as1.home / ".vmrun" / "autostop-notify" / "notify.json"
        assert told.stat().st_mode & 0o077 == 0
        assert TOKEN not in (as1.home / ".vmrun" / "autostop.conf").read_text()
        for pid in watchdogs(as1):
            assert TOKEN.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        cancelled = ac.vmrun("autostop", "--cancel", "-H", "as1")
        assert cancelled.returncode == 0, cancelled.stderr
        assert not told.parent.exists()
    finally:
        receiver.close()
