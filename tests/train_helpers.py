"""Shared helpers for the training tests: real torchrun, real processes, cleanup by PID.

Every process tree a test starts carries a unique VMRUN_TEST_MARK in its environment;
`kill_marked` finds every process with that mark in /proc (torchrun's workers sit in
sessions of their own, so a process-group kill alone would miss them) and SIGKILLs each
by PID. Tests call it in a `finally`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import ROOT

from vmrun.runs import launch
from vmrun.trainer import TEMPLATE_PATH

TEMPLATE = str(TEMPLATE_PATH)

# A seed-tutorial-style script (CBS-HPC multigpu_torchrun.py) with gloo/CPU instead of
# nccl/GPU: positional total_epochs save_every, LOCAL_RANK only, snapshot.pt in the cwd.
# Its prints are not flushed: vmrun's PYTHONUNBUFFERED keeps them live.
SEED_SCRIPT = """
import os, sys
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            snapshot = torch.load(snapshot_path)
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
            print(f"Resuming training from snapshot at Epoch {self.epochs_run}")
        self.model = DDP(self.model)

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        steps = len(self.train_data)
        print(f"[GPU{self.local_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {steps}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(source), targets)
            loss.backward()
            self.optimizer.step()

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and epoch % self.save_every == 0:
                snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
                torch.save(snapshot, self.snapshot_path)
                print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")
        if self.local_rank == 0:
            torch.save(self.model.module.state_dict(), "finalmodel.pt")
            print("Final model saved at finalmodel.pt")


def main(save_every, total_epochs, batch_size=32):
    init_process_group(backend="gloo")
    dataset = MyTrainDataset(2048)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False,
                        sampler=DistributedSampler(dataset))
    Trainer(model, loader, optimizer, save_every, "snapshot.pt").train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size)
    # The one change for gloo: skip interpreter teardown, which with torch 2.13 aborts now
    # and then once DDP has been used (see vmrun/trainer/template.py's __main__).
    sys.stdout.flush()
    os._exit(0)
"""


@dataclass
class Faulted:
    """A `vmrun train` that a fault ended: its run id, the master's log of it, what vmrun
    said on stderr and its exit code, and how long after the fault vmrun ended."""

    rid: str
    log: Path
    stderr: str
    returncode: int | None
    took: float


def train_then_fault(
    client: Any,
    master_home: Path,
    train_args: list[str],
    fault: Callable[[], object],
    *,
    snapshot_s: float = 120,
    end_s: float = 120,
) -> Faulted:
    """Start `vmrun train TRAIN_ARGS`, wait for its snapshot at epoch 2 in the master's log
    (its home: `master_home`), do `fault`, and wait for vmrun to end; vmrun is killed if
    it has not by then."""
    from conftest import run_id_of, wait_for

    proc = client.popen("train", *train_args)
    try:
        assert proc.stderr is not None
        rid = ""
        for line in proc.stderr:
            if "started on" in line:
                rid = run_id_of(line)
                break
        assert rid, "the run did not start"
        log = master_home / ".vmrun/runs" / rid / "log"
        wait_for(lambda: b"snapshot saved at epoch 2" in log.read_bytes(), snapshot_s, "a snapshot")
        fault()
        began = time.monotonic()
        _, err = proc.communicate(timeout=end_s)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Faulted(rid, log, err, proc.returncode, took)


def hook_env(trainer_hooks: Path, **hooks: str) -> dict[str, str]:
    """The variables that run the template with test hooks (tests/trainer_hooks), for a
    child's environment, a cluster's env or `-e`: `hook_env(dir, EPOCH_DELAY="1")`."""
    return {"PYTHONPATH": str(trainer_hooks)} | {
        f"VMRUN_TEST_HOOK_{name}": value for name, value in hooks.items()
    }


@dataclass
class Gate:
    """A gated run (the trainer hook GATE) holds after epoch `at` until `path` exists: the
    `gate` fixture's, in a folder every test host user can read."""

    hooks: Path
    path: Path

    def env(self, at: int, **more: str) -> dict[str, str]:
        """The variables that gate the template's run (with other hooks: EPOCH_DELAY=...)."""
        return hook_env(self.hooks, GATE=str(self.path), GATE_AT=str(at), **more)

    def options(self, at: int, **more: str) -> list[str]:
        return env_options(self.env(at, **more))

    def open(self) -> None:
        self.path.touch()


def env_options(env: Mapping[str, str]) -> list[str]:
    """`-e NAME=VALUE` for each variable."""
    return [word for name, value in env.items() for word in ("-e", f"{name}={value}")]


