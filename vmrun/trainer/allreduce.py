"""A short all-reduce across every process of a torchrun job: `vmrun doctor`'s bandwidth check.

    torchrun ... allreduce.py [--size-mib N] [--iters K]

nccl on GPUs, gloo on CPUs. Rank 0 prints one line `allreduce: ...` with the mean time and
the bus bandwidth nccl-tests reports (algbw x 2(n-1)/n: what each link carries), so numbers
compare across world sizes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mib", type=float, default=0.0, help="default: 256 (GPU), 16 (CPU)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    size_mib = args.size_mib or (256.0 if backend == "nccl" else 16.0)
    numel = max(1, int(size_mib * 2**20) // 4)
    data = torch.ones(numel, dtype=torch.float32, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        dist.all_reduce(data)
    sync()
    dist.barrier()
    began = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(data)
    sync()
    took = (time.perf_counter() - began) / args.iters
    nbytes = numel * 4
    algbw = nbytes / took / 1e9
    busbw = algbw * 2 * (world - 1) / world if world > 1 else 0.0
    if rank == 0:
        print(
            f"allreduce: world {world}, {nbytes / 2**20:.0f} MiB x {args.iters}:"
            f" {took * 1e3:.2f} ms each, algbw {algbw:.2f} GB/s, busbw {busbw:.2f} GB/s"
            f" ({backend}, {device.type})",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # as the template: skip a teardown that gloo's threads can abort
