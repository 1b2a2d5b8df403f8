"""vmrun.gpus (nvidia_smi, fleet): parsing nvidia-smi's CSV, batching its streams, the fleet
model, the remote watch script (run here by a real bash, with the nvidia-smi STAND-IN), and
the table's cells and width."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, install_hostlib, local_argv, wait_for

from vmrun.gpus import nvidia_smi as gpus
from vmrun.gpus.fleet import Fleet, HostSample
from vmrun.gpus.nvidia_smi import (
    APP_FIELDS,
    GPU_FIELDS,
    GpuBatcher,
    GpuProcess,
    GpuReading,
    ProcessTracker,
    parse_app_line,
    parse_gpu_line,
    parse_owner_line,
    watch_argv,
)

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
STANDIN = ROOT / "tests" / "standins" / "nvidia-smi"


def frames(fixture: str, query: str) -> list[list[str]]:
    """A recording's iterations, each a list of CSV rows (see tests/standins/nvidia-smi)."""
    out: list[list[str]] = [[]]
    for line in (FIXTURES / fixture / f"{query}.txt").read_text().splitlines():
        if line.strip() == "---":
            out.append([])
        elif line.strip() and not line.startswith("#"):
            out[-1].append(line)
    return out


def recorded_fields(path: Path) -> list[tuple[str, ...]]:
    return [
        tuple(line.split(":", 1)[1].strip().split(","))
        for line in path.read_text().splitlines()
        if line.startswith("# fields:")
    ]


def test_fixtures_are_recorded_with_the_fields_vmrun_asks_for() -> None:
    recorded = [fixture for fixture in FIXTURES.iterdir() if fixture.is_dir()]
    assert recorded, f"no nvidia-smi recording under {FIXTURES}: nothing was checked"
    for fixture in recorded:
        assert recorded_fields(fixture / "query-gpu.txt") == [GPU_FIELDS]
        assert recorded_fields(fixture / "query-compute-apps.txt") == [APP_FIELDS]


def test_t4_rows_parse_to_the_seed_tables_values() -> None:
    gpu0, gpu1 = (parse_gpu_line(row) for row in frames("t4x2_training", "query-gpu")[0])
    assert gpu0 == GpuReading(
        count=2,
        index=0,
        uuid="GPU-5d0c1a47-2f1e-7a3b-9c64-0e8f2d1b7a11",
        name="Tesla T4",
        utilization=93.0,
        memory_used=2389.0,
        memory_total=15360.0,
        temperature=38.0,
        power_draw=49.0,
        power_limit=70.0,
    )
    assert gpu1 is not None and (gpu1.index, gpu1.memory_used, gpu1.power_draw) == (1, 1067, 53)
    rows = [parse_app_line(row) for row in frames("t4x2_training", "query-compute-apps")[0]]
    assert [(p.pid, p.memory_used) for _, p in filter(None, rows)] == [
        (2312, 1324.0),
        (2381, 1042.0),
        (2383, 1042.0),
    ]


def test_unavailable_fields_become_none_and_names_keep_their_commas() -> None:
    lines = [
        line
        for line in (FIXTURES / "na_fields.csv").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    a100 = parse_gpu_line(lines[0])
    gtx = parse_gpu_line(lines[1])
    assert a100 is not None and a100.utilization is None and a100.power_draw == 43.76
    assert a100.name == "NVIDIA A100-PCIE-40GB"
    assert gtx is not None and gtx.name == "NVIDIA GeForce GTX 1060 6GB"
    assert (gtx.utilization, gtx.power_draw, gtx.power_limit) == (None, None, None)
    assert gtx.memory_used == 1435.0
    first = parse_app_line(lines[2])
    second = parse_app_line(lines[3])
    assert first is not None and first[1].memory_used is None and first[1].pid == 4321
    assert second is not None and second[1].name == "/opt/app/run, a, b.sh"
    assert first[0] == second[0] == "2024/03/02 10:11:12.345"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "count, index, uuid, utilization.gpu [%], memory.used [MiB], memory.total [MiB],"
        " temperature.gpu, power.draw [W], power.limit [W], name",
    ],
)
def test_lines_that_are_not_rows_are_ignored(line: str) -> None:
    assert parse_gpu_line(line) is None
    assert parse_app_line(line) is None


