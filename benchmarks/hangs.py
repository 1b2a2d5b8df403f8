"""What finding where a run is costs (issue 42; goals: the stacks of 4 ranks on 2 hosts in
<= 3 s, and no measurable epoch time for the hang watcher).

The test bed: two netns hosts, each with the test hosts' interpreter (torch 2.13, CPU).

- stacks: `vmrun stacks RUN` on a live 2 x 2 run (a user's script in an all_reduce loop),
  the first time (py-spy sent to each host) and warm, against what a user does by hand
  with the same py-spy: per host one `ssh HOST 'pgrep ... | xargs py-spy dump'`, the hosts
  in parallel (pdsh's way), read back as text, ungrouped;
- epoch time: the template, 2 x 2, 12 epochs, with the hang watcher on (every node watching
  its log and heartbeats, --hang-timeout 10m) and off (--hang-timeout off), alternated:
  the median epoch_time_s of each.

    sudo python benchmarks/hangs.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import client_dirs  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"
WHEELS = "/opt/vmrun-test-cache/wheelhouse-py-spy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm, have_root_netns

    if not have_root_netns():
        raise SystemExit("needs root and network namespaces (the test bed)")
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-hangbench-"))
    try:
        with NetnsBed(work / "bed", ClientKeys.generate(work / "keys")) as bed:
            hosts = [bed.add_host(name) for name in ("b1", "b2")]
            _home, cwd, env = client_dirs(bed, work)
            env["VMRUN_TOOL_WHEELS"] = WHEELS
            env["OMP_NUM_THREADS"] = "1"
            (cwd / "vmrun.toml").write_text(
                "".join(
                    f'[[hosts]]\naddress = "{h.name}"\npython = "{CACHED_PYTHON}"\n\n'
                    for h in hosts
                )
            )
            shutil.copy(ROOT / "tests" / "hang_scripts" / "hang_rank.py", cwd)
            stacks = measure_stacks(hosts, cwd, env, args.rounds)
            epochs = measure_epochs(cwd, env, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({**stacks, **epochs}, indent=1))


def vmrun(cwd: Path, env: dict[str, str], *args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vmrun", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"vmrun {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stderr + done.stdout


def measure_stacks(hosts: list, cwd: Path, env: dict[str, str], rounds: int) -> dict[str, object]:
    said = vmrun(
        cwd,
        env,
        "train",
        "hang_rank.py",
        "--nproc-per-node",
        "2",
        "--detach",
        "--hang-timeout",
        "off",
        "--env",
        "HANG_RANK=-1",
    )
    rid = re.search(r"run (\S+) started on", said).group(1)  # type: ignore[union-attr]
    log = hosts[1].home / ".vmrun" / "runs" / rid / "log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "step 2 " in log.read_text()):
        if time.monotonic() > deadline:
            raise SystemExit("the run did not step")
        time.sleep(0.2)
    try:
        began = time.monotonic()
        vmrun(cwd, env, "stacks", rid)
        first = time.monotonic() - began
        warm, by_hand = [], []
        for _ in range(rounds):
            began = time.monotonic()
            vmrun(cwd, env, "stacks", rid)
            warm.append(time.monotonic() - began)
            began = time.monotonic()
            manual(cwd, hosts, rid)
            by_hand.append(time.monotonic() - began)
    finally:
        vmrun(cwd, env, "stop", rid)
    w, h = statistics.median(warm), statistics.median(by_hand)
    return {
        "stacks_first_s": round(first, 2),
        "stacks_warm_s": round(w, 2),
        "by_hand_ssh_pyspy_s": round(h, 2),
        "stacks_vs_by_hand": round(w / h, 2),
    }


def manual(cwd: Path, hosts: list, rid: str) -> None:
    """By hand: on each host at once, the run's python processes, each dumped by py-spy."""
    spy = "$(ls ~/.vmrun/tools/py-spy-*/py-spy | tail -n 1)"
    line = (
        f"for p in $(pgrep -u $(id -u) -f hang_rank.py); do grep -qz VMRUN_RUN_ID={rid}"
        f" /proc/$p/environ && grep -qz '^RANK=' /proc/$p/environ && {spy} dump --pid $p;"
        " done"
    )

    def one(host: object) -> None:
        ssh = [
            "ssh",
            "-F",
            str(cwd.parent / "home" / ".ssh" / "config"),
            "-o",
            f"UserKnownHostsFile={cwd.parent / 'home' / '.ssh' / 'known_hosts'}",
            host.name,
            line,
        ]
        subprocess.run(ssh, capture_output=True, text=True, timeout=120, check=False)

    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(one, hosts))


def measure_epochs(cwd: Path, env: dict[str, str], rounds: int) -> dict[str, object]:
    on: list[float] = []
    off: list[float] = []
    for n in range(rounds):
        for watched, into in (
            ((True, on), (False, off)) if n % 2 == 0 else ((False, off), (True, on))
        ):
            timeout = "10m" if watched else "off"
            said = vmrun(
                cwd,
                env,
                "train",
                "--nproc-per-node",
                "2",
                "--epochs",
                "12",
                "--save-every",
                "6",
                "--hang-timeout",
                timeout,
            )
            rid = re.search(r"run (\S+) started on", said).group(1)  # type: ignore[union-attr]
            vmrun(cwd, env, "fetch", "metrics", "--run", rid)
            found = next((cwd / "results" / rid).rglob("metrics.jsonl"))
            times = [json.loads(x)["epoch_time_s"] for x in found.read_text().splitlines()]
            into.append(statistics.median(times[1:]))  # the first epoch warms up
    a, b = statistics.median(on), statistics.median(off)
    return {
        "epoch_s_watched": round(a, 4),
        "epoch_s_unwatched": round(b, 4),
        "watched_vs_unwatched": round(a / b, 3),
    }


if __name__ == "__main__":
    main()
