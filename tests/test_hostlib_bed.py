"""vmrun's host-side files on a real sshd test host (vmrun.ssh.hostlib): during a run the
host's `ps` shows the scripts by their path under ~/.vmrun/lib/<version>-<hash>/, never their
text, and `vmrun status` and `vmrun logs` pay the install once (two round trips, on a host
without the files) and no round trip more after it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, copier_pids, user_commands, wait_for
from testbed import NetnsBed, TestHost

from vmrun import hostside
from vmrun.backends.hosts import records
from vmrun.results.record import Launch, RunRecord
from vmrun.runs.launch_spec import Budget, Hang, Spot, Store, Watchers
from vmrun.ssh.connection import Connection

RID = "hostlib-20260101-000000-0001"


@pytest.fixture
def h1(bed: NetnsBed) -> Iterator[TestHost]:
    host = bed["h1"]
    yield host
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int((host.home / ".vmrun/runs" / RID / "pid").read_text()), signal.SIGKILL)
    shutil.rmtree(host.home / ".vmrun" / "runs" / RID, ignore_errors=True)


def _sessions(host: TestHost, since: int) -> int:
    """Exec sessions (one per round trip that runs a command) in the host's sshd log."""
    return host.sshd_log()[since:].count("Starting session: command")


def _timed(client: Client, host: TestHost, *args: str) -> int:
    offset = len(host.sshd_log())
    done = client.vmrun(*args)
    assert done.returncode == 0, done.stderr
    return _sessions(host, offset)


def test_ps_shows_the_scripts_by_path_and_commands_pay_no_round_trip_for_them(
    bed_client: Client, h1: TestHost
) -> None:
    lib = h1.home / hostside.lib_dir()
    shutil.rmtree(h1.home / ".vmrun" / "lib", ignore_errors=True)  # a host vmrun never reached
    offset = len(h1.sshd_log())
    with Connection("h1", bed_client.settings()) as conn:
        records.start(
            conn, RID, ".", ["sh", "-c", "echo hello; sleep 60"], RunRecord(launch=Launch(name="x"))
        )
    assert _sessions(h1, offset) == 3, "the guarded start, the install, the start again"
    assert (lib / "MANIFEST").read_text() == hostside.manifest()

    def commands() -> list[str]:
        found = user_commands(h1)
        return found if any("run_agent.py" in c for c in found) else []

    found = wait_for(commands, 20, "the run's agent beside the run")
    assert isinstance(found, list)
    assert any(c.endswith(f"{lib}/run_agent.py run") for c in found), found
    assert not [c for c in found if "\n" in c], "no script's text on a command line"

    status = _timed(bed_client, h1, "status", "-H", "h1")
    logs = _timed(bed_client, h1, "logs", RID, "-H", "h1")
    # as many as before the files were installed by path (scripts sent as text: 2 and 2)
    assert (status, logs) == (2, 2)
    shutil.rmtree(h1.home / ".vmrun" / "lib")  # a new vmrun version reaches the host
    # each of its first commands (started at once) again, and one install
    assert _timed(bed_client, h1, "status", "-H", "h1") == 2 * status + 1
    assert _timed(bed_client, h1, "status", "-H", "h1") == status
    assert _timed(bed_client, h1, "logs", RID, "-H", "h1") == logs


def test_a_first_command_whose_input_the_guard_never_reads_still_runs(
    bed_client: Client, h1: TestHost
) -> None:
    """On a host without the files, the guard ends at once without reading the command's
    input (its environment, sent over stdin). An input larger than the channel's window
    (2 MiB; base64 makes 1.7 MB of values 2.3 MiB) cannot all be sent before that end: the
    send fails on a channel the host closed, which is the guard's answer, not a lost
    connection; the files go up and the command runs, with every value."""
    shutil.rmtree(h1.home / ".vmrun" / "lib", ignore_errors=True)  # a host vmrun never reached
    env = {f"BIG{i}": chr(ord("a") + i) * 100_000 for i in range(17)}  # each under 128 KiB
    count = 'for v in "$BIG0" "$BIG16"; do printf %s "$v"; done | wc -c'
    with Connection("h1", bed_client.settings()) as conn:
        done = conn.run(["sh", "-c", count], env=env, check=True)
    assert done.stdout_tail.split() == ["200000"]


def _live(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _session(sid: int) -> dict[int, tuple[int, str]]:
    """pid: (parent pid, command line) of every live process of the session."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    found[int(entry.name)] = (int(fields[1]), line.strip())
    return found


def test_a_run_with_every_watcher_has_one_companion_process_on_its_node(
    bed_client: Client, h1: TestHost
) -> None:
    """Hang, budget, spot and the bucket copy on, over SSH: the command's session holds the
    command's tree, nothing else; its agent (in a session of its own, the bucket copy one of
    its parts) is the one process beside it; the copier's secret is in no command line."""
    secret = "s3cret-store-config-5e6f"
    fake = h1.home / "fake-env" / "rclone"  # the mover beside the run's Python
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\n[ "$1" = version ] && echo "rclone v1.66.0"\nexit 0\n')
    fake.chmod(0o755)
    os.chown(fake.parent, h1.uid, h1.uid)
    os.chown(fake, h1.uid, h1.uid)
    watchers = Watchers(
        hang=Hang(600.0, "stop", False, "python3"),
        budget=Budget(600.0, "$9"),
        spot=Spot(),
        store=Store("b/runs/x", "s3://b/runs/x", str(fake.parent / "python"), False, secret),
    )
    with Connection("h1", bed_client.settings()) as conn:
        got = records.start(
            conn,
            RID,
            ".",
            ["sh", "-c", "sleep 60 & sleep 60; wait"],
            RunRecord(launch=Launch(name="x")),
            watchers=watchers,
        )
    rec = h1.home / ".vmrun" / "runs" / RID
    command = int((rec / "session").read_text().split()[0])
    wait_for(lambda: len(_session(command)) == 3, 20, "the command's three")
    members = _session(command)
    assert members[command][0] == got.pid  # the agent's child, in a session of its own
    tree = {command} | {p for p, (parent, _) in members.items() if parent == command}
    assert set(members) == tree, members
    # the agent is alone in its session but for a pass of the copy now and then
    wait_for(lambda: set(_session(got.pid)) == {got.pid}, 20, "the agent alone")
    assert _session(got.pid)[got.pid][1].endswith("run_agent.py run")
    copying = copier_pids(h1)  # a pass's, then gone, or in the agent's session: none beside
    beside = [p for p in copying if p not in _session(got.pid) and _live(p)]
    assert not beside, beside
    wait_for(lambda: (rec / "store.json").exists(), 20, "the bucket copier's state")
    assert not [c for c in user_commands(h1) if secret in c]
