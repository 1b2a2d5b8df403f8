"""vmrun's template trainer with one rank slowed: SLOW_RANK sleeps SLOW_S in each forward
pass (as a slow GPU or data path would), so its step takes longer than the others'."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import template  # a copy of vmrun's template beside this script

_loss_of = template.loss_of


def slow_loss_of(*args, **kwargs):
    if os.environ.get("RANK") == os.environ.get("SLOW_RANK", "3"):
        time.sleep(float(os.environ.get("SLOW_S", "0.02")))
    return _loss_of(*args, **kwargs)


template.loss_of = slow_loss_of

if __name__ == "__main__":
    code = template.main()
    sys.stdout.flush()
    os._exit(code)
