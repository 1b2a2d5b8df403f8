"""A run's start on its host as one launch spec (vmrun.runs.launch_spec) and one agent
(hostside/run_agent.py), quick tier: the spec goes whole and comes back the same, a version
this vmrun does not read is refused, its secrets are in no repr, no argument and no run's
environment; run_start.sh and the agent run here by sh against a home of their own: the
run's end is recorded as before (exit code, the requeue rule, log.times), the secrets land
only in 0600 files, the hang, budget and spot watchers act from inside the agent, and the
agent is the one process of the run's session besides the training tree."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import install_hostlib, wait_for

from vmrun import hostside
from vmrun.errors import UsageError
from vmrun.hostside import HostPath
from vmrun.runs.launch_spec import (
    LAUNCH_VAR,
    Budget,
    Hang,
    LaunchSpec,
    Notify,
    Provenance,
    Spot,
    Store,
    Watchers,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

HOOK = "https://hooks.example/s3cret-hook-0a1b2c"
KEY = "s3cret-store-key-9f8e7d"
RID = f"agent-{secrets.token_hex(4)}"
IMDS = Path(__file__).resolve().parent / "standins" / "imds.py"


def _spec(argv: tuple[str, ...], home: Path, **parts: object) -> LaunchSpec:
    """Run RID in `home` (an id of its own: watchers find a run's ranks by it, host-wide)."""
    return LaunchSpec(
        rec=f".vmrun/runs/{RID}",
        workdir=str(home),
        run_id=RID,
        argv=argv,
        meta=json.dumps({"id": RID}),
        env=dict(parts.pop("env", {}) or {}),  # type: ignore[call-overload]
        out="out",
        watchers=Watchers(**parts),  # type: ignore[arg-type]
    )


def test_the_spec_goes_whole_and_comes_back_the_same() -> None:
    spec = LaunchSpec(
        rec=".vmrun/runs/r1",
        workdir="/w",
        run_id="r1",
        argv=("python", "train.py", "--lr", "it's 1e-3\n"),
        meta='{"id": "r1"}',
        env={"TOKEN": "t"},
        mode="resume",
        banner="--- attempt 2 ---",
        out="/w/results/r1",
        alone=True,
        watchers=Watchers(
            hang=Hang(60.0, "stop", True, "/usr/bin/python3"),
            budget=Budget(3600.0, "$5.00"),
            spot=Spot(),
            store=Store("b/runs/r1", "s3://b/runs/r1", "/p", True, f"[store]\nkey = {KEY}\n"),
            notify=Notify(json.dumps({"webhooks": [{"url": HOOK}]})),
            provenance=Provenance("/usr/bin/python3", "H4sI"),
        ),
    )
    assert LaunchSpec.from_json(spec.to_json()) == spec
    tool = LaunchSpec(
        rec="r/r2", workdir=".", run_id="r2", argv=("sh", hostside.path("run_alive.sh"))
    )
    back = LaunchSpec.from_json(tool.to_json())
    assert back == tool and isinstance(back.argv[1], HostPath)  # the home's, on the host
    bare = LaunchSpec(rec="r/r2", workdir=".", run_id="r2", argv=("true",))
    again = LaunchSpec.from_json(bare.to_json())
    assert again == bare and again.watchers == Watchers()
    # the secrets are in the document alone: no repr (a log, an error) shows them
    assert KEY not in repr(spec) and HOOK not in repr(spec)
    (name,) = spec.header()
    assert name == LAUNCH_VAR  # one variable in the stdin header, nothing on the argv


def test_a_spec_of_another_version_or_shape_is_refused() -> None:
    text = LaunchSpec(rec="r/r1", workdir=".", run_id="r1", argv=("true",)).to_json()
    newer = json.dumps({**json.loads(text), "version": 2})
    with pytest.raises(UsageError, match="version 2") as info:
        LaunchSpec.from_json(newer)
    assert info.value.code == "launch-spec"
    odd = json.dumps({**json.loads(text), "watchers": {"gpu": {}}})
    with pytest.raises(UsageError, match="gpu"):
        LaunchSpec.from_json(odd)
    with pytest.raises(UsageError, match="one word"):
        LaunchSpec(rec="r/r 1", workdir=".", run_id="r1", argv=("true",))
    with pytest.raises(UsageError, match="one word"):
        LaunchSpec(rec="r/r*", workdir=".", run_id="r1", argv=("true",))
    LaunchSpec(rec="/scratch/u@x+y/.vmrun/runs/r1", workdir=".", run_id="r1", argv=("true",))


def test_a_spec_too_large_for_one_start_drops_the_diff_first() -> None:
    big = "x" * (130 << 10)
    spec = LaunchSpec(
        rec="r/r1",
        workdir=".",
        run_id="r1",
        argv=("true",),
        watchers=Watchers(provenance=Provenance("/py", big)),
    )
    sent = LaunchSpec.from_json(spec.header()[LAUNCH_VAR])
    assert sent.watchers.provenance == Provenance("/py", "")
    with pytest.raises(UsageError, match="over the"):
        LaunchSpec(rec="r/r1", workdir=".", run_id="r1", argv=("echo", big)).header()


def _start(home: Path, spec: LaunchSpec) -> int:
    """run_start.sh as the command wrapper runs it: the spec in its one variable."""
    lib = home / ".vmrun-lib"
    if not lib.exists():
        lib.symlink_to(install_hostlib(home))
    done = subprocess.run(
        ["sh", str(lib / "run_start.sh")],
        env={"PATH": os.environ["PATH"], "HOME": str(home), **spec.header()},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    made = tmp_path / "home"
    made.mkdir()
    yield made
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int((made / ".vmrun/runs" / RID / "pid").read_text()), signal.SIGKILL)


def _session(sid: int) -> dict[int, int]:
    """pid: parent pid of every process of the session."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    found[int(entry.name)] = int(fields[1])
    return found


def test_the_run_ends_recorded_as_before_and_its_secrets_stay_in_0600_files(home: Path) -> None:
    script = 'env > "$VMRUN_RUN_DIR/run-env.txt"; echo one; echo two; exit 3'
    spec = _spec(
        ("sh", "-c", script),
        home,
        env={"TOKEN": "t0k"},
        notify=Notify(json.dumps({"webhooks": [], "on": [], "hook": HOOK})),
    )
    pid = _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: (rec / "exit_code").exists(), 20, "the run's end")
    assert (rec / "exit_code").read_text() == "3\n"
    assert (rec / "pid").read_text() == f"{pid}\n" and (rec / "pid_start").read_text().strip()
    assert (rec / "log").read_text().startswith("one\ntwo\n")
    marks = (rec / "log.times").read_text().split("\n")
    assert marks[-2].split()[0] == "2"  # the last mark counts both lines
    assert json.loads((rec / "run.json").read_text()) == {"id": RID}
    assert stat.S_IMODE((rec / "notify.json").stat().st_mode) == 0o600
    assert HOOK in (rec / "notify.json").read_text()
    ran = (rec / "run-env.txt").read_text()
    assert "TOKEN=t0k" in ran and f"VMRUN_RUN_ID={RID}" in ran and f"VMRUN_RUN_DIR={rec}" in ran
    assert "VMRUN_BEAT_DIR=" in ran and "VMRUN_SNAPSHOT_SIGNAL=SIGUSR1" in ran
    assert LAUNCH_VAR not in ran and HOOK not in ran
    assert "VMRUN_REQUEUE_FILE" not in ran  # neither spot nor budget watched
    leaks = [p.name for p in rec.iterdir() if p.is_file() and HOOK in p.read_text()]
    assert leaks == ["notify.json"]


def _children(pid: int) -> set[int]:
    """The live children of `pid`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    found.add(int(entry.name))
    return found


def test_one_process_beside_the_training_tree_with_every_watcher_on(home: Path) -> None:
    """Hang, budget, spot and the bucket copy on: the command's session holds the command's
    tree, nothing else; the agent, in a session of its own, is the one process beside it
    (the copy's passes its short-lived children); neither its argv nor its environment
    holds a secret, nor the run's id (so a stop leaves it the copy's last pass)."""
    fake = home / "bin" / "rclone"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = version ] && echo "rclone v1.66.0"\nexit 0\n')
    fake.chmod(0o755)
    spec = _spec(
        ("sh", "-c", "sleep 30 & sleep 30; wait"),
        home,
        hang=Hang(600.0, "stop", False, sys.executable),
        budget=Budget(600.0, "$9"),
        spot=Spot(),
        store=Store("b/runs/r1", "s3://b/runs/r1", str(fake.parent / "python"), False, KEY),
        notify=Notify(json.dumps({"webhooks": [{"url": HOOK}]})),
    )
    pid = _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    command, _ = (rec / "session").read_text().split()
    wait_for(lambda: len(_session(int(command))) == 3, 20, "the command's three")
    members = _session(int(command))
    assert Path(f"/proc/{command}/cmdline").read_bytes().startswith(b"sh\0-c\0sleep 30")
    assert members[int(command)] == pid  # the agent's child, in a session of its own
    assert set(members) == {int(command)} | {p for p, up in members.items() if up == int(command)}
    wait_for(lambda: (rec / "store.json").exists(), 20, "the copier's state")
    # between the copy's passes the agent's one child is the command: nothing else lives
    wait_for(lambda: _children(pid) == {int(command)}, 20, "the agent's one child")
    assert set(_session(pid)) == {pid}
    own = Path(f"/proc/{pid}")
    for where in ("cmdline", "environ"):
        text = (own / where).read_bytes().decode(errors="replace")
        assert KEY not in text and HOOK not in text and LAUNCH_VAR not in text
    assert "run_agent.py" in (own / "cmdline").read_text()
    assert b"VMRUN_RUN_ID=" not in (own / "environ").read_bytes()
    assert (rec / "store.pid").read_text().split()[0] == str(pid)  # the agent copies
    command_env = Path(f"/proc/{command}/environ").read_bytes().decode().split("\0")
    assert f"VMRUN_RUN_ID={RID}" in command_env  # run_stop.sh finds the run's processes so


