"""Autostop without a host (quick tier): periods, the settings a host's watchdog is told and
their order, the file that carries them, what its state line says, and the watchdog's
one-off power-off run here by sh against a home of its own (no sshd: the test hosts' side is
tests/test_cli_autostop.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import install_hostlib, wait_for

from vmrun.autostop.settings import for_host
from vmrun.autostop.status import AutostopStatus, from_status_output
from vmrun.autostop.watchdog import conf_env
from vmrun.config import load_settings
from vmrun.errors import ConfigError
from vmrun.hostside import source
from vmrun.setting_types import format_period, period_seconds
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry, project_hosts


@pytest.mark.parametrize(
    ("text", "seconds", "shown"),
    [
        ("30m", 1800, "30m"),
        ("2h", 7200, "2h"),
        ("90s", 90, "1m30s"),
        ("1h30m", 5400, "1h30m"),
        ("1d", 86400, "1d"),
        ("45", 45, "45s"),
        (3600, 3600, "1h"),
        (" 10 M ", 600, "10m"),
    ],
)
def test_periods(text: str | int, seconds: int, shown: str) -> None:
    assert period_seconds(text) == seconds
    assert format_period(seconds) == shown


@pytest.mark.parametrize("text", ["30x", "", "m", "1.5h", "-5m", "0s", "1m1h"])
def test_bad_periods_are_one_line_naming_what_to_write(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        period_seconds(text, what="PERIOD")
    message = caught.value.message
    assert message.startswith("PERIOD") and "\n" not in message
    assert "30m" in message or "at least 1s" in message


def _project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "vmrun.toml").write_text(text)
    return tmp_path


def test_a_hosts_own_value_wins_over_the_file_and_loses_to_the_environment(
    tmp_path: Path,
) -> None:
    cwd = _project(
        tmp_path,
        'autostop = "1h"\nautostop_interval = "30s"\n\n'
        '[[hosts]]\naddress = "a"\nautostop = "10m"\nautostop_command = ["aws", "ec2",'
        ' "stop-instances", "--instance-ids", "i-1"]\n\n[[hosts]]\naddress = "b"\n\n'
        '[[hosts]]\naddress = "c"\nautostop = "off"\n',
    )
    environ = {"HOME": str(tmp_path)}
    settings = load_settings({}, cwd=cwd, environ=environ)
    a, b, c = project_hosts(settings)
    got_a, got_b = for_host(settings, a), for_host(settings, b)
    assert got_a is not None and got_b is not None
    assert (got_a.period, got_a.interval, got_b.period) == (600, 30, 3600)
    assert got_a.command == "aws ec2 stop-instances --instance-ids i-1"
    assert got_a.command_word == "aws" and got_b.command == got_b.command_word == ""
    assert (got_b.warn, got_b.gpu_threshold, got_b.sessions) == (300, 10, "active")
    assert for_host(settings, c) is None
    assert for_host(settings, c, one_off=True).period == 1  # --down-after-run: the command
    loud = load_settings({}, cwd=cwd, environ={**environ, "VMRUN_AUTOSTOP": "5m"})
    assert [for_host(loud, h).period for h in project_hosts(loud)] == [300, 300, 300]  # type: ignore[union-attr]
    flag = load_settings({"autostop": "2m"}, cwd=cwd, environ=environ)
    assert flag.sources["autostop"] == "command line"
    assert for_host(flag, a).period == 120  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('autostop = "30x"', "vmrun.toml line 1) '30x': not a period; write it as 30m, 2h"),
        ('autostop_sessions = "some"', "line 1) must be one of active, any, ignore, got 'some'"),
        ("autostop_gpu_threshold = 0", "line 1) must be a percentage 1-100, got 0"),
        ("autostop_command = 5", "must be a command line in quotes, or a list of words"),
        (
            '[[hosts]]\naddress = "a"\nautostop = true',
            "line 3: autostop of host #1 must be a period",
        ),
        ('[[hosts]]\naddress = "a"\nautostop_warn = "soon"', "autostop_warn of host #1 must be"),
    ],
)
def test_bad_settings_in_vmrun_toml_are_named_by_line(tmp_path: Path, line: str, said: str) -> None:
    cwd = _project(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({}, cwd=cwd, environ={"HOME": str(tmp_path)})
    assert said in caught.value.message, caught.value.message


def test_the_conf_file_is_shell_the_watchdog_reads_back(tmp_path: Path) -> None:
    cwd = _project(
        tmp_path,
        '[[hosts]]\naddress = "a"\nautostop = "30m"\n'
        "autostop_command = \"gcloud compute instances stop vm-1 --zone 'eu west'\"\n"
        'nvidia_smi = "~/bin/nvidia-smi"\n',
    )
    settings = load_settings({}, cwd=cwd, environ={"HOME": str(tmp_path)})
    cfg = for_host(settings, project_hosts(settings)[0])
    assert cfg is not None
    script = cfg.conf_text() + '\nprintf "%s|" "$period" "$interval" "$poweroff" "$nvsmi" "$state"'
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split("|")[:5] == [
        "1800",
        "60",
        "gcloud compute instances stop vm-1 --zone 'eu west'",
        "~/bin/nvidia-smi",
        ".vmrun/autostop.state",
    ]
    # shown by its program alone: the arguments of a power-off command often hold a key
    assert cfg.describe() == "powers off after 30m idle (checked every 1m; gcloud ...)"


def test_what_the_state_line_says() -> None:
    now = time.time()
    host_now = now - 100  # the host's clock is 100 s behind this one
    since, off = int(host_now - 300), int(host_now + 1500)
    idle = AutostopStatus.from_state(
        "h",
        f"pid=7\tperiod=1800\tinterval=60\tsince={since}\toff={off}\tawake=\tblock=",
        alive=True,
        host_now=host_now,
    )
    assert idle.period_text() == "30m" and idle.keeping_awake() == "-"
    assert 299 <= (idle.idle_for(now) or 0) <= 301
    assert abs((idle.off_at() or 0) - (now + 1500)) <= 1  # in this machine's time
    assert idle.short(now).startswith("idle 5m, off ")
    busy = AutostopStatus.from_state(
        "h",
        "pid=7\tperiod=60\tsince=\toff=\tawake=run r1, GPU 0 93%\tblock=",
        alive=True,
        host_now=now,
    )
    assert busy.short() == "awake: run r1, GPU 0 93%" and busy.idle_for() is None
    blocked = AutostopStatus.from_state(
        "h",
        "pid=7\tperiod=60\tsince=1\toff=61\tawake=\tblock=non-vmrun GPU process pid 9",
        alive=True,
        host_now=now,
    )
    assert blocked.short() == "blocked: non-vmrun GPU process pid 9"
    assert blocked.keeping_awake() == "non-vmrun GPU process pid 9: never powers off while it runs"
    failing = AutostopStatus.from_state(
        "h",
        "pid=7\tperiod=60\tsince=1\toff=61\tnote=power-off command failed (exit 1) at 61",
        alive=True,
        host_now=now,
    )
    assert failing.keeping_awake() == "-; its last power-off command failed (see the log)"
    dead = AutostopStatus.from_state("h", "pid=7\tperiod=60", alive=False, host_now=now)
    assert dead.short() == "not running"
    gone = from_status_output("h", "NOW 5\nINSTALLED 0\nBOOT none\n")
    assert (gone.installed, gone.short(), gone.period_text()) == (False, "-", "not installed")
    streamed = AutostopStatus.from_watch_line("h", f"{int(now)} 1 pid=7\tperiod=60\tawake=run x")
    assert streamed.short() == "awake: run x"
    assert not AutostopStatus.from_watch_line("h", f"{int(now)} 0 ").installed


# -- the watchdog's one-off power-off, run here by sh -----------------------------------------


def _home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "home"
    (home / ".vmrun" / "runs").mkdir(parents=True)
    (home / "bin").mkdir()
    poweroff = home / "bin" / "poweroff-standin"
    poweroff.write_text(
        '#!/bin/sh\n# STAND-IN power-off: records the call\necho "called $*" >> "$HOME/calls"\n'
    )
    poweroff.chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{home / 'bin'}:/usr/bin:/bin"}
    install_hostlib(home)
    return home, env


def _now(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    settings = load_settings(
        {"autostop_command": ["poweroff-standin", "--now"]}, cwd=tmp_path, environ=env
    )
    cfg = for_host(settings, HostEntry(parse_host("x")), one_off=True)
    return subprocess.run(
        ["sh", "-c", source("autostop_watch.sh"), "vmrun-autostop", "now", "a test"],
        env={**env, **conf_env(cfg)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_one_off_power_off_runs_the_command_unless_a_run_is_alive(tmp_path: Path) -> None:
    home, env = _home(tmp_path)
    record = home / ".vmrun" / "runs" / "r1"
    record.mkdir()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        (record / "pid").write_text(f"{alive.pid}\n")
        start = Path(f"/proc/{alive.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (record / "pid_start").write_text(f"{start}\n")
        busy = _now(tmp_path, env)
        assert (busy.returncode, busy.stdout) == (3, "BUSY run r1 is still running\n"), busy
        (record / "pid_start").write_text("1\n")  # the pid now names another process
        done = _now(tmp_path, env)
    finally:
        alive.kill()
        alive.wait()
    assert done.returncode == 0 and done.stdout.endswith("RAN 0\n"), done
    assert (home / "calls").read_text() == "called --now\n"
    said = (home / ".vmrun" / "autostop.log").read_text()
    assert "powering off now (a test)" in said and "ran (exit 0)" in said, said
    assert "--now" not in said  # the command may hold a secret: never logged
    assert not [p for p in (home / ".vmrun").iterdir() if p.name.startswith("autostop.state")]


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_autostop_scripts_are_shellcheck_clean_posix_sh() -> None:
    here = Path(__file__).resolve().parent.parent / "vmrun" / "hostside"
    names = sorted(str(p) for p in here.glob("autostop_*.sh"))
    assert len(names) == 4
    proc = subprocess.run(["shellcheck", "--shell=sh", *names], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    assert os.path.basename(names[-1]) == "autostop_watch.sh"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_spent_budget_stops_the_runs_with_their_work_saved_then_powers_off(
    tmp_path: Path,
) -> None:
    """autostop_budget (`up --max-cost`'s share of a VM): the watchdog adds up the running
    time; at the budget the run alive gets SIGUSR2 from budget_watch.py (its snapshot), and
    once it has ended the power-off runs, idle period or not (none here: 0)."""
    home, env = _home(tmp_path)
    settings = load_settings(
        {"autostop_command": ["poweroff-standin", "--budget"], "autostop_interval": "1s"},
        cwd=tmp_path,
        environ=env,
    )
    cfg = for_host(settings, HostEntry(parse_host("x"), vars={"autostop_budget": "2s"}))
    assert cfg is not None and (cfg.period, cfg.budget) == (0, 2)
    assert cfg.describe().startswith("powers off after 2s running in all, its runs saved first")
    conf = home / ".vmrun" / "autostop.conf"
    conf.write_text(cfg.conf_text() + "\n")
    said = tmp_path / "said"
    catcher = (
        f"import pathlib, signal, sys, time\nsignal.signal(signal.SIGUSR2, lambda *_: ("
        f"pathlib.Path({str(said)!r}).write_text('usr2'), sys.exit(0)))\ntime.sleep(60)\n"
    )
    record = home / ".vmrun" / "runs" / "r1"
    record.mkdir()
    run = subprocess.Popen(
        ["sh", "-c", f'{sys.executable} -c "$1"; true', "sh", catcher], start_new_session=True
    )
    watchdog = None
    try:
        start = Path(f"/proc/{run.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (record / "pid").write_text(f"{run.pid}\n")
        (record / "pid_start").write_text(f"{start}\n")
        (record / "log").write_text("")
        lib = install_hostlib(home)
        watchdog = subprocess.Popen(
            ["sh", str(lib / "autostop_watch.sh"), ".vmrun/autostop.conf"], env=env, cwd=home
        )
        wait_for(lambda: (home / "calls").exists(), 60, "the power-off")
    finally:
        conf.unlink(missing_ok=True)  # the watchdog ends at its next tick
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        if watchdog is not None:
            try:
                watchdog.wait(timeout=30)  # `setsid` runs it in place: the same process
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()
                raise
    assert said.read_text() == "usr2"  # the run was told first: its epoch, its snapshot
    assert (record / "budget").exists() and (home / "calls").read_text() == "called --budget\n"
    log = (home / ".vmrun" / "autostop.log").read_text()
    assert "its budget of 2 s running time is spent" in log, log
