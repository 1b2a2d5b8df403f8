"""A small DDP trainer for the seed scripts' CPU copies (gloo): it reads its rank and world
the way each seed's script sets them (RANK from export_DDP_vars.sh, else SLURM_PROCID as
Princeton's myscript.py does), prints each seed's lines and writes its checkpoint."""

import argparse
import os
import socket

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--out", default="outputs")
args = parser.parse_args()

rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
world_size = int(os.environ.get("WORLD_SIZE", "1"))
torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK", "1")))
if world_size > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    print(f"Hello from rank {rank} of {world_size} on {socket.gethostname()}", flush=True)
    print(f"Group initialized? {dist.is_initialized()}", flush=True)
print(f"running on rank {rank} with world size {world_size}", flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
if world_size > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for epoch in range(1, args.epochs + 1):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"Train Epoch: {epoch} Loss: {loss.item():.4f}", flush=True)
if rank == 0:
    os.makedirs(args.out, exist_ok=True)
    torch.save({"epoch": args.epochs, "world_size": world_size}, f"{args.out}/ckpt.tar")
    print("Training complete", flush=True)
if world_size > 1:
    dist.barrier()  # every rank done before any leaves: gloo aborts a rank whose peers left
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
