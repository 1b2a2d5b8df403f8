"""Watching GPUs: on SSH hosts, or on the nodes of a cluster's running jobs. `watch` picks
the targets and starts a FleetWatch on them (one channel per host streaming nvidia-smi);
the caller drains it and renders (the CLI's live table, or JSON lines)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from vmrun.config import Settings
from vmrun.errors import UsageError
from vmrun.operations.hostlist import Hosts
from vmrun.reporting import QUIET, Reporter

if TYPE_CHECKING:
    from vmrun.gpus.fleet import FleetWatch


@contextmanager
def watch(
    settings: Settings,
    hosts: Hosts = None,
    *,
    cluster: str | None = None,
    run: str | None = None,
    job: str | None = None,
    interval: float = 2.0,
    once: bool = False,
    idle_threshold: float = 10.0,
    idle_window: float = 60.0,
    out: Reporter = QUIET,
) -> Iterator[FleetWatch | None]:
    """A started FleetWatch on `hosts` (None: the project's), or with `cluster` on the nodes
    of the user's running jobs there (or of `run`'s, or `job`'s); leaving the block closes
    every channel. None when the cluster has no such job (`out.info` says so). With `once`,
    one reading per host; `watch.fleet.exit_code()` is then the worst host's. Bad input
    raises UsageError before any connection."""
    from vmrun.backends.select import Target, watched_gpus

    check_watch(hosts, cluster, run, job, interval, idle_threshold, idle_window)
    with watched_gpus(Target.of(cluster=cluster), settings, hosts, run=run, job=job) as targets:
        if targets is None:
            which = f"run {run}" if run else f"job {job}" if job else "job of yours"
            out.info(f"no running {which} on cluster {cluster}: no GPU to watch")
            yield None
            return
        from vmrun.gpus.fleet import Fleet, FleetWatch

        labels = [t.label for t in targets]
        fleet = Fleet(labels, idle_threshold=idle_threshold, idle_window=idle_window)
        fleet_watch = FleetWatch(targets, settings, fleet, interval=interval, once=once)
        try:
            yield fleet_watch.start()
        finally:
            fleet_watch.stop()


def check_watch(
    hosts: Hosts,
    cluster: str | None,
    run: str | None,
    job: str | None,
    interval: float,
    idle_threshold: float,
    idle_window: float,
) -> None:
    """What `watch` takes: a sampling period nvidia-smi can keep, a threshold in percent,
    and jobs picked on a cluster only, one way."""
    if not interval >= 0.1:
        raise UsageError(f"--interval must be at least 0.1 seconds, got {interval:g}")
    if not 0 <= idle_threshold <= 100:
        raise UsageError(f"--idle-threshold must be 0-100, got {idle_threshold:g}")
    if not idle_window >= 0:
        raise UsageError(f"--idle-window must be 0 or more, got {idle_window:g}")
    from vmrun.backends.select import Target, one_place

    one_place(hosts, cluster)
    target = Target.of(cluster=cluster)  # what it can do: -H's hosts are hosts either way
    if (run or job) and target.capabilities.lacks("scheduler"):
        raise UsageError("--run and --job pick jobs on a cluster: add -C NAME")
    if run and job:
        raise UsageError("--run and --job both pick the job: use one")
