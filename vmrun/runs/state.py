"""A run's state, as every backend reports it and `vmrun status` prints it."""

from __future__ import annotations

from vmrun.compat import StrEnum


class RunState(StrEnum):
    """A run's state as every backend reports it (and `vmrun status` prints it)."""

    PENDING = "pending"  # accepted, not started yet (a queued Slurm job)
    RUNNING = "running"
    DONE = "done"  # ended with exit code 0
    FAILED = "failed"  # ended with another code
    STOPPED = "stopped"  # `vmrun stop` ended it
    LOST = "lost"  # no process and no exit code: killed hard, or the host rebooted
