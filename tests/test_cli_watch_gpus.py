"""`vmrun watch-gpus` end to end: the real CLI against real sshd test hosts.

The test hosts have no GPU, so `nvidia-smi` is the one STAND-IN (tests/standins/nvidia-smi):
it replays recorded CSV (tests/fixtures/nvidia_smi) at the interval asked for, and logs
every start with its pid, which is how these tests count remote processes and check that
none is left behind. sshd's log counts the connections and channels.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Client, place_hostlib, user_commands, wait_for
from testbed import NetnsBed, TestHost

from vmrun.gpus.nvidia_smi import HEARTBEAT

STANDIN = ROOT / "tests" / "standins" / "nvidia-smi"
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
HOSTS = ("h1", "h2", "h3")


def _wipe(host: TestHost) -> None:
    """Remove every stand-in these tests install (other tools in ~/.vmrun/bin stay)."""
    shutil.rmtree(host.home / "bin", ignore_errors=True)
    vmrun_bin = host.home / ".vmrun" / "bin"
    shutil.rmtree(vmrun_bin / "nvidia-smi-replay", ignore_errors=True)
    (vmrun_bin / "nvidia-smi").unlink(missing_ok=True)


@pytest.fixture
def hosts(bed: NetnsBed) -> Iterator[dict[str, TestHost]]:
    """h1-h3 with no stand-in before and after each test."""
    chosen = {name: bed[name] for name in HOSTS}
    for host in chosen.values():
        _wipe(host)
    yield chosen
    for host in chosen.values():
        _wipe(host)


def _chown_tree(path: Path, host: TestHost) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, host.uid, host.gid)


def install(host: TestHost, fixture: str, *, apps: str | None = None, bin_dir: str = "bin") -> Path:
    """The stand-in at ~/BIN_DIR/nvidia-smi replaying `fixture`; returns its replay directory."""
    where = host.home / bin_dir
    host.run(["mkdir", "-p", str(where)], as_user=True)  # owned by the host's user
    replay = where / "nvidia-smi-replay"
    replay.mkdir()
    shutil.copy(STANDIN, where / "nvidia-smi")
    for item in (FIXTURES / fixture).iterdir():
        shutil.copy(item, replay / item.name)
    if apps is not None:
        (replay / "query-compute-apps.txt").write_text(apps)
    (replay / "starts.log").touch()
    _chown_tree(replay, host)
    os.chown(where / "nvidia-smi", host.uid, host.gid)
    return replay


def starts(replay: Path) -> list[tuple[int, str]]:
    """(pid, arguments) of every streaming stand-in start so far (not the health reads'
    `nvidia-smi -q`, once a minute: health_reads)."""
    lines = replay.joinpath("starts.log").read_text().splitlines()
    found = [(int(pid), args) for pid, _, args in (line.partition(" ") for line in lines)]
    return [(pid, args) for pid, args in found if args != "-q"]


def health_reads(replay: Path) -> int:
    lines = replay.joinpath("starts.log").read_text().splitlines()
    return sum(1 for line in lines if line.partition(" ")[2] == "-q")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def assert_nothing_left(host: TestHost, replay: Path | None) -> None:
    """No stand-in process and no wrapper around one is left on the host."""
    pids = [pid for pid, _ in starts(replay)] if replay else []
    wait_for(
        lambda: (
            not any(alive(p) for p in pids)
            and not any("nvidia-smi" in c for c in user_commands(host))
        ),
        30,
        f"every nvidia-smi process on {host.name} to stop",
    )


def project(client: Client, standins: dict[str, bool]) -> None:
    """vmrun.toml: these hosts, in this order; `nvidia_smi` pointed at the stand-in where True."""
    blocks = []
    for name, standin in standins.items():
        block = f'[[hosts]]\naddress = "{name}"\n'
        if standin:
            block += 'nvidia_smi = "~/bin/nvidia-smi"\n'
        blocks.append(block)
    (client.cwd / "vmrun.toml").write_text("\n".join(blocks))


def accepted(host: TestHost) -> int:
    """SSH connections the host's sshd has accepted so far."""
    return host.sshd_log().count("Accepted publickey")


def sessions(host: TestHost) -> int:
    """Session channels (remote commands) the host's sshd has started so far."""
    return host.sshd_log().count("Starting session")


