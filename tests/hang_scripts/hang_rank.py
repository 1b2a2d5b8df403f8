"""A user's script whose rank HANG_RANK stops before an all_reduce (it waits for a file
that never comes) at step HANG_AT, while the other ranks wait in that all_reduce (gloo).
Every rank prints each step, so each node's log shows progress until the hang."""

import os
import time

import torch
import torch.distributed as dist


def wait_forever() -> None:
    while not os.path.exists("/nonexistent/never"):
        time.sleep(0.5)  # the place its stack names


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    hang_rank, hang_at = int(os.environ.get("HANG_RANK", "3")), int(os.environ.get("HANG_AT", "3"))
    for step in range(1, 10_000):
        if rank == hang_rank and step == hang_at:
            wait_forever()
        t = torch.ones(4)
        dist.all_reduce(t)  # the others wait here
        print(f"step {step} sum {t[0].item():.0f}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
