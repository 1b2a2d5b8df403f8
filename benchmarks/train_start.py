"""Time from `vmrun train` to the first epoch line, against `ssh host torchrun ...` by hand.

Goal (train issue): vmrun within 1.2x of the hand-written ssh command on the same host. Both
run the template trainer with 2 CPU processes; vmrun's time includes its CLI start, the
connection, the env preflight, the busy check, placing the template and starting detached.
Needs root (a network-namespace test host) and the test cache's interpreter with torch.

    python benchmarks/train_start.py [--runs 5]

Measured here (2 cores, medians of 5): by hand 5.59 s, vmrun train 5.81 s: 1.04x (an
earlier, quieter run: 3.31 s and 3.34 s, 1.01x). It also counts the commands vmrun runs on
the host per start (the session channels sshd logs at DEBUG1): with each run's provenance
recorded (vmrun.runs.provenance) 7, as before it (10 for the first start: the host-side
files' install); medians of 7: 1.07x and 1.10x by hand, against 1.16x and 1.10x before.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from testbed import ClientKeys, NetnsBed  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"


def until_first_epoch(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            if "epoch 1/" in line:
                return time.perf_counter() - start
            seen.append(line)
        sys.stderr.write("".join(seen[-20:]))
        raise RuntimeError(f"{argv[:3]} ended without an epoch line")  # see output above
    finally:
        proc.wait(timeout=300)


def channels(log: str) -> int:
    """Session channels sshd opened (each one command, a round trip at least)."""
    return log.count("input_session_request") or log.count("ctype session")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=CACHED_PYTHON)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vmrun-bench-"))
    try:
        keys = ClientKeys.generate(work / "keys")
        with NetnsBed(work / "bed", keys) as bed:
            # DEBUG1: sshd logs each channel a client opens (one per command vmrun runs)
            host = bed.add_host("h1", sshd_extra_config="LogLevel DEBUG1")
            home = work / "home"
            (home / ".ssh").mkdir(parents=True)
            config = home / ".ssh" / "config"
            config.write_text(bed.ssh_config_text())
            (home / ".ssh" / "known_hosts").write_text(bed.known_hosts_text())
            project = work / "project"
            project.mkdir()
            (project / "vmrun.toml").write_text(
                f'[[hosts]]\naddress = "h1"\npython = "{args.python}"\n'
            )
            env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
            env.pop("SSH_AUTH_SOCK", None)
            template = host.home / "template.py"
            shutil.copy(ROOT / "vmrun" / "trainer" / "template.py", template)
            os.chown(template, host.uid, host.gid)
            known = home / ".ssh" / "known_hosts"  # OpenSSH takes ~ from passwd, not $HOME
            by_hand = [
                "ssh",
                "-F",
                str(config),
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "BatchMode=yes",
                "h1",
                "OMP_NUM_THREADS=1",
                args.python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                "template.py",
                "3",
                "1",
                "--out-dir",
            ]
            with_vmrun = [sys.executable, "-m", "vmrun", "train", "-H", "h1", "--", "3", "1"]
            hand, ours, commands = [], [], []
            for i in range(args.runs):  # interleaved, so drift hits both alike
                hand.append(until_first_epoch([*by_hand, f"by-hand-{i}"], project, env))
                before = channels(host.sshd_log())
                ours.append(until_first_epoch(with_vmrun, project, env))
                commands.append(channels(host.sshd_log()) - before)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hand_s, ours_s = statistics.median(hand), statistics.median(ours)
    print(f"ssh host torchrun ... (by hand), median: {hand_s:6.2f} s")
    print(f"vmrun train, median:                    {ours_s:6.2f} s")
    print(f"ratio vmrun / by hand: {ours_s / hand_s:.2f} (goal <= 1.2)")
    print(f"commands (SSH channels) vmrun opened on the host per run: {sorted(set(commands))}")


if __name__ == "__main__":
    main()
