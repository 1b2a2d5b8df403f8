"""Test behaviour added around vmrun's template trainer, which itself carries none.

Put this folder on PYTHONPATH (with `-e` on a run, the cluster's `env`, or a child's
environment) together with one of the variables below: Python imports this module at start
in every process; in a process running the template (its script's name ends in
`template.py`), it loads the template as a module, wraps some of its functions, and runs its
`main()` as the template's `__main__` block does. Every other process (torchrun's agent,
vmrun's host scripts) is left alone, and so is the template when no variable is set. The
conftest fixture `trainer_hooks` gives a copy every test host user can read.

- VMRUN_TEST_HOOK_PID_DIR: each rank writes `rank{R}-restart{C}.pid` there as training starts.
- VMRUN_TEST_HOOK_STALL_AT_EPOCH=N: on the first attempt, every rank blocks after the first
  step of epoch N, having written `stalled-rank{R}.pid` to the pid dir (else the out dir),
  so a test can kill a worker mid-epoch.
- VMRUN_TEST_HOOK_PAUSE_IN_SAVE=N: the Nth snapshot save of a process blocks with part of
  the file written, having written `save-paused.pid` to the out dir.
- VMRUN_TEST_HOOK_EPOCH_DELAY=S: every rank sleeps S seconds after each epoch's metrics and
  snapshot, before the preemption check, so a test can signal or stop a run mid-way.
- VMRUN_TEST_HOOK_GATE=PATH with VMRUN_TEST_HOOK_GATE_AT=N: every rank, having recorded
  epoch N or a later one, waits there until PATH exists, so a run cannot end before the test
  has done what it must mid-run (lose a node, see the recovery) however slow the machine.
  A signal the template notes (its preemption handlers, or Slurm's warned file) ends the
  wait, so its epoch's preemption check still comes: on every node, since the check is
  collective (the rank that noted it leaves PATH.asked-EPOCH beside the gate). With
  VMRUN_TEST_HOOK_GATE_WORLD=W only a run of W ranks is held (one size of a sweep).

A block lasts at most WAIT_S, so a forgotten hook never hangs a test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

PREFIX = "VMRUN_TEST_HOOK_"
WAIT_S = 120.0


def _write_pid(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{os.getpid()}\n")
    tmp.replace(path)  # a reader never sees an empty file


class PausingWriter:
    """A file wrapper that blocks once part of the data is on disk."""

    def __init__(self, fh: Any, marker: Path) -> None:
        self.fh, self.marker, self.calls = fh, marker, 0

    def write(self, data: bytes) -> int:
        self.calls += 1
        if self.calls == 2:  # something is on disk, the rest is not
            self.fh.flush()
            os.fsync(self.fh.fileno())
            _write_pid(self.marker)
            time.sleep(WAIT_S)
        return int(self.fh.write(data))

    def flush(self) -> None:
        self.fh.flush()


def paced(template: ModuleType, delay: float, gate: str | None, gate_at: int) -> Any:
    """record_epoch, then the epoch's delay, then (from epoch `gate_at`) the gate."""
    record_epoch = template.record_epoch
    warned = os.environ.get(template.WARNED_FILE_ENV) or ""

    def asked() -> bool:
        caught = template._caught  # what the template's signal handlers noted
        return bool(caught["signum"] or caught["snapshot"] or (warned and os.path.exists(warned)))

    def record_epoch_hooked(job: Any, epoch: int, *rest: Any) -> bool:
        saved = record_epoch(job, epoch, *rest)
        time.sleep(delay)
        if gate and epoch >= gate_at:
            # a signal noted on one node (a spot notice reaches only its own ranks) ends this
            # epoch's hold on every node: the epoch's check is collective
            told = f"{gate}.asked-{epoch}"
            deadline = time.monotonic() + WAIT_S
            while not (os.path.exists(gate) or os.path.exists(told)):
                if asked():
                    with contextlib.suppress(OSError):
                        open(told, "a").close()
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        return bool(saved)

    return record_epoch_hooked


def install(template: ModuleType, env: dict[str, str]) -> None:
    """Wrap the template's functions for the hooks set in `env`."""
    pid_dir = env.get(PREFIX + "PID_DIR")
    stall_at = env.get(PREFIX + "STALL_AT_EPOCH")
    pause_at = int(env.get(PREFIX + "PAUSE_IN_SAVE") or 0)
    delay = min(float(env.get(PREFIX + "EPOCH_DELAY") or 0), WAIT_S)
    gate, gate_at = env.get(PREFIX + "GATE"), int(env.get(PREFIX + "GATE_AT") or 0)
    world = env.get(PREFIX + "GATE_WORLD")
    if world and world != (env.get("WORLD_SIZE") or "1"):
        gate = None
    out_dir = Path(".")
    train, run_epoch = template.train, template.run_epoch
    save_snapshot = template.save_snapshot

    def train_hooked(args: Any, ctx: Any) -> None:
        nonlocal out_dir
        out_dir = Path(args.out_dir)
        if pid_dir:
            _write_pid(Path(pid_dir) / f"rank{ctx.rank}-restart{ctx.restart}.pid")
        train(args, ctx)

    def stalling(loader: Any, marker: Path) -> Any:
        batches = iter(loader)
        yield next(batches)
        _write_pid(marker)  # asked for the second batch: the first step is done
        time.sleep(WAIT_S)
        yield from batches

    def run_epoch_hooked(ctx: Any, task: str, model: Any, loader: Any, *rest: Any) -> Any:
        if ctx.restart == 0 and str(loader.sampler.epoch) == stall_at:
            marker = Path(pid_dir or out_dir) / f"stalled-rank{ctx.rank}.pid"
            loader = stalling(loader, marker)
        return run_epoch(ctx, task, model, loader, *rest)

    saves = 0

    def save_snapshot_hooked(ctx: Any, args: Any, *rest: Any) -> None:
        nonlocal saves
        saves += 1
        if saves != pause_at:
            return save_snapshot(ctx, args, *rest)
        torch, real_save = template.torch, template.torch.save
        marker = Path(args.out_dir) / "save-paused.pid"
        torch.save = lambda obj, fh, *a, **k: real_save(obj, PausingWriter(fh, marker), *a, **k)
        try:
            return save_snapshot(ctx, args, *rest)
        finally:
            torch.save = real_save

    template.train = train_hooked
    if stall_at:
        template.run_epoch = run_epoch_hooked
    if pause_at:
        template.save_snapshot = save_snapshot_hooked
    if delay > 0 or gate:
        template.record_epoch = paced(template, delay, gate, gate_at)


def run(path: str) -> None:
    """Run the template at `path` with the hooks, then leave as its `__main__` block does."""
    import importlib.util
    import traceback

    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python SCRIPT` would
    spec = importlib.util.spec_from_file_location("template", path)
    assert spec is not None and spec.loader is not None
    template = importlib.util.module_from_spec(spec)
    sys.modules["template"] = template  # dataclasses look their module up
    code = 1
    try:
        spec.loader.exec_module(template)
        install(template, dict(os.environ))
        code = template.main()
    except SystemExit as exc:  # the interpreter's rules for an uncaught SystemExit
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # ... and for Ctrl-C: die of SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if (
    sys.argv
    and sys.argv[0].endswith("template.py")
    and any(key.startswith(PREFIX) for key in os.environ)
):
    run(sys.argv[0])
