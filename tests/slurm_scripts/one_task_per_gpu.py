"""A university cluster's one-task-per-GPU script, unchanged: its rank, world size and
master come from the environment the launcher sets (here gloo on CPUs)."""

import os
import socket

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
total = torch.tensor([float(rank)])
dist.all_reduce(total)
local = os.environ["LOCAL_RANK"]
host = socket.gethostname()
print(f"rank {rank} local {local} of {world} on {host} sum {total.item():g}", flush=True)
dist.destroy_process_group()
os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
