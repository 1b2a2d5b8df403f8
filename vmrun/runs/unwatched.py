"""The watcher fields of `RunRow` (vmrun.backends.api) for rows whose place keeps none: a
hosts' node records when it began, its clock, spot notices and requeues; a Slurm job, a
local run and a bucket's copy do not, and say so once, here."""

from __future__ import annotations


class Unwatched:
    """Empty `began`, `host_now`, `notice` and `requeued`, for a row to inherit."""

    @property
    def began(self) -> None:
        return None

    @property
    def host_now(self) -> None:
        return None

    @property
    def notice(self) -> None:
        return None

    @property
    def requeued(self) -> None:
        return None