def test_a_stop_ends_the_command_and_the_agent_makes_the_last_pass(home: Path) -> None:
    """run_stop.sh stops the command's session; the agent, left alone, sends the record
    with the stop in it (the config gone after), and ends."""
    bucket = home / "bucket"
    fake = home / "bin" / "rclone"
    fake.parent.mkdir()
    fake.write_text(  # copy SRC store:DEST into $BUCKET; no object to `cat`; `rcat` one in
        '#!/bin/sh\n[ "$1" = version ] && echo "rclone v1.66.0" && exit 0\n'
        "while [ $# -gt 0 ]; do case $1 in copy) src=$2 dest=$BUCKET/${3#store:}; shift 3 ;;\n"
        '  cat) exit 3 ;; rcat) f=$BUCKET/${2#store:}; mkdir -p "${f%/*}"; cat > "$f"; exit ;;\n'
        "  *) shift ;; esac; done\n"
        '[ -n "$src" ] && mkdir -p "$dest" && cp -r "$src/." "$dest"\n'
    )
    fake.chmod(0o755)
    spec = _spec(
        ("sh", "-c", "echo started; sleep 60"),
        home,
        store=Store("b/runs/r1", "s3://b/runs/r1", str(fake.parent / "python"), False, KEY),
        env={"BUCKET": str(bucket), "VMRUN_STORE_EVERY": "0.2", "VMRUN_STORE_LOGS_EVERY": "1"},
    )
    pid = _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: (bucket / "b/runs/r1/.vmrun/log").exists(), 20, "the first copy")
    lib = home / ".vmrun-lib"
    done = subprocess.run(
        ["sh", str(lib / "run_stop.sh"), ".vmrun/runs", RID, "500"],
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    left = done.stdout.split("LEFT")[-1].split()
    assert left == [] and str(pid) not in done.stdout.split("LEFT")[0]  # never the agent
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "the agent's end")
    assert (bucket / "b/runs/r1/.vmrun/stopped").read_text() == "user\n"
    assert (bucket / "b/runs/r1/.vmrun/exit_code").read_text() == "143\n"
    assert json.loads((rec / "store.json").read_text())["state"] == "done"
    assert not [p for p in rec.iterdir() if p.name.startswith("store.") and p.name != "store.json"]


