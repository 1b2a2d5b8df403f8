"""What `train --store` costs a run (issue 40: goal < 2% of its epoch time): the same run on
one test host with and without its copy to a bucket, epoch times from its metrics.jsonl.

The bucket is moto's S3 server on a test host of its own (the STAND-IN for S3: on a cloud
the bucket is another machine; here moto is Python on the same two CPUs as the run, so
what it spends on each upload is counted against the run too, an upper bound). The host
gets the real rclone in ~/.vmrun/bin; the copier is vmrun's own (store_sync.sh).

    sudo python benchmarks/store_overhead.py [--epochs 40] [--rounds 2] [--snapshot-mb 64]

Rows (interleaved rounds; each run's median epoch time over epochs 2..N, then the median of
the rounds):
- the template trainer (2 CPU processes, --batch-size 8, a snapshot every 5 epochs): the
  copier's own cost, waking every 2 s, its snapshots small;
- a script that works a fixed amount per epoch and writes a SNAPSHOT-MB snapshot (renamed
  into place) every 2 epochs: big files going up while the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench_common import client_dirs  # noqa: E402

CACHED_PYTHON = "/opt/vmrun-test-cache/venv-py3-torch-2.13.0/bin/python"
WORK = """\
import json, os, sys, time, torch
torch.set_num_threads(1)
epochs, mb = int(sys.argv[1]), int(sys.argv[2])
os.makedirs("out", exist_ok=True)
a = torch.randn(384, 384)
for epoch in range(1, epochs + 1):
    began = time.perf_counter()
    for _ in range(400):
        a = torch.tanh(a @ a.T / 384)
    took = time.perf_counter() - began
    with open("out/metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"epoch": epoch, "epoch_time_s": took}) + "\\n")
    if epoch % 2 == 0:
        tmp = f"out/.snapshot.pt.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(os.urandom(mb << 20))
        os.replace(tmp, "out/snapshot.pt")
    print(f"epoch {epoch}/{epochs} time {took:.3f}s", flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--snapshot-mb", type=int, default=64)
    parser.add_argument("--python", default=CACHED_PYTHON)
    args = parser.parse_args()

    from testbed import ClientKeys, NetnsBed, cleanup_on_sigterm, have_root_netns

    if not have_root_netns():
        raise SystemExit("needs root and network namespaces (the test bed)")
    cleanup_on_sigterm()
    work = Path(tempfile.mkdtemp(prefix="vmrun-storeoverhead-"))
    try:
        with NetnsBed(work / "bed", ClientKeys.generate(work / "keys")) as bed:
            measure(bed, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(bed: object, work: Path, args: argparse.Namespace) -> None:
    from conftest import CACHE
    from store_fixtures import install_mover, new_bucket, s3_env, s3_server_on

    host = bed.add_host("h1")  # type: ignore[attr-defined]
    bucket_host = bed.add_host("bucket")  # type: ignore[attr-defined]
    install_mover(host, CACHE / "rclone-1.75.2" / "rclone")
    _, project, env = client_dirs(bed, work / "client")
    (project / "vmrun.toml").write_text(f'[[hosts]]\naddress = "h1"\npython = "{args.python}"\n')
    (project / "work.py").write_text(WORK)
    env["OMP_NUM_THREADS"] = "1"
    with s3_server_on(bucket_host) as endpoint:
        env.update(s3_env(endpoint))
        name = new_bucket(endpoint)
        cases = {
            "template": ["--epochs", str(args.epochs), "--save-every", "5", "--batch-size", "8"],
            f"{args.snapshot_mb} MiB snapshots": [
                "work.py",
                "--launcher",
                "python",
                "--",
                str(args.epochs),
                str(args.snapshot_mb),
            ],
        }
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for case, argv in cases.items():
                for store in (False, True):
                    flags = ["--store", f"s3://{name}/runs"] if store else []
                    times.setdefault((case, store), []).append(
                        _median_epoch(host, project, env, [*flags, *argv])
                    )
    print(
        f"\n--store's cost on epoch time (h1, 2 CPUs, {args.rounds} round(s), medians of"
        f" epochs 2..{args.epochs}; moto's S3 on the same CPUs)"
    )
    for case in cases:
        plain = statistics.median(times[(case, False)])
        stored = statistics.median(times[(case, True)])
        print(
            f"  {case:<22} without {plain * 1000:8.1f} ms  with --store {stored * 1000:8.1f} ms"
            f"  {100 * (stored / plain - 1):+.1f}%"
        )


def _median_epoch(host: object, project: Path, env: dict[str, str], argv: list[str]) -> float:
    from vmrun.remote_paths import remote_workdir

    done = subprocess.run(
        [sys.executable, "-m", "vmrun", "train", "-H", "h1", *argv],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"vmrun train {' '.join(argv)} failed: {done.stderr[-2000:]}")
    found = re.search(r"run (\S+) (?:started|resumed) on", done.stderr)
    if not found:
        raise SystemExit(f"no run id in: {done.stderr[-2000:]}")
    rid = found.group(1)
    workdir = host.home / remote_workdir(project)  # type: ignore[attr-defined]
    metrics = workdir / "results" / rid / "metrics.jsonl"
    if not metrics.is_file():
        metrics = workdir / "out" / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    epoch_times = [m["epoch_time_s"] for m in lines if m["epoch"] >= 2]
    shutil.rmtree(workdir / "out", ignore_errors=True)
    os.sync()
    return statistics.median(epoch_times)


if __name__ == "__main__":
    main()