def test_the_batcher_cuts_the_stream_into_iterations() -> None:
    batcher = GpuBatcher()
    rows = [row for frame in frames("t4x2_training", "query-gpu") for row in frame]
    batches = [b for row in rows for b in batcher.feed(row + "\n")]
    assert [[r.index for r in b] for b in batches] == [[0, 1]] * 4
    assert [b[0].utilization for b in batches] == [93, 97, 88, 100]
    # a GPU whose row is an error line: the next iteration still starts a new batch
    gpu0, gpu1 = frames("t4x2_training", "query-gpu")[0]
    assert batcher.feed(gpu0) == []
    assert batcher.feed("Unable to determine the device handle for GPU 1: GPU is lost") == []
    (partial,) = batcher.feed(gpu0)
    assert [r.index for r in partial] == [0]
    assert [[r.index for r in b] for b in batcher.feed(gpu1)] == [[0, 1]]
    single = frames("t4_idle", "query-gpu")[0][0]
    assert [len(b) for b in GpuBatcher().feed(single)] == [1]


def test_the_process_tracker_keeps_the_latest_iteration_while_fresh() -> None:
    uuid = "GPU-5d0c1a47-2f1e-7a3b-9c64-0e8f2d1b7a11"
    tracker = ProcessTracker(max_age=3.5)
    assert tracker.current(0.0) == ()
    tracker.feed(f"2024/01/01 00:00:00.000, {uuid}, 11, 100, python", 10.0)
    tracker.feed(f"2024/01/01 00:00:00.000, {uuid}, 12, 100, python", 10.0)
    assert [p.pid for p in tracker.current(11.0)] == [11, 12]
    tracker.feed(f"2024/01/01 00:00:02.000, {uuid}, 12, 100, python", 12.0)  # 11 has left
    assert [p.pid for p in tracker.current(13.0)] == [12]
    assert tracker.current(15.4) != () and tracker.current(15.6) == ()  # nothing since: none


def test_owner_lines_map_pids_to_runs() -> None:
    assert parse_owner_line("501 r-1\n") == (501, "r-1")
    assert parse_owner_line("502 \n") == (502, None)  # read, but not a vmrun run's process
    assert parse_owner_line("503 bad id\n") == (503, None)
    assert parse_owner_line("x r-1\n") is None


