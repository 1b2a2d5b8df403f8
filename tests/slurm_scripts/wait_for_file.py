"""A job as long as the test wants: it runs until the file named by its argument exists
(on the shared filesystem; the test makes it), at most 300 s."""

import sys
import time
from pathlib import Path

flag = Path(sys.argv[1])
print("waiting for the flag", flush=True)
deadline = time.monotonic() + 300
while not flag.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
print("flag seen" if flag.exists() else "no flag", flush=True)
sys.exit(0 if flag.exists() else 1)
