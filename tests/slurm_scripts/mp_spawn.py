"""A research-computing centre's script: one process that mp.spawn's its workers (gloo on
CPUs), started by `python script.py N` on one node."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, world: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    total = torch.ones(1)
    dist.all_reduce(total)
    sys.stdout.write(f"spawned rank {rank} of {world} sum {total.item():g}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)


if __name__ == "__main__":
    mp.spawn(work, args=(int(sys.argv[1]),), nprocs=int(sys.argv[1]))
