"""A user's script whose rank HANG_RANK stops before an all_reduce (it waits for a file
that never comes) at step HANG_AT, while the other ranks wait in that all_reduce (gloo).
Every rank prints each step, so each node's log shows progress until the hang.

STAND-IN for NCCL's watchdog (no GPU here): with HANG_FR=1, a second after the hang's step
began (rank 3 in its wait, the others in the all_reduce it never joins), each rank dumps
torch's flight recorder (real: torch records gloo's collectives too) where vmrun points
TORCH_FR_DUMP_TEMP_FILE, as NCCL's watchdog does on a collective's timeout with
TORCH_NCCL_DUMP_ON_TIMEOUT."""

import os
import threading
import time

import torch
import torch.distributed as dist


def wait_forever() -> None:
    while not os.path.exists("/nonexistent/never"):
        time.sleep(0.5)  # the place its stack names


reached = threading.Event()  # the hang's step began


def dump_when_hung(rank: int) -> None:
    reached.wait()
    time.sleep(1)
    data = torch._C._distributed_c10d._dump_fr_trace()
    path = f"{os.environ['TORCH_FR_DUMP_TEMP_FILE']}{rank}"
    with open(f"{path}.tmp", "wb") as fh:
        fh.write(data)
    os.replace(f"{path}.tmp", path)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if os.environ.get("HANG_FR") == "1":
        threading.Thread(target=dump_when_hung, args=(rank,), daemon=True).start()
    hang_rank, hang_at = int(os.environ.get("HANG_RANK", "3")), int(os.environ.get("HANG_AT", "3"))
    for step in range(1, 10_000):
        if step == hang_at:
            reached.set()
        if rank == hang_rank and step == hang_at:
            wait_forever()
        t = torch.ones(4)
        dist.all_reduce(t)  # the others wait here
        print(f"step {step} sum {t[0].item():.0f}", flush=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
