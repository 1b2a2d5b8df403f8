"""Seconds from a lost node to the run's first epoch after it (issue 41; goals: detection
<= 30 s, resume <= 60 s after the replacement answers SSH), with `train --recover`.

The test bed: nodes h1 (master) and h2, the supervisor on h3, the spare h4 (already up: a
new VM's boot is not counted here), and a bucket (moto's S3 on a test host of its own). The
template trains on both nodes (one process each); once a snapshot is in the bucket, the
lost node has every process killed and its sshd gone (--kill node: h2; --kill master: h1,
the spare then the master, every node from the bucket; --kill notice: a spot interruption
notice on h2 from the STAND-IN metadata service in h2's namespace, tests/standins/imds.py,
the run then snapshotting the epoch under way and stopping). Times from this machine's clock,
the run's lines timed by the host's log.times (the same clock here):

- detection: the loss (the notice) -> the supervisor's decision (its events.jsonl; for a
  notice this includes the epoch finished and saved before the stop);
- resume: the decision -> the new attempt's banner in the log (leftovers stopped, the
  newest snapshot given to the spare or copied from the bucket, the code staged, started);
- first epoch: the banner -> the first epoch line after it (torchrun, rendezvous, load).

    sudo python benchmarks/recovery.py [--kill node|master|notice] [--rounds 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import client_dirs  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill", choices=("node", "master", "notice"), default="node")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm, have_root_netns

    if not have_root_netns():
        raise SystemExit("needs root and network namespaces (the test bed)")
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-recoverybench-"))
    try:
        with NetnsBed(work / "bed", ClientKeys.generate(work / "keys")) as bed:
            rows = [measure(bed, work / f"r{n}", args.kill, n) for n in range(args.rounds)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n--recover, the {args.kill} lost ({args.rounds} round(s), medians):")
    for key in ("detection", "resume", "first epoch", "fault to first epoch", "epochs redone"):
        print(f"  {key:<22} {statistics.median(r[key] for r in rows):7.2f} s")


def measure(bed: object, work: Path, kill: str, n: int) -> dict[str, float]:
    from conftest import CACHE
    from store_fixtures import client, install_mover, new_bucket, s3_env, s3_server_on

    from vmrun.recovery.deploy import requirements, wheels_key

    names = [f"r{n}h{i}" for i in range(1, 5)]
    hosts = [bed.add_host(name) for name in names]  # type: ignore[attr-defined]
    bucket_host = bed.add_host(f"r{n}bucket")  # type: ignore[attr-defined]
    for host in hosts:
        install_mover(host, CACHE / "rclone-1.75.2" / "rclone")
    _, project, env = client_dirs(bed, work)
    (project / "vmrun.toml").write_text(
        "".join(f'[[hosts]]\naddress = "{h}"\npython = "{CACHED_PYTHON}"\n\n' for h in names)
    )
    wheels = CACHE / f"wheelhouse-supervisor-{wheels_key(requirements(True))}"
    env |= {"OMP_NUM_THREADS": "1", "VMRUN_SUPERVISOR_WHEELS": str(wheels)}
    with s3_server_on(bucket_host) as endpoint, contextlib.ExitStack() as stack:
        state = None
        if kill == "notice":  # up before the run: the watcher asks it from the start
            from imds_fixtures import metadata

            state, _ = stack.enter_context(metadata(hosts[1], work))
        env |= s3_env(endpoint)
        name = new_bucket(endpoint)
        h1, h2, h3, h4 = hosts
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "vmrun",
                "train",
                "-H",
                h1.name,
                "-H",
                h2.name,
                "--nproc-per-node",
                "1",
                "--epochs",
                "400",
                "--save-every",
                "5",
                "--store",
                f"s3://{name}/runs",
                "--recover",
                "--supervisor",
                h3.name,
                "--spare",
                h4.name,
            ],
            env=env,
            cwd=project,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        rid = re.search(r"run (\S+) (?:started|resumed) on", done.stderr).group(1)  # type: ignore[union-attr]
        s3 = client(endpoint)
        deadline = time.monotonic() + 300
        while not any(
            o["Key"].endswith("/snapshot.pt")
            for o in s3.list_objects_v2(Bucket=name, Prefix=f"runs/{rid}/").get("Contents", [])
        ):
            if time.monotonic() > deadline:
                raise SystemExit("no snapshot in the bucket")
            time.sleep(0.2)
        lost, master = (h1, h4) if kill == "master" else (h2, h1)
        fault = time.time()
        if state is None:
            lost.stop_sshd()
        else:  # the notice comes; the VM itself would go two minutes later
            action = {"action": "terminate", "time": "2026-11-29T12:00:00Z"}
            state.write_text(json.dumps({"instance-action": action}))
        events = h3.home / ".vmrun" / "supervisor" / "runs" / rid / "events.jsonl"
        record = master.home / ".vmrun" / "runs" / rid
        found = wait_for_value(lambda: first_epoch_after_banner(record), 600)
        event = json.loads(events.read_text().splitlines()[0])
        banner, first = found
        failed = event["failure"]
        redone = max(0, (failed.get("reached") or 0) - (failed.get("epoch") or 0))
        return {
            "detection": event["at"] - fault,
            "resume": banner - event["at"],
            "first epoch": first - banner,
            "fault to first epoch": first - fault,
            "epochs redone": redone,
        }


def first_epoch_after_banner(record: Path) -> tuple[float, float] | None:
    """When the new attempt's banner and the first epoch line after it were written."""
    try:
        lines = (record / "log").read_text(errors="replace").splitlines()
        timed = (record / "log.times").read_text().splitlines()
        marks = [tuple(map(float, x.split())) for x in timed if x.strip()]
    except OSError:
        return None
    at = next((i for i, x in enumerate(lines) if x.startswith("--- attempt 2")), None)
    if at is None:
        return None
    epoch = next((i for i in range(at, len(lines)) if re.search(r"epoch \d+/", lines[i])), None)
    if epoch is None:
        return None

    def when(index: int) -> float | None:
        return next((t for count, t in marks if count > index), None)

    banner, first = when(at), when(epoch)
    return (banner, first) if banner is not None and first is not None else None


def wait_for_value(probe, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit("the run did not come back")
        time.sleep(0.2)


if __name__ == "__main__":
    main()