def test_loop_arguments() -> None:
    assert gpus.loop_arg(2) == "--loop=2"
    assert gpus.loop_arg(0.25) == "--loop-ms=250"
    once = watch_argv("nvidia-smi", None)
    assert once[0] == "bash" and once[-1] == "--format=csv,noheader,nounits"
    assert watch_argv("nvidia-smi", 2)[-2:] == ["--format=csv,noheader,nounits", "--loop=2"]


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_watch_script_is_shellcheck_clean_bash() -> None:
    """It needs bash (its header says why), so CI's `shellcheck --shell=sh` on *.sh skips it."""
    script = ROOT / "vmrun" / "hostside" / "gpus_watch.bash"
    proc = subprocess.run(
        ["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


def _standin(home: Path, fixture: str, apps: str | None = None) -> Path:
    """The nvidia-smi STAND-IN at ~/bin/nvidia-smi replaying `fixture`; returns its replay."""
    bin_dir = home / "bin"
    replay = bin_dir / "nvidia-smi-replay"
    replay.mkdir(parents=True)
    shutil.copy(STANDIN, bin_dir / "nvidia-smi")
    for item in (FIXTURES / fixture).iterdir():
        shutil.copy(item, replay / item.name)
    if apps is not None:
        (replay / "query-compute-apps.txt").write_text(apps)
    return replay


def _watch(home: Path, nvidia_smi: str, interval: float | None) -> subprocess.Popen[str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    install_hostlib(home)
    return subprocess.Popen(
        local_argv(watch_argv(nvidia_smi, interval), home),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as under vmrun's wrapper: one group, killed as one
    )


def _reap(proc: subprocess.Popen[str] | None) -> None:
    """After a failure: kill a watch script still running, with its group, and wait for it."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_watch_script_streams_devices_and_tagged_processes_with_owners(
    tmp_path: Path,
) -> None:
    """Once mode, run here by bash: device rows on stdout as nvidia-smi wrote them; process
    rows tagged on stderr, each new pid preceded by its owner, read from a real process's
    /proc/PID/environ (one marked as run "run-7", one that is not, one that does not exist)."""
    marked = subprocess.Popen(
        ["sleep", "60"], env={"PATH": "/usr/bin:/bin", "VMRUN_RUN_ID": "run-7"}
    )
    plain = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin"})
    proc = None
    try:
        apps = (FIXTURES / "t4x2_training" / "query-compute-apps.txt").read_text()
        apps = apps.replace(", 2312, ", f", {marked.pid}, ").replace(", 2381, ", f", {plain.pid}, ")
        replay = _standin(tmp_path, "t4x2_training", apps)
        proc = _watch(tmp_path, "~/bin/nvidia-smi", None)
        out, err = proc.communicate(timeout=30)
    finally:
        _reap(proc)
        for sleeper in (marked, plain):
            sleeper.kill()
            sleeper.wait()
    assert proc.returncode == 0, err
    assert out.splitlines() == frames("t4x2_training", "query-gpu")[0]
    lines = err.splitlines()
    owners = [parse_owner_line(x.split(" ", 1)[1]) for x in lines if x.startswith("vmrun-owner ")]
    assert owners == [(marked.pid, "run-7"), (plain.pid, None), (2383, None)]
    rows = [x.split(" ", 1)[1] for x in lines if x.startswith("vmrun-app ")]
    assert [p.pid for _, p in filter(None, map(parse_app_line, rows))] == [
        marked.pid,
        plain.pid,
        2383,
    ]
    assert len(lines) == 6  # nothing else: no complaint from the shell
    assert lines[0].startswith(f"vmrun-owner {marked.pid} ")  # an owner before its row
    started = [line.split(" ", 2)[1] for line in (replay / "starts.log").read_text().splitlines()]
    assert sorted(q.split("=")[0] for q in started) == ["--query-compute-apps", "--query-gpu"]


def test_the_watch_script_loops_without_starting_anything_per_refresh(tmp_path: Path) -> None:
    """Live mode: iterations keep coming from the same two nvidia-smi processes; an owner is
    reported once per pid, not per iteration; a killed group leaves nothing behind."""
    replay = _standin(tmp_path, "t4x2_training")
    proc = _watch(tmp_path, "~/bin/nvidia-smi", 0.1)
    try:
        assert proc.stdout is not None
        rows = [proc.stdout.readline() for _ in range(2 * 8)]  # 8 iterations of 2 GPUs
        utils = [r.utilization for r in map(parse_gpu_line, rows[::2]) if r is not None]
        assert utils == [93, 97, 88, 100, 93, 97, 88, 100]
        children = _children(proc.pid)
        assert len(children) == 2  # the two nvidia-smi, however many refreshes
        assert len((replay / "starts.log").read_text().splitlines()) == 2
    finally:
        os.killpg(proc.pid, 15)
        _, err = proc.communicate(timeout=10)
    owner_lines = [x for x in err.splitlines() if x.startswith("vmrun-owner ")]
    assert sorted(owner_lines) == ["vmrun-owner 2312 ", "vmrun-owner 2381 ", "vmrun-owner 2383 "]
    assert sum(x.startswith("vmrun-app ") for x in err.splitlines()) >= 3 * 4
    wait_for(lambda: not any(map(_alive, children)), 10, "both nvidia-smi to stop")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_the_watch_script_ends_when_the_device_query_fails(tmp_path: Path) -> None:
    """Its exit status is the devices query's: nvidia-smi missing (127), or the driver not
    loaded (9) while the processes query goes on printing nothing (no process holds a GPU):
    the script notices within its 2 s read timeout and stops that query too."""
    missing = _watch(tmp_path, "no-such-nvidia-smi", 1)
    try:
        _, err = missing.communicate(timeout=30)
    finally:
        _reap(missing)
    assert missing.returncode == 127, err
    silent = (FIXTURES / "t4_idle" / "query-compute-apps.txt").read_text()
    replay = _standin(tmp_path, "driver_not_loaded", silent)
    started = time.monotonic()
    broken = _watch(tmp_path, "~/bin/nvidia-smi", 0.2)
    try:
        out, err = broken.communicate(timeout=30)
    finally:
        _reap(broken)
    assert broken.returncode == 9, err
    assert out.startswith("NVIDIA-SMI has failed")
    # its 2 s read timeout decides; unnoticed, the processes query would go on until
    # communicate's 30 s. 2 + 10 s: room for a loaded 2-core machine
    assert time.monotonic() - started < 2 + 10
    apps = [
        int(line.split()[0])
        for line in (replay / "starts.log").read_text().splitlines()
        if "--query-compute-apps" in line
    ]
    assert len(apps) == 1
    assert not _alive(apps[0])  # the script waited for it


def _reading(uuid: str, util: float | None, index: int = 0) -> GpuReading:
    return GpuReading(2, index, uuid, "Tesla T4", util, 100, 15360, 40, 30, 70)


def test_idle_alert_needs_a_run_low_use_and_the_whole_window() -> None:
    fleet = Fleet(["a"], idle_threshold=10, idle_window=5)
    held = (GpuProcess("G0", 1, "python", 100, run="r-1"),)

    def sample(t: float, util: float | None, procs: tuple[GpuProcess, ...] = held) -> tuple:
        status = fleet.update(HostSample("a", "ok", t, (_reading("G0", util),), procs))
        (gpu,) = status.gpus
        return gpu.idle_for, gpu.alert

    assert sample(100, 3) == (0, False)
    assert sample(104, 9.9) == (4, False)
    assert sample(105, 0) == (5, True)
    assert sample(106, 10) == (None, False)  # busy enough again: the window starts over
    assert sample(107, 0) == (0, False)
    assert sample(108, None) == (None, False)  # unknown utilisation is not idleness
    assert sample(120, 0, ()) == (None, False)  # nobody holds it: idle is just idle
    status = fleet.statuses()[0]
    assert status.gpus[0].history[-3:] == (0, None, 0)
    # a process that is no vmrun run's (a notebook, another user's job) never starts a window
    other = (GpuProcess("G0", 2, "jupyter", 100),)
    assert [sample(t, 0, other) for t in (200, 300, 400)] == [(None, False)] * 3
    assert sample(401, 0, (*other, *held)) == (0, False)  # a run joins: now it counts


def test_statuses_keep_host_order_and_json_maps_processes_to_gpus() -> None:
    fleet = Fleet(["b", "a", "c"], idle_threshold=10, idle_window=60)
    procs = (GpuProcess("G1", 7, "python", 5, run="r1"), GpuProcess("MIG-x", 8, "x", None))
    fleet.update(HostSample("a", "ok", 1.0, (_reading("G0", 50), _reading("G1", 60, 1)), procs))
    fleet.update(HostSample("b", "no-gpu", 2.0, message="no NVIDIA driver", exit_code=14))
    hosts = [(s.sample.host, s.sample.state) for s in fleet.statuses()]
    assert hosts == [("b", "no-gpu"), ("a", "ok"), ("c", "connecting")]
    assert fleet.exit_code() == 14
    doc = fleet.statuses()[1].to_json()
    assert [p["gpu_index"] for p in doc["processes"]] == [1, None]
    assert doc["processes"][0] == {
        "gpu_index": 1,
        "gpu_uuid": "G1",
        "pid": 7,
        "name": "python",
        "memory_used_mib": 5,
        "run": "r1",
    }
    assert set(doc) == {
        "host",
        "time",
        "state",
        "message",
        "code",
        "error",
        "gpus",
        "processes",
        "autostop",
    }
    assert doc["autostop"] is None  # no watchdog on the host


# -- the table (rich is fine to import here: this is not the CLI's start-up) ---------------


def _styles(text: object) -> set[str]:
    return {str(span.style) for span in text.spans}  # type: ignore[attr-defined]


def test_cells_colour_hot_full_and_idle_gpus() -> None:
    from vmrun.cli.gpus_view import _gpu_cells, short_gpu_name, sparkline

    fleet = Fleet(["h"], idle_threshold=10, idle_window=0)
    rows = frames("h100x2_constructed", "query-gpu")[0]
    readings = tuple(filter(None, map(parse_gpu_line, rows)))
    status = fleet.update(HostSample("h", "ok", 1.0, readings))
    name, util, memory, temp, power, _ = _gpu_cells(status.gpus[0], 8, False)
    assert name.plain == "0 H100 80GB HBM3" and util.plain == "100%        █"
    assert "bold red" in _styles(memory) and "bold red" in _styles(temp)  # 98.7 %, 87 C
    assert "yellow" in _styles(power) and "green" in _styles(util)
    cool = _gpu_cells(status.gpus[1], 0, False)
    assert cool[1].plain == "100%" and "bold red" not in _styles(cool[3])  # 71 C

    run = (GpuProcess("G0", 9, "/x/python", 2048, run="r-1"),)
    idle = fleet.update(HostSample("h", "ok", 2.0, (_reading("G0", 2),), run))
    cells = _gpu_cells(idle.gpus[0], 0, False)
    assert "bold white on red" in _styles(cells[1])
    assert cells[5].plain == "9 python 2.0G [r-1]"
    assert sparkline([0, 50, 100, None], 5) == " ▁▅█ "
    assert sparkline([0, 50, 100], 3, ascii_only=True) == "_=#"
    assert short_gpu_name("Tesla T4") == "T4" and short_gpu_name("A100") == "A100"


@pytest.mark.parametrize("width", [80, 120])
def test_the_table_fits_the_terminal(width: int) -> None:
    from rich.console import Console

    from vmrun.cli.gpus_view import render

    long = "gpu-node-with-a-long-name (job 123 / run x)"
    hosts = [long, "b", "lost", "never"]
    fleet = Fleet(hosts, idle_threshold=10, idle_window=60)
    fleet.update(HostSample("lost", "disconnected", 1.0, message="link down; retrying in 4 s"))
    fleet.update(HostSample("never", "unreachable", 1.0, message="connection refused"))
    for fixture, host in (
        ("h100x2_constructed", long),
        ("t4x2_training", "b"),
    ):
        readings = tuple(filter(None, map(parse_gpu_line, frames(fixture, "query-gpu")[0])))
        apps = [parse_app_line(r) for r in frames(fixture, "query-compute-apps")[0]]
        procs = tuple(p for _, p in filter(None, apps))
        fleet.update(HostSample(host, "ok", 1.0, readings, procs))
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render(fleet.statuses(), console, 10, interval=2))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    assert sum("H100" in line for line in lines) == 2 and sum(" T4 " in line for line in lines) == 2
    cap = 32 if width >= 120 else 16
    assert any(line.startswith(long[: cap - 1] + "…") for line in lines)  # capped host column
    assert any(line.startswith("lost") and " disconnected " in line for line in lines)
    assert any(line.startswith("never") and " unreachable " in line for line in lines)


def test_a_host_that_stops_sending_is_marked_stale() -> None:
    from rich.console import Console

    from vmrun.cli.gpus_view import render

    fleet = Fleet(["a", "b"], idle_threshold=10, idle_window=60)
    fleet.update(HostSample("a", "ok", time.time() - 30, (_reading("G0", 50),)))
    fleet.update(HostSample("b", "ok", time.time(), (_reading("G1", 50),)))
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    console.print(render(fleet.statuses(), console, 10, interval=2))
    text = console.export_text()
    assert "? a: no new sample for 30 s" in text and "? b:" not in text


def test_64_hosts_of_8_gpus_fit_a_terminal_one_row_a_host_news_first() -> None:
    """512 GPUs in a 40-line terminal: one row per host, as many as fit, the hosts not
    answering first, then the least busy; the rest counted in one line, never scrolled."""
    from rich.console import Console

    from vmrun.cli.gpus_view import render

    hosts = [f"g{i:02d}" for i in range(64)]
    fleet = Fleet(hosts, idle_threshold=10, idle_window=60)
    now = time.time()
    for i, host in enumerate(hosts):
        if host == "g40":
            fleet.update(HostSample(host, "unreachable", now, message="connection refused"))
            continue
        util = 3.0 if host == "g17" else 60.0 + (i % 30)
        readings = tuple(_reading(f"{host}-{k}", util, index=k) for k in range(8))
        fleet.update(HostSample(host, "ok", now, readings))
    console = Console(width=120, height=40, record=True, file=io.StringIO(), color_system=None)
    console.print(render(fleet.statuses(), console, 10, interval=2, room=40))
    lines = console.export_text().splitlines()
    assert len(lines) <= 40
    rows = [line.split()[0] for line in lines[2:] if line[:1] == "g"]
    assert rows[:2] == ["g40", "g17"]  # not answering, then the least busy
    assert len(rows) == len(set(rows)) == 36
    assert any(line.startswith("g17") and "8x T4" in line and "3% " in line for line in lines)
    assert f"+ {64 - 36} more host(s) not shown (all answering; every GPU on them" in lines[-1]
    assert len(render(fleet.statuses(), console, 10, interval=2).renderables[1].rows) == 8 * 63 + 1  # type: ignore[attr-defined]
