"""What `vmrun watch-gpus` costs the hosts: SSH connections and remote processes per minute.

Goal (issue 7): a constant cost per host, one connection and one channel, and no process
started per refresh (unlike `ssh host nvidia-smi` in a loop). The processes on a host are
one set for the whole watch: the watch script (bash) and two `nvidia-smi -l` under it (one
nvidia-smi cannot stream both `--query-gpu` and `--query-compute-apps`), plus the sh
wrapper every vmrun remote command runs under (vmrun.ssh.quoting: its watcher and `cat`) and
sshd's session process. Which vmrun run owns a GPU pid is read by the script's builtins.

Runs the real CLI against netns test hosts (root only; see tests/testbed) whose nvidia-smi
is the replaying STAND-IN, for `--seconds`, and counts from the hosts' side: connections
(sshd's "Accepted publickey"), channels (sshd's "Starting session"), nvidia-smi starts (the
stand-in's log), and the distinct processes of the host user seen by sampling /proc every
0.1 s (short-lived ones can slip between samples), in all and after the first 10 s.

    sudo python benchmarks/watch_gpus.py [--hosts 3] [--seconds 60] [--interval 2]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from bench_common import client_dirs  # noqa: E402
from test_cli_watch_gpus import install, starts  # noqa: E402
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns  # noqa: E402

WARMUP = 10.0  # seconds: connecting and starting; after that nothing new should start


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
        _home, cwd, env = client_dirs(bed, Path(tmp))
        (cwd / "vmrun.toml").write_text(
            "".join(
                f'[[hosts]]\naddress = "{h.name}"\nnvidia_smi = "~/bin/nvidia-smi"\n\n'
                for h in hosts
            )
        )
        replays = {h.name: install(h, "t4x2_training") for h in hosts}
        logs_before = {h.name: h.sshd_log() for h in hosts}
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
        late: dict[str, set[int]] = {h.name: set() for h in hosts}  # new after WARMUP
        peak = dict.fromkeys(seen, 0)
        names: dict[int, str] = {}
        logs_warm: dict[str, str] = {}
        try:
            started = time.monotonic()
            while (now := time.monotonic()) - started < args.seconds:
                for h in hosts:
                    pids = set(h.user_pids())
                    if now - started > WARMUP and h.name not in logs_warm:
                        logs_warm[h.name] = h.sshd_log()
                    if now - started > WARMUP:
                        late[h.name] |= pids - seen[h.name]
                    seen[h.name] |= pids
                    peak[h.name] = max(peak[h.name], len(pids))
                    if h is hosts[0]:
                        names.update((pid, _name(pid)) for pid in pids if pid not in names)
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
        minutes = elapsed / 60
        print(
            f"vmrun watch-gpus --interval {args.interval:g}: {len(hosts)} hosts watched for"
            f" {elapsed:.0f} s; per host, counted on the host (totals for the whole run):"
        )
        print(
            f"{'host':<6} {'samples/min':>11} {'SSH conns':>10} {'channels':>9}"
            f" {'nvidia-smi':>11} {'procs seen':>11} {'peak live':>10} {'new after 10s':>14}"
        )
        for h in hosts:
            log = h.sshd_log()[len(logs_before[h.name]) :]
            print(
                f"{h.name:<6} {samples[h.name] / minutes:>11.1f}"
                f" {log.count('Accepted publickey'):>10}"
                f" {log.count('Starting session'):>9}"
                f" {len(starts(replays[h.name])):>11}"
                f" {len(seen[h.name]):>11} {peak[h.name]:>10} {len(late[h.name]):>14}"
            )
        late_minutes = max(minutes - WARMUP / 60, 1e-9)
        worst = {"connections": 0.0, "channels": 0.0, "processes": 0.0}
        for h in hosts:
            log = h.sshd_log()[len(logs_warm.get(h.name, "")) :]
            for key, count in (
                ("connections", log.count("Accepted publickey")),
                ("channels", log.count("Starting session")),
                ("processes", len(late[h.name])),
            ):
                worst[key] = max(worst[key], count / late_minutes)
        print(
            f"per host per minute after the first {WARMUP:g} s (worst host):"
            + ",".join(f" {v:.1f} {k}" for k, v in worst.items())
        )
        print(f"processes on {hosts[0].name}: {', '.join(sorted(names.values()))}")
        refreshes = 60.0 / args.interval
        print(
            f"naive `ssh host nvidia-smi --query-gpu=...` per refresh: {refreshes:.0f} SSH"
            f" connections, remote commands and nvidia-smi starts per host per minute,"
            " growing with time"
        )
        print(f"vmrun exit code after Ctrl-C: {proc.returncode}")


def _name(pid: int) -> str:
    """A process's command, short: `sh` (vmrun's wrapper and its watcher), `bash` (the watch
    script), `nvidia-smi`, `sshd: user@notty`..."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in argv if w]
    if not words:
        return "?"
    if words[0].startswith("sshd"):
        return words[0]
    if Path(words[0]).name.startswith("python") and len(words) > 1:  # the stand-in script
        return Path(words[1]).name
    return Path(words[0]).name


if __name__ == "__main__":
    main()