def new_mark() -> str:
    return uuid.uuid4().hex


def base_env(mark: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, two-core friendly, tagged with `mark`."""
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("VMRUN_TEST_HOOK_", "TORCHELASTIC_", "PET_")) or key in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            del env[key]
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
            "VMRUN_TEST_MARK": mark,
        }
    )
    env.update(extra or {})
    return env


def pids_with_env(entry: str) -> list[int]:
    """PIDs of live processes whose environment holds `entry` (e.g. 'VMRUN_RUN_ID=x')."""
    needle = entry.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in environ and state != "Z":
            found.append(int(name))
    return found


def kill_marked(mark: str) -> None:
    """SIGKILL, by PID, every process carrying this test's mark; wait until none is left."""
    deadline = time.monotonic() + 10
    while (pids := pids_with_env(f"VMRUN_TEST_MARK={mark}")) and time.monotonic() < deadline:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


@contextmanager
def marked() -> Iterator[str]:
    """A fresh mark whose processes are all killed on the way out, pass or fail."""
    mark = new_mark()
    try:
        yield mark
    finally:
        kill_marked(mark)


def torchrun_argv(args: list[str], *, nproc: int = 2, max_restarts: int = 0) -> list[str]:
    return launch.torchrun_argv(
        sys.executable,
        TEMPLATE,
        args,
        nproc_per_node=nproc,
        max_restarts=max_restarts,
        rdzv_endpoint="localhost:0",
        rdzv_id=f"test-{uuid.uuid4().hex[:8]}",
    )


def run(
    argv: list[str], env: Mapping[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run to completion in a session of its own; output merged into stdout."""
    return subprocess.run(
        argv,
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def read_metrics(out_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def epoch_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("[rank 0] epoch ")]


def pieces_script(lines: int) -> str:
    """Every rank writes each of `lines` lines in two pieces, the other ranks meanwhile (as
    `print(a, b)` does under PYTHONUNBUFFERED): lines that only arrive whole if something
    puts them back together."""
    return (
        "import os, sys, time\n"
        'rank = int(os.environ["RANK"])\n'
        'c = "ab"[rank]\n'
        f"for i in range({lines}):\n"
        '    sys.stdout.write(f"<r{rank} i{i} " + c * 300)\n'
        "    time.sleep(0.002)  # the other rank writes meanwhile\n"
        '    sys.stdout.write(c * 300 + ">\\n")\n'
    )


WHOLE_RANK_LINE = re.compile(r"\[rank(\d)\] <r\1 i(\d+) ([ab])\3{599}>")


def rank_lines(text: str) -> list[tuple[int, int]]:
    """(rank, line number) of every line pieces_script wrote; fails on a line not whole."""
    found = []
    for line in text.split("\n"):
        if "<r" in line:
            match = WHOLE_RANK_LINE.fullmatch(line)
            assert match, f"a broken line: {line[:120]!r}"
            found.append((int(match.group(1)), int(match.group(2))))
    return found


def assert_matches_one_process(final: Path, template_args: list[str], work: Path) -> None:
    """`final` (a DDP run's finalmodel.pt) equals what one process makes with
    `template_args` (the same global batch): real DDP, not independent runs."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")
    }
    alone = subprocess.run(
        [sys.executable, TEMPLATE, *template_args, "--out-dir", str(work)],
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr
    import torch

    ddp = torch.load(final, weights_only=True)
    one = torch.load(work / "finalmodel.pt", weights_only=True)
    assert ddp.keys() == one.keys()
    for key in ddp:
        assert torch.allclose(ddp[key], one[key], atol=1e-5), key


def event_scalars(out_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the TensorBoard events of `out_dir`, as TensorBoard reads them
    (purges applied): tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out_dir))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def event_hparams(out_dir: Path) -> tuple[dict[str, object], list[str], str]:
    """What the HPARAMS tab reads from `out_dir`: (settings, metric tags, session status)."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    events = EventAccumulator(str(out_dir))
    events.Reload()
    content = {
        tag.rsplit("/", 1)[-1]: plugin_data_pb2.HParamsPluginData.FromString(raw)
        for tag, raw in events.PluginTagToContent("hparams").items()
    }
    settings = MessageToDict(content["session_start_info"].session_start_info)["hparams"]
    tags = [m.name.tag for m in content["experiment"].experiment.metric_infos]
    end = content.get("session_end_info")
    status = api_pb2.Status.Name(end.session_end_info.status) if end else ""
    return settings, tags, status
