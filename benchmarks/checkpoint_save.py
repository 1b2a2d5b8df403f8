"""What a sharded checkpoint costs training: `dcp.save` against `dcp.async_save`
(torch.distributed.checkpoint), a model state of SIZE (default 1 GiB) sharded over 2 ranks.

Two processes on this machine (torch.multiprocessing, gloo on CPU), each holding half of
the state as DTensor shards (`Shard(0)` over a 2-rank mesh, in tensors of 64 MiB, as a
model's layers), checkpoint ROUNDS times each way into a fresh folder. Per checkpoint:

- blocked: how long the training loop waits in the call (sync: the whole save; async: the
  staging of the state to CPU memory and the plan; a rank's own time, the slower rank's
  counted);
- on disk: from the call to the last byte written and .metadata in place (async: the
  future's completion, while the loop goes on with work of its own);
- in the bucket (`--bucket`): then the folder copied to moto's S3 server on loopback by the
  real rclone, the shards first and .metadata last, as vmrun's copier sends it (moto is a
  STAND-IN, Python on the same CPUs: its rate is this machine's, not S3's).

    python benchmarks/checkpoint_save.py [--size 1G] [--rounds 3] [--dir DIR] [--bucket]

The anchor: PyTorch's async save cut a 7B model's blocked time from 148.8 s to 6.3 s
(pytorch.org/blog, "Reducing checkpointing times"). Not a test: run by hand, figures in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = str(ROOT / "benchmarks")
# not this folder: its queue.py would stand in for the stdlib's, which torch imports
sys.path[:] = [str(ROOT), *(p for p in sys.path if p and str(Path(p).resolve()) != HERE)]

PIECE = 64 << 20  # bytes per tensor (a layer's weights)
RCLONE = Path("/opt/vmrun-test-cache/rclone-1.75.2/rclone")


def rank_main(rank: int, world: int, port: int, args: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    per_rank = args.size // world
    rows = PIECE // 4 // 1024  # float32 rows of 1024 in one rank's share of a piece
    state = {
        f"layer{i}.weight": DTensor.from_local(
            torch.randn(rows // world, 1024), mesh, [Shard(0)], run_check=False
        )
        for i in range(max(1, per_rank * world // PIECE))
    }
    work = torch.randn(256, 256)
    times: list[dict[str, Any]] = []
    for mode in [m for _ in range(args.rounds) for m in ("sync", "async")]:
        folder = Path(args.dir) / f"{mode}-{len(times)}"
        dist.barrier()
        began = time.perf_counter()
        if mode == "sync":
            dcp.save(state, checkpoint_id=str(folder))
            blocked = written = time.perf_counter() - began
            steps = 0
        else:
            future = dcp.async_save(state, checkpoint_id=str(folder))
            blocked = time.perf_counter() - began
            steps = 0
            while not future.done():  # training goes on meanwhile
                work = torch.tanh(work @ work.T / 256)
                steps += 1
            future.result()
            written = time.perf_counter() - began
        dist.barrier()
        times.append({"mode": mode, "folder": str(folder), "blocked": blocked, "on_disk": written})
        times[-1]["steps"] = steps
    results.put((rank, times))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def to_bucket(folder: Path, endpoint: str, name: str) -> float:
    """The folder into the bucket as vmrun's copier sends it: shards, then .metadata."""
    env = {
        **os.environ,
        "RCLONE_CONFIG_B_TYPE": "s3",
        "RCLONE_CONFIG_B_PROVIDER": "Other",
        "RCLONE_CONFIG_B_ENDPOINT": endpoint,
        "RCLONE_CONFIG_B_ACCESS_KEY_ID": "k",
        "RCLONE_CONFIG_B_SECRET_ACCESS_KEY": "s",
    }
    target = f"b:{name}/{folder.name}"
    began = time.perf_counter()
    for extra in (["--exclude", ".metadata"], ["--include", ".metadata"]):
        subprocess.run(
            [str(RCLONE), "copy", str(folder), target, "--s3-no-check-bucket", *extra],
            env=env,
            check=True,
            capture_output=True,
        )
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1G", help="the model state, all ranks (1G)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="", help="where the checkpoints go (a temp dir)")
    parser.add_argument("--bucket", action="store_true", help="then copy each to moto's S3")
    args = parser.parse_args()
    sys.path.append(HERE)
    from bench_common import parse_size

    sys.path.remove(HERE)
    args.size = parse_size(args.size)
    import torch.multiprocessing as mp

    made = not args.dir
    args.dir = args.dir or tempfile.mkdtemp(prefix="ckpt-bench-", dir=str(Path.home()))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, 2, port, args, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    rows = [
        {
            "mode": a["mode"],
            "folder": a["folder"],
            "blocked": max(a["blocked"], b["blocked"]),
            "on_disk": max(a["on_disk"], b["on_disk"]),
            "steps": a["steps"],
        }
        for a, b in zip(got[0], got[1], strict=True)
    ]
    server = None
    if args.bucket:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request

        bucket_port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=bucket_port)
        server.start()
        import boto3

        endpoint = f"http://127.0.0.1:{bucket_port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
        ).create_bucket(Bucket="bench")
        for row in rows:
            row["in_bucket"] = row["on_disk"] + to_bucket(Path(row["folder"]), endpoint, "bench")
        server.stop()
    size = sum(f.stat().st_size for f in Path(rows[0]["folder"]).iterdir())
    print(f"model state {args.size / (1 << 30):.2f} GiB on 2 ranks, checkpoint {size} bytes")
    for row in rows:
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))
    for mode in ("sync", "async"):
        mine = [r for r in rows if r["mode"] == mode]
        line = f"{mode:5}: blocked {statistics.median(r['blocked'] for r in mine):.2f} s, "
        line += f"on disk {statistics.median(r['on_disk'] for r in mine):.2f} s"
        if args.bucket:
            line += f", in the bucket {statistics.median(r['in_bucket'] for r in mine):.2f} s"
        print(line + f" (medians of {len(mine)})")
    if made:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