def test_a_hang_is_found_and_stopped_by_the_agent(home: Path) -> None:
    rank = "import time; print('started', flush=True); time.sleep(60)"
    spec = _spec((sys.executable, "-c", rank), home, hang=Hang(1.0, "stop", False, sys.executable))
    pid = _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: (rec / "exit_code").exists(), 40, "the run stopped by its hang watcher")
    assert (rec / "exit_code").read_text() == "124\n"  # as timeout(1) says it
    hang = json.loads((rec / "hang").read_text())
    assert (hang["action"], hang["timeout"]) == ("stop", 1.0)
    assert (rec / "hang_stopped").exists()
    (taken,) = (rec / "stacks" / "hang-1").glob("rank-*.json")
    assert json.loads(taken.read_text())["pid"] != pid  # the rank, never the agent
    assert "no progress for" in (rec / "log").read_text()


def test_at_its_cap_the_agent_stops_a_run_that_catches_nothing_recorded_as_stopped(
    home: Path,
) -> None:
    spec = _spec(
        ("sh", "-c", "echo started; sleep 60"),
        home,
        budget=Budget(0.2, "$1.00"),
        env={"VMRUN_BUDGET_STARTING_S": "0.5", "VMRUN_BUDGET_GRACE_S": "0.5"},
    )
    pid = _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, "the agent's end")
    assert (rec / "stopped").read_text() == "budget\n"
    assert not (rec / "exit_code").exists()  # stopped, as by the user
    assert json.loads((rec / "budget").read_text())["cap"] == "$1.00"