class JsonReader:
    """Reads a running `vmrun watch-gpus --json` line by line, with deadlines."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.seen: list[dict[str, Any]] = []

    def until(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()  # the CLI prints a line per sample, at least
            if not line:
                break
            sample = json.loads(line)
            self.seen.append(sample)
            if predicate(sample):
                return sample
        pytest.fail(f"no sample with {what} within {timeout:g} s; last: {self.seen[-3:]}")

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C, as a user ends a watch; the exit code and stderr."""
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, err


@pytest.fixture
def watch(bed_client: Client) -> Iterator[Any]:
    """Starts `vmrun watch-gpus --json ...`; whatever happens, the process is stopped by PID."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> JsonReader:
        proc = bed_client.popen("watch-gpus", "--json", *args)
        procs.append(proc)
        return JsonReader(proc)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _squeeze(text: str) -> str:
    return " ".join(text.split())


def test_once_table_piped_keeps_whole_rows_and_names_hosts_without_gpus(
    hosts: dict[str, TestHost], bed_client: Client
) -> None:
    """Into a pipe (COLUMNS set or not) no row is cut or wrapped: grep sees whole rows."""
    replay = install(hosts["h1"], "t4x2_training")
    install(hosts["h3"], "driver_not_loaded")
    project(bed_client, {"h1": True, "h2": False, "h3": True})
    place_hostlib(hosts["h1"])  # as an earlier command leaves it: h1's sessions are the watch's
    channels = sessions(hosts["h1"])
    done = bed_client.vmrun("watch-gpus", "--once", env={"COLUMNS": "80"})
    assert done.returncode == 14, done.stderr  # hosts without a usable GPU: "remote" failure
    lines = done.stdout.splitlines()
    assert "…" not in done.stdout
    rows = [re.sub(r"\s+", " ", line).strip() for line in lines]
    assert rows[0].startswith("vmrun watch-gpus 3 host(s) 2 GPU(s) snapshot")
    assert rows[1] == "host gpu util memory temp power processes"
    # rows in host order, GPUs by index; values from the seed's T4 table
    assert rows[2] == "h1 0 T4 93% 2.3/15.0G 38C 49/70W 2312 python 1.3G"
    assert rows[3] == "2381 python 1.0G"  # a second process on GPU 0: a line of its own
    assert rows[4] == "1 T4 93% 1.0/15.0G 36C 53/70W 2383 python 1.0G"
    text = _squeeze(done.stdout)
    whole = "h2 no GPU no NVIDIA driver: nvidia-smi not found (or set nvidia_smi in vmrun.toml)"
    assert whole in rows, done.stdout
    assert "h3 no GPU no NVIDIA driver loaded (NVIDIA-SMI has failed" in text
    assert len(starts(replay)) == 2  # one --query-gpu and one --query-compute-apps ...
    assert all("--loop" not in args for _, args in starts(replay))
    # ... on one channel, beside one `nvidia-smi -q` for the GPUs' health
    assert health_reads(replay) == 1 and sessions(hosts["h1"]) - channels == 2
    assert_nothing_left(hosts["h1"], replay)


def test_a_sick_gpu_is_flagged_beside_its_use_and_memory(
    hosts: dict[str, TestHost], bed_client: Client
) -> None:
    """GPU 1 with a row remapping pending (`nvidia-smi -q` recorded on a real A100, from
    tests/fixtures/gpu_health, replayed by the stand-in): REMAP beside it, in the table and
    in --json, and a line below the table saying where to look."""
    replay = install(hosts["h1"], "t4x2_training")
    shutil.copy(
        ROOT
        / "tests"
        / "fixtures"
        / "gpu_health"
        / "nvsmi_q_a100x4_555.42.02_remap_pending_dram_ce.txt",
        replay / "q.txt",
    )
    _chown_tree(replay, hosts["h1"])
    project(bed_client, {"h1": True})
    done = bed_client.vmrun("watch-gpus", "--once", env={"COLUMNS": "120"})
    assert done.returncode == 0, done.stderr
    rows = [re.sub(r"\s+", " ", line).strip() for line in done.stdout.splitlines()]
    assert any(r.startswith("1 REMAP T4 93%") for r in rows), done.stdout
    assert any(r.startswith("h1 0 T4 93%") for r in rows), done.stdout
    assert "! h1 GPU 1: REMAP (`vmrun doctor -H h1`" in _squeeze(done.stdout), done.stdout
    as_json = bed_client.vmrun("watch-gpus", "--once", "--json")
    (h1,) = (json.loads(line) for line in as_json.stdout.splitlines())
    assert [g["health"] for g in h1["gpus"]] == [[], ["REMAP"]]


def test_once_piped_never_cuts_gpu_names(hosts: dict[str, TestHost], bed_client: Client) -> None:
    install(hosts["h1"], "h100x2_constructed")
    project(bed_client, {"h1": True})
    done = bed_client.vmrun("watch-gpus", "--once", env={"COLUMNS": "60"})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    gpus = [line for line in done.stdout.splitlines() if "H100" in line]
    assert len(gpus) == 2 and all("H100 80GB HBM3" in line for line in gpus), done.stdout


def test_once_json_one_object_per_host(hosts: dict[str, TestHost], bed_client: Client) -> None:
    install(hosts["h2"], "t4x2_training")
    project(bed_client, {"h2": True, "h1": False})
    done = bed_client.vmrun("watch-gpus", "--once", "--json")
    assert done.returncode == 14, done.stderr
    h2, h1 = (json.loads(line) for line in done.stdout.splitlines())
    assert (h2["host"], h2["state"], h2["message"], h2["code"]) == ("h2", "ok", None, None)
    assert abs(h2["time"] - time.time()) < 60
    assert h2["gpus"][0] == {
        "index": 0,
        "uuid": "GPU-5d0c1a47-2f1e-7a3b-9c64-0e8f2d1b7a11",
        "name": "Tesla T4",
        "utilization_pct": 93.0,
        "memory_used_mib": 2389.0,
        "memory_total_mib": 15360.0,
        "temperature_c": 38.0,
        "power_draw_w": 49.0,
        "power_limit_w": 70.0,
        "idle_for_s": None,
        "idle_alert": False,
        "health": [],
    }
    assert [g["index"] for g in h2["gpus"]] == [0, 1]
    assert [(p["gpu_index"], p["pid"], p["memory_used_mib"]) for p in h2["processes"]] == [
        (0, 2312, 1324.0),
        (0, 2381, 1042.0),
        (1, 2383, 1042.0),
    ]
    assert h2["processes"][1]["name"] == "/home/ucloud/miniconda3/envs/rapids/bin/python"
    assert (h1["host"], h1["state"], h1["gpus"], h1["code"]) == ("h1", "no-gpu", [], "no-gpu")
    assert h1["message"].startswith("no NVIDIA driver: nvidia-smi not found")


def test_live_json_streams_every_refresh_on_one_channel(
    hosts: dict[str, TestHost], bed_client: Client, watch: Any
) -> None:
    h1 = hosts["h1"]
    replay = install(h1, "t4x2_training")
    project(bed_client, {"h1": True})
    place_hostlib(h1)  # as an earlier command leaves it: h1's sessions are the watch's
    connections, channels = accepted(h1), sessions(h1)
    reader = watch("--interval", "0.2")
    reader.until(lambda s: s["state"] == "ok" and s["processes"], 20, "processes")
    baseline = set(h1.user_pids())
    seen = set(baseline)
    for _ in range(8):
        reader.until(lambda s: s["state"] == "ok", 5, "another sample")
        seen |= set(h1.user_pids())
    samples = [s for s in reader.seen if s["state"] == "ok"]
    assert len(samples) >= 9
    # consecutive samples are consecutive iterations of the replay: 93, 97, 88, 100, 93...
    cycle = [93.0, 97.0, 88.0, 100.0]
    utils = [s["gpus"][0]["utilization_pct"] for s in samples]
    first = cycle.index(utils[0])
    assert utils == [cycle[(first + i) % 4] for i in range(len(utils))]
    assert all(later["time"] > earlier["time"] for earlier, later in pairwise(samples))
    # the point of the design: one connection, one channel, the same processes throughout
    # (two nvidia-smi: one cannot stream both queries), however many samples
    started = starts(replay)
    queries = sorted(args.split("=")[0] for _, args in started)
    assert queries == ["--query-compute-apps", "--query-gpu"]
    assert all(args.endswith("--loop-ms=200") for _, args in started)
    assert all(alive(pid) for pid, _ in started)
    assert accepted(h1) - connections == 1
    # and one more channel for the GPUs' health when it starts (`nvidia-smi -q`, then once
    # a minute at most: HEALTH_EVERY)
    assert health_reads(replay) == 1 and sessions(h1) - channels == 2
    assert seen == baseline, user_commands(h1)  # no grep or anything per refresh
    code, err = reader.interrupt()
    assert code == 0 and err == ""
    assert_nothing_left(h1, replay)


def test_a_cut_link_shows_disconnected_then_reconnects(
    hosts: dict[str, TestHost], bed_client: Client, watch: Any
) -> None:
    h3 = hosts["h3"]
    replay = install(h3, "t4x2_training")
    project(bed_client, {"h3": True})
    reader = watch("--interval", "0.5")
    reader.until(lambda s: s["state"] == "ok", 20, "a first sample")
    h3.cut_link()
    try:
        cut = time.monotonic()
        lost = reader.until(lambda s: s["state"] == "disconnected", 30, "disconnected")
        # keepalive 1 s x 3 in the tests' settings: ~4 s; unnoticed, a cut lasts TCP's ~15 min
        # of retransmissions. 15 s: room for a loaded 2-core machine
        assert time.monotonic() - cut < 15
        assert lost["code"] == "connection-lost"
        assert lost["message"].endswith("while running nvidia-smi; retrying in 1 s")
        assert lost["gpus"] == []
    finally:
        h3.heal_link()
    reader.until(lambda s: s["state"] == "ok", 30, "samples again after the link healed")
    # a new pair of nvidia-smi on the new connection, and no more than that
    wait_for(lambda: len(starts(replay)) == 4, 10, "the second pair of nvidia-smi")
    code, err = reader.interrupt()
    assert code == 0 and err == ""
    # the first pair was cut off from its client: the host stops it once the link is back
    assert_nothing_left(h3, replay)


def test_a_watch_ended_while_the_link_is_down_leaves_nothing_on_the_host(
    hosts: dict[str, TestHost], bed_client: Client, watch: Any
) -> None:
    """No EOF can reach the host through a cut link: the heartbeat's silence stops its
    nvidia-smi, without waiting for the link to heal or sshd to give up on TCP."""
    h3 = hosts["h3"]
    replay = install(h3, "t4x2_training")
    project(bed_client, {"h3": True})
    reader = watch("--interval", "0.5")
    reader.until(lambda s: s["state"] == "ok", 20, "a first sample")
    wait_for(lambda: len(starts(replay)) == 2, 10, "both nvidia-smi started")
    pids = [pid for pid, _ in starts(replay)]
    assert all(alive(p) for p in pids)
    h3.cut_link()
    try:
        code, err = reader.interrupt()
        assert code == 0 and err == ""
        cut = time.monotonic()
        # silence for HEARTBEAT s, then TERM, KILL 5 s later; + 15 s: room for a loaded machine
        wait_for(lambda: not any(alive(p) for p in pids), HEARTBEAT + 5 + 15, "nvidia-smi to stop")
        print(f"nvidia-smi stopped {time.monotonic() - cut:.1f} s after the watch ended")
        assert not any("nvidia-smi" in c for c in user_commands(h3))
    finally:
        h3.heal_link()


def test_an_unreachable_host_is_retried_with_backoff(
    bed: NetnsBed, hosts: dict[str, TestHost], bed_client: Client, watch: Any
) -> None:
    install(hosts["h1"], "t4_idle")
    dead = bed["h1"].addr.rsplit(".", 1)[0] + ".251"
    project(bed_client, {"h1": True, f"nobody@{dead}": False})
    reader = watch("--interval", "1", "--connect-timeout", "1")
    first = reader.until(lambda s: s["host"] != "h1", 15, "the dead host's first failure")
    assert first["state"] == "unreachable" and first["code"] == "host-unreachable"
    assert first["message"].endswith("retrying in 1 s")
    second = reader.until(lambda s: s["host"] != "h1", 15, "its second failure")
    assert second["message"].endswith("retrying in 2 s")
    ok = [s for s in reader.seen if s["host"] == "h1" and s["state"] == "ok"]
    assert ok and ok[0]["gpus"][0]["temperature_c"] == 70.0  # the live host is not held up
    code, _ = reader.interrupt()
    assert code == 0


def test_idle_alert_for_a_gpu_a_run_holds_but_does_not_use(
    hosts: dict[str, TestHost], bed_client: Client, watch: Any
) -> None:
    """GPU 1 idles on h1 and h2. On h2 a vmrun run's process holds it: alert. On h1 a process
    that is no run's holds it (someone's notebook): never an alert, however long."""
    h1, h2 = hosts["h1"], hosts["h2"]
    stranger = h1.popen(["sleep", "300"], as_user=True)
    run = h2.popen(["sleep", "300"], as_user=True, env={"VMRUN_RUN_ID": "r-idle"})
    try:
        apps = (FIXTURES / "t4x2_dataloader" / "query-compute-apps.txt").read_text()
        install(h1, "t4x2_dataloader", apps=apps.replace(", 2313, ", f", {stranger.pid}, "))
        install(h2, "t4x2_dataloader", apps=apps.replace(", 2313, ", f", {run.pid}, "))
        project(bed_client, {"h1": True, "h2": True})
        reader = watch("--interval", "0.2", "--idle-window", "1")
        reader.until(
            lambda s: s["host"] == "h2" and s["state"] == "ok" and len(s["processes"]) == 2,
            20,
            "both of h2's GPUs held",
        )
        # the first sample that sees the run's GPU idle starts the window: no alert yet (the
        # sample the wait above returns may already be a window later on a loaded machine)
        first_idle = next(
            s["gpus"][1]
            for s in reader.seen
            if s["host"] == "h2" and s["state"] == "ok" and s["gpus"][1]["idle_for_s"] is not None
        )
        assert (first_idle["idle_for_s"], first_idle["idle_alert"]) == (0, False)
        alert = reader.until(
            lambda s: s["host"] == "h2" and s["state"] == "ok" and s["gpus"][1]["idle_alert"],
            10,
            "h2's alert",
        )
        assert alert["gpus"][1]["idle_for_s"] >= 1
        assert alert["gpus"][0]["idle_alert"] is False and alert["gpus"][0]["idle_for_s"] is None
        # h1 idles just as long, held by a process that is no run's
        begun = next(s["time"] for s in reader.seen if s["host"] == "h1" and s["processes"])
        # (a sample may miss a process whose line came late on a loaded machine: the
        # tracker forgets one unseen for 1.5 intervals; the next sample has it again)
        later = reader.until(
            lambda s: s["host"] == "h1" and len(s["processes"]) == 2 and s["time"] - begun >= 2,
            10,
            "h1 held for twice the window",
        )
        h1_held = [s for s in reader.seen if s["host"] == "h1" and s["processes"]]
        assert {(p["pid"], p["run"]) for p in later["processes"]} == {
            (2312, None),
            (stranger.pid, None),
        }
        assert all(s["gpus"][1]["utilization_pct"] < 10 for s in h1_held)  # idle all along
        assert not any(
            g["idle_alert"] or g["idle_for_s"] is not None for s in h1_held for g in s["gpus"]
        )
        code, _ = reader.interrupt()
        assert code == 0

        once = bed_client.vmrun(
            "watch-gpus", "--once", "--idle-window", "0", env={"COLUMNS": "100"}
        )
    finally:
        for proc in (stranger, run):
            proc.kill()
            proc.wait()
    assert once.returncode == 0, once.stderr
    assert "! h2 GPU 1: under 10% for 0 s while run r-idle holds it" in once.stdout
    assert "! h1" not in once.stdout and once.stdout.count("!") == 1


def test_nvidia_smi_found_on_the_hosts_path(
    hosts: dict[str, TestHost], bed_client: Client, watch: Any
) -> None:
    """No `nvidia_smi` in vmrun.toml: plain `nvidia-smi`, found on the remote PATH (here in
    ~/.vmrun/bin, which vmrun puts first on PATH for every remote command)."""
    h3 = hosts["h3"]
    replay = install(h3, "t4x2_training", bin_dir=".vmrun/bin")
    project(bed_client, {"h3": False})
    assert "nvidia_smi" not in (bed_client.cwd / "vmrun.toml").read_text()
    done = bed_client.vmrun("watch-gpus", "--once", "--json")
    assert done.returncode == 0, done.stderr
    sample = json.loads(done.stdout)
    assert (sample["host"], sample["state"]) == ("h3", "ok")
    assert [g["name"] for g in sample["gpus"]] == ["Tesla T4", "Tesla T4"]
    reader = watch("--interval", "0.2")
    reader.until(lambda s: s["state"] == "ok" and s["processes"], 20, "a live sample")
    live = [args for _, args in starts(replay) if "--loop" in args]
    assert len(live) == 2
    code, err = reader.interrupt()
    assert code == 0 and err == ""
    assert_nothing_left(h3, replay)


def test_gpu_processes_are_named_by_the_vmrun_run_that_owns_them(
    hosts: dict[str, TestHost], bed_client: Client
) -> None:
    h1 = hosts["h1"]
    # a real process on the host, marked the way `vmrun train` marks every process of a run
    run = h1.popen(["sleep", "300"], as_user=True, env={"VMRUN_RUN_ID": "r-42"})
    try:
        apps = (FIXTURES / "t4x2_training" / "query-compute-apps.txt").read_text()
        install(h1, "t4x2_training", apps=apps.replace(", 2312, ", f", {run.pid}, "))
        project(bed_client, {"h1": True})
        done = bed_client.vmrun("watch-gpus", "--once", "--json")
        table = bed_client.vmrun("watch-gpus", "--once", env={"COLUMNS": "100"})
    finally:
        run.kill()
        run.wait()
    assert done.returncode == 0, done.stderr
    owners = {p["pid"]: p["run"] for p in json.loads(done.stdout)["processes"]}
    assert owners == {run.pid: "r-42", 2381: None, 2383: None}
    assert f"{run.pid} python 1.3G [r-42]" in table.stdout


def test_json_into_a_reader_that_stops_early(
    hosts: dict[str, TestHost], bed_client: Client
) -> None:
    """`vmrun watch-gpus --json | head -n 3`: a quiet exit 0, and the host is cleaned up."""
    replay = install(hosts["h2"], "t4_idle")
    project(bed_client, {"h2": True})
    script = '"$@" | head -n 3; echo "vmrun exited $((PIPESTATUS[0]))" >&2'
    vmrun = [sys.executable, "-m", "vmrun", "watch-gpus", "--json", "--interval", "0.2"]
    done = subprocess.run(
        ["bash", "-c", script, "pipe", *vmrun],
        cwd=bed_client.cwd,
        env=bed_client.environ(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert len(done.stdout.splitlines()) == 3
    assert done.stderr == "vmrun exited 0\n"
    assert_nothing_left(hosts["h2"], replay)


def test_live_table_in_a_terminal_ends_cleanly_on_ctrl_c(
    hosts: dict[str, TestHost], bed_client: Client
) -> None:
    replay = install(hosts["h1"], "t4x2_training")
    project(bed_client, {"h1": True, "h2": False})
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmrun", "watch-gpus", "--interval", "0.2"],
        cwd=bed_client.cwd,
        env=bed_client.environ(TERM="xterm", COLUMNS="80", LINES="24"),
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    screen = b""

    def read_some() -> bool:
        nonlocal screen
        if select.select([leader], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):
                screen += os.read(leader, 65536)
        return True

    def plain() -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))

    try:
        # redrawn in place: the sparkline fills up as samples arrive
        wait_for(lambda: read_some() and "█" * 3 in plain(), 20, "a live table with history")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: read_some() and proc.poll() is not None, 20, "vmrun to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    assert proc.returncode == 0
    text = plain()
    assert "h1   0 T4" in text and "h2   no GPU" in text and "every 0.2 s" in text
    assert "\x1b[" in screen.decode(errors="replace")  # cursor control: a live redraw
    assert "Traceback" not in text and "error" not in text
    assert_nothing_left(hosts["h1"], replay)


def test_bad_input_is_one_line_exit_2_before_any_connection(client: Client) -> None:
    broken = '[[hosts]]\naddress = "u@h"\nnvidia_smi = 5\n'
    for args, toml, needle in (
        (["-H", "a@b", "--interval", "0"], "", "--interval must be at least 0.1"),
        (["-H", "a@b", "--idle-threshold", "101"], "", "--idle-threshold must be 0-100"),
        ([], broken, "vmrun.toml line 3: nvidia_smi of host #1 must be a path"),  # on load
    ):
        (client.cwd / "vmrun.toml").write_text(toml)
        done = client.vmrun("watch-gpus", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
