"""What the autostop watchdog costs a host: processes it starts per check, its CPU time, its
memory.

Goal (the autostop issue): one resident process, and nothing started more often than once
per check interval. The worst case is measured: a GPU host (the nvidia-smi STAND-IN replaying
idle T4s, so the watchdog alternates its devices and processes queries) with a process of a
vmrun run on a GPU (so the processes query's owner check runs `grep`), sessions counted (so
`who` runs every check), and a run record on the host. The watchdog is installed by the real
CLI on a netns test host (root only; see tests/testbed) with a long period (it never powers
off here) and `--interval` seconds between checks.

The processes it starts are counted by tracing its execve calls (`strace -f -p`, for
`--checks` intervals), each named by its program; without strace, by sampling the host
user's processes every 10 ms (short-lived ones can slip between samples: a lower bound).
CPU time is the watchdog's own plus its reaped children's (/proc/PID/stat), RSS its VmRSS.

    sudo python benchmarks/autostop.py [--interval 2] [--checks 30]

Measured on the 2-core development machine (--interval 2 --checks 30: 60 s, 29 checks,
strace): 1 resident process (sh, RSS 1.8 MiB); per check exactly 1 `sleep`, 1 `who`, 1
`nvidia-smi` (the devices and processes queries alternating while the GPUs are idle) and 0.5
`grep` (on the processes checks): 3.5 processes per check, none more than once per check,
nothing else; the shell's own CPU 2.1 ms per check (under strace). Its children took 42 ms
per check, nearly all of it the Python nvidia-smi stand-in's start-up: a real nvidia-smi's
cost on a GPU host is not measured here (no GPU).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from bench_common import client_dirs  # noqa: E402
from conftest import install_standin  # noqa: E402
from test_cli_autostop import SUDO, apps_replay, gpu_standin, watchdogs  # noqa: E402
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(own utime+stime, reaped children's cutime+cstime) of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def traced(pid: int, seconds: float, out: Path) -> collections.Counter[str]:
    """Programs the process and its children exec'd while traced (strace -f)."""
    proc = subprocess.Popen(
        [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=execve",
            "-e",
            "signal=none",
            "-o",
            str(out),
            "-p",
            str(pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    proc.wait(10)
    first: dict[str, str] = {}  # pid -> the program it exec'd first (an interpreter later
    for line in out.read_text().splitlines():  # is the same process: `#!/usr/bin/env python3`)
        if "execve(" in line and "= 0" in line.rsplit(")", 1)[-1]:
            pid = line.split(None, 1)[0]
            program = line.split('execve("', 1)[1].split('"', 1)[0]
            first.setdefault(pid, os.path.basename(program))
    return collections.Counter(first.values())


def sampled(host: object, watchdog: int, seconds: float) -> collections.Counter[str]:
    """Processes of the host user, other than the watchdog, seen at 10 ms samples."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid in host.user_pids():  # type: ignore[attr-defined]
            if pid == watchdog or pid in seen:
                continue
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == watchdog:  # its parent: the watchdog
                seen[pid] = os.path.basename(args[0].decode() or "?")
        time.sleep(0.01)
    return collections.Counter(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=int, default=2)
    parser.add_argument("--checks", type=int, default=30)
    args = parser.parse_args()
    reason = skip_reason_no_netns()
    if reason:
        sys.exit(f"needs the netns test bed: {reason}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetnsBed(Path(tmp) / "bed", ClientKeys.generate(Path(tmp) / "keys")) as bed,
    ):
        host = bed.add_host("w1")
        _home, cwd, env = client_dirs(bed, Path(tmp))
        env.update(VMRUN_AUTOSTOP_INTERVAL=f"{args.interval}s", VMRUN_AUTOSTOP_SESSIONS="any")
        install_standin(host, "sudo", SUDO)
        marked = host.popen(["sleep", "3600"], as_user=True, env={"VMRUN_RUN_ID": "bench-1"})
        try:
            gpu_standin(host, "t4_idle", apps=apps_replay(marked.pid))
            (host.home / ".vmrun/runs/bench-1").mkdir(parents=True)
            (host.home / ".vmrun/runs/bench-1/pid").write_text("1\n")
            done = subprocess.run(
                [sys.executable, "-m", "vmrun", "autostop", "1h", "-H", "w1"],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                sys.exit(done.stderr)
            [watchdog] = watchdogs(host)
            time.sleep(2 * args.interval)  # past its first checks
            seconds = args.interval * args.checks
            before, rss = cpu_ticks(watchdog), rss_kib(watchdog)
            if shutil.which("strace"):
                how, counts = "strace", traced(watchdog, seconds, Path(tmp) / "strace.out")
            else:
                how, counts = "sampling /proc (a lower bound)", sampled(host, watchdog, seconds)
            after = cpu_ticks(watchdog)
            resident = len(watchdogs(host))
        finally:
            marked.kill()
            marked.wait()
            subprocess.run(  # the watchdog, its crontab line (outlives the bed's user), files
                [sys.executable, "-m", "vmrun", "autostop", "--cancel", "-H", "w1"],
                cwd=cwd,
                env=env,
                capture_output=True,
                check=False,
            )
        checks = counts["sleep"] or args.checks  # each check ends in one `sleep INTERVAL`
        own = (after[0] - before[0]) / CLK_TCK * 1000 / checks
        children = (after[1] - before[1]) / CLK_TCK * 1000 / checks
        print(
            f"autostop watchdog, {seconds} s at --interval {args.interval}: {checks} checks ({how})"
        )
        print(f"  resident processes: {resident} (sh), RSS {rss / 1024:.1f} MiB")
        total = sum(counts.values())
        print(f"  processes started per check: {total / checks:.2f}")
        for program, n in counts.most_common():
            print(f"    {program:<12} {n / checks:.2f} per check ({n} in all)")
        print(
            f"  CPU per check: {own:.1f} ms the shell, {children:.1f} ms its children"
            " (the nvidia-smi stand-in is a Python script)"
        )


if __name__ == "__main__":
    main()