RANK = """
import os, pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(os.environ["VMRUN_REQUEUE_FILE"]).write_text("snapshot\\n")
    sys.exit(0)
signal.signal(signal.SIGUSR2, stop)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def metadata(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    state = tmp_path / "imds.json"
    state.write_text("{}")
    server = subprocess.Popen(
        [sys.executable, str(IMDS), "127.0.0.1", str(port), str(state), str(tmp_path / "imds")],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"listening\n"
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.kill()
        server.wait()


def test_a_spot_notice_stops_the_run_after_its_snapshot_to_go_on_elsewhere(
    home: Path, metadata: tuple[str, Path]
) -> None:
    url, state = metadata
    spec = _spec(
        (sys.executable, "-c", RANK),
        home,
        spot=Spot(),
        env={"VMRUN_IMDS": url, "VMRUN_SPOT_EVERY": "0.1"},
    )
    _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: "ready" in (rec / "log").read_text(), 20, "the rank's handler")
    state.write_text(json.dumps({"instance-action": {"action": "terminate", "time": "soon"}}))
    wait_for(lambda: (rec / "exit_code").exists(), 20, "the run's end")
    assert (rec / "exit_code").read_text() == "75\n"  # to go on elsewhere
    assert json.loads((rec / "notice").read_text())["kind"] == "interruption"


def test_lines_added_beside_the_run_stay_in_its_log(home: Path) -> None:
    """The command writes its log appending (O_APPEND), as the watchers and the copier do:
    a line of theirs between two of the run's is kept, not overwritten."""
    gate = home / "gate"
    script = f'echo one; while [ ! -e "{gate}" ]; do sleep 0.05; done; echo two'
    _start(home, _spec(("sh", "-c", script), home))
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: (rec / "log").read_text() == "one\n", 20, "the run's first line")
    with open(rec / "log", "a") as log:
        log.write("vmrun: a watcher's line\n")
    gate.touch()
    wait_for(lambda: (rec / "exit_code").exists(), 20, "the run's end")
    assert (rec / "log").read_text() == "one\nvmrun: a watcher's line\ntwo\n"


def test_the_host_refuses_a_spec_of_another_version_and_starts_nothing(home: Path) -> None:
    lib = install_hostlib(home)
    text = json.dumps({**json.loads(_spec(("true",), home).to_json()), "version": 99})
    done = subprocess.run(
        ["sh", str(lib / "run_start.sh")],
        env={"PATH": os.environ["PATH"], "HOME": str(home), LAUNCH_VAR: text},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 125 and "launch spec version 99, not 1" in done.stderr
    assert not (home / ".vmrun" / "runs" / RID).exists()


def test_a_host_side_file_in_the_command_is_the_homes_whatever_the_work_directory(
    home: Path,
) -> None:
    """A run in an image starts container_run.sh by its path from the home: the work
    directory is elsewhere."""
    work = home / "work"
    work.mkdir()
    spec = _spec(("sh", hostside.path("run_alive.sh")), home)
    spec = LaunchSpec.from_json(spec.to_json().replace(f'"{home}"', f'"{work}"'))
    assert spec.workdir == str(work)
    _start(home, spec)
    rec = home / ".vmrun/runs" / RID
    wait_for(lambda: (rec / "exit_code").exists(), 20, "the run's end")
    assert (rec / "exit_code").read_text() == "0\n", (rec / "log").read_text()
