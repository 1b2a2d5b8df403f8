"""torchrun's rank 1 exits with 3 at once; the others wait to be stopped (the job's one
failure: torchrun itself exits 1, vmrun reports the worker's 3)."""

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    sys.exit(3)
time.sleep(120)
