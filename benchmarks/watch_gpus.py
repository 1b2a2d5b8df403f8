"""What `vmrun watch-gpus` costs the hosts: SSH connections and remote processes per minute.

Goal (issue 7): a constant cost per host (one connection, one long-lived nvidia-smi per
query), not one connection and one process per refresh as `ssh host nvidia-smi` in a loop.

Runs the real CLI against netns test hosts (root only; see tests/testbed) whose nvidia-smi
is the replaying stand-in, for `--seconds`, and counts from the hosts' side:
connections (sshd's "Accepted publickey"), remote commands (sshd's "Starting session"),
nvidia-smi starts (the stand-in's log), and the distinct processes of the host user seen
by sampling /proc every 0.1 s (short-lived ones can slip between samples).

    sudo python benchmarks/watch_gpus.py [--hosts 3] [--seconds 60] [--interval 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from test_cli_watch_gpus import install, starts  # noqa: E402
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args()
    reason = skip_reason_no_netns()
    if reason:
        sys.exit(f"needs the netns test bed: {reason}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetnsBed(Path(tmp) / "bed", ClientKeys.generate(Path(tmp) / "keys")) as bed,
    ):
        hosts = [bed.add_host(f"w{i}") for i in range(1, args.hosts + 1)]
        home, cwd = Path(tmp) / "home", Path(tmp) / "project"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        cwd.mkdir()
        (home / ".ssh" / "config").write_text(bed.ssh_config_text())
        (home / ".ssh" / "known_hosts").write_text(bed.known_hosts_text())
        (cwd / "vmrun.toml").write_text(
            "".join(
                f'[[hosts]]\naddress = "{h.name}"\nnvidia_smi = "~/bin/nvidia-smi"\n\n'
                for h in hosts
            )
        )
        replays = {h.name: install(h, "t4x2_training") for h in hosts}
        logs_before = {h.name: h.sshd_log() for h in hosts}
        env = {
            "HOME": str(home),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT),
            "LANG": "C.UTF-8",
        }
        argv = [sys.executable, "-m", "vmrun", "watch-gpus", "--json"]
        argv += ["--interval", f"{args.interval:g}"]
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        samples = {h.name: 0 for h in hosts}

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sample = json.loads(line)
                if sample["state"] == "ok":
                    samples[sample["host"]] += 1

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        seen: dict[str, set[int]] = {h.name: set() for h in hosts}
        peak = dict.fromkeys(seen, 0)
        try:
            started = time.monotonic()
            while time.monotonic() - started < args.seconds:
                for h in hosts:
                    pids = set(h.user_pids())
                    seen[h.name] |= pids
                    peak[h.name] = max(peak[h.name], len(pids))
                time.sleep(0.1)
            elapsed = time.monotonic() - started
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(5)
        print(
            f"vmrun watch-gpus --interval {args.interval:g}: {len(hosts)} hosts watched for"
            f" {elapsed:.0f} s; per host, counted on the host (totals for the whole run):"
        )
        header = f"{'host':<6} {'samples/min':>11} {'SSH conns':>10} {'commands':>9}"
        print(header + f" {'nvidia-smi':>11} {'procs seen':>11} {'peak live':>10}")
        for h in hosts:
            log = h.sshd_log()[len(logs_before[h.name]) :]
            print(
                f"{h.name:<6} {samples[h.name] * 60.0 / elapsed:>11.1f}"
                f" {log.count('Accepted publickey'):>10}"
                f" {log.count('Starting session'):>9}"
                f" {len(starts(replays[h.name])):>11}"
                f" {len(seen[h.name]):>11} {peak[h.name]:>10}"
            )
        refreshes = 60.0 / args.interval
        print(
            f"naive `ssh host nvidia-smi --query-gpu=...` per refresh: {refreshes:.0f} SSH"
            f" connections, remote commands and nvidia-smi starts per host per minute,"
            " growing with time"
        )
        print(f"vmrun exit code after Ctrl-C: {proc.returncode}")


if __name__ == "__main__":
    main()
