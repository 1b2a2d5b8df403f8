"""vmrun's template trainer: a small DDP job that really learns, snapshots and resumes.

    torchrun --nproc-per-node=2 template.py 50 10        # 50 epochs, snapshot every 10
    python template.py 3 1                               # one process, no torchrun
    python template.py 10 5 --task classify              # 4 classes, with accuracy

It replaces the seed tutorial's trainer (whose cross-entropy on a 1-column target is always
0) with tasks a 2-layer MLP visibly learns, on 20 Gaussian inputs and a teacher drawn from
`--seed`: `--task regress` (default; MSE) fits |x·W1|·W2 (normalised); `--task classify`
(cross-entropy, 4 outputs) predicts which of 4 outputs tanh(x·W1)·Wc scores highest. The
data is generated on the fly, so nothing is downloaded. It imports only torch and the
stdlib (tensorboard if installed): it is copied to GPU hosts and run there as a plain script.

As a start for your own script: read from `main` at the bottom, `setup` (torchrun's
environment, device, process group), `train` (model, resume, data), `train_epochs` (each
epoch: `run_epoch`, `evaluate`, `record_epoch`, the preemption check); your model, data and
loss go where `build_model`, `make_datasets` and `loss_of` are.

Conventions (the CLI and the tests rely on them):
- Epochs are 1-based in logs, metrics and snapshots. A snapshot is written after epoch `e`
  when `e % save_every == 0` (0-based: `(e+1) % K == 0`), so `50 10` saves after 10..50.
  `snapshot["epoch"]` is the last completed epoch; a resumed run continues at the NEXT one
  (the seed re-ran the saved epoch).
- Outputs go to `--out-dir` (default: the current directory): `snapshot.pt` (model,
  optimizer, epoch, RNG states), `finalmodel.pt` (a plain state dict for `build_model(task)`),
  `metrics.jsonl` (one line per epoch). Only global rank 0 writes, atomically (temp file,
  fsync, rename), so a kill mid-save never leaves a torn file under the final name.
- metrics.jsonl keys: `epoch, loss, samples_per_s, epoch_time_s, world_size, lr, eval_loss`;
  classify adds `accuracy` (training, as trained through the epoch) and `eval_accuracy`
  (fractions 0..1). loss/accuracy are means over every rank's samples; epoch_time_s (and so
  samples_per_s) is the training pass alone, without the evaluation.
- Evaluation, after every epoch: `--eval-size` held-out samples (default 512) from seed +
  EVAL_SEED_OFFSET with the training set's teacher, drawn with a generator of their own (the
  global RNG, and so training, is as without them). Rank r evaluates every W-th sample from
  r with the bare model; one all_reduce sums the loss, count and hits, so any world size
  reports the same numbers for the same weights.
- TensorBoard: where `torch.utils.tensorboard` imports (tensorboard installed), rank 0 also
  writes event files to `--out-dir`, flushed every epoch: the metrics as scalars at step =
  epoch, tags `train/loss`, `train/accuracy`, `train/samples_per_s`, `train/epoch_time_s`,
  `train/lr`, `eval/loss`, `eval/accuracy` (EVENT_TAGS); and, for the HPARAMS tab, the run's
  settings once at step 0 (task, world_size, nodes when the launcher says, batch_size,
  global_batch_size, lr, momentum, dataset_size, seed) with `train/loss`, `eval/loss` (and
  the accuracies) as its metrics, and a success status when the run finishes. A resumed
  attempt opens its writer with purge_step = its first epoch, so TensorBoard drops what an
  earlier attempt wrote for the epochs it re-runs (as metrics.jsonl is cut back to them).
  Without tensorboard: one line saying so, no events, nothing else changes.
- Resume: rank 0 alone reads `snapshot.pt` and broadcasts it, so every rank starts from the
  same state even when the other nodes have no copy of the file. A snapshot of another
  `--task` is refused (one line, exit 1) rather than half loaded.
- Without torchrun (no RANK/WORLD_SIZE/MASTER_ADDR in the environment) it runs as a single
  process with no process group and no DDP wrapper; under torchrun, even a world of 1 uses
  a process group, so the code path is the one multi-GPU runs take.
- Data sharding: DistributedSampler (shuffle seeded by `--seed` + epoch, the same permutation
  for any world size) hands rank r every W-th index, so with world W and per-rank batch B
  the global step k covers positions [kWB, (k+1)WB) of that permutation: a 1-process run
  with batch W*B sees the same global batches (exactly, when W*B divides the dataset size;
  incomplete last batches are dropped). DDP averages the per-rank mean losses' gradients,
  which equals the gradient of the global mean; plain SGD (`--momentum 0`, the default) then
  keeps the two runs equal to float rounding.
- Preemption (Slurm sends SIGUSR2 before the time limit or on preemption, as vmrun's
  `--signal=USR2@90` asks; some clusters send SIGTERM instead): SIGUSR2, and SIGTERM only when
  VMRUN_REQUEUE_FILE is set, just flag the process (one line on stderr). After each epoch
  but the last, the ranks agree whether any was signalled (one all_reduce(MAX) of the
  signal's number); if so, rank 0 snapshots that epoch E and atomically writes
  `{"epoch": E, "signal": "SIGUSR2"}` to $VMRUN_REQUEUE_FILE (if set), and every rank exits 0
  without finalmodel.pt. The requeued job runs the same command and resumes at E+1 (rank 0
  removes a leftover requeue file at start, so one exists after exit only if the run stopped
  for requeue). Without VMRUN_REQUEUE_FILE, SIGTERM keeps its default: the process ends at
  once, as `vmrun stop` on SSH hosts expects (VMRUN_REQUEUE_ON_TERM=0 keeps it so with the
  file: a `--recover` run on hosts stops for requeue on SIGUSR2 alone). A script of your
  own can follow the same protocol: catch SIGUSR2 (and SIGTERM if VMRUN_REQUEUE_FILE is
  set), save at the next safe point, write the file, exit 0. $VMRUN_WARNED_FILE existing
  counts as a SIGUSR2 (vmrun's batch script writes it on the warning, which a process still
  starting up would miss).
- Heartbeats and step times: with $VMRUN_BEAT_DIR set (vmrun sets it), every rank rewrites
  `rank-R` there at most once a second while it steps (JSON: rank, epoch, step, t): vmrun's
  hang watcher reads them as progress. Each rank times its steps' own work (waiting for the
  batch, then the forward pass and loss: on CUDA by events, read once an epoch; never the
  backward, where DDP's all_reduce makes every rank wait for the slowest); after each epoch
  one all_reduce gathers the mean per rank into metrics.jsonl's `rank_step_s` (indexed by
  rank) and, where torchrun says it, `rank_node` (each rank's node, GROUP_RANK). A rank
  slower than the median of the others by SLOW_RATIO is named in the log once, when the slow
  ranks change.
- Snapshot now, go on: SIGUSR1 (vmrun names it in $VMRUN_SNAPSHOT_SIGNAL; it sends it on a
  cloud's early warning, such as a spot VM's rebalance recommendation) is agreed the same way
  (the stopping signals win); rank 0 snapshots that epoch unless it just did, and training
  goes on.
- `--fsdp`: the model is sharded with FSDP2 (`fully_shard` on each Linear, then the whole;
  gloo on CPU), and the checkpoints are torch.distributed.checkpoint (DCP) folders,
  `checkpoints/epoch-N/` in place of snapshot.pt: every rank writes its own shard file
  (`__<rank>_<n>.distcp`, on its own node), then rank 0 `.metadata`, which names every file;
  model and optimizer state from `get_state_dict`, the epoch, task, arguments and RNG state
  beside them. Where the torch has `dcp.async_save`, training goes on while the files are
  written (one save at a time: the next one, the stop for requeue and the end wait for it);
  each save's cost to training is in the log and in `checkpoints.jsonl` (rank 0, one line
  per save once written: waited_s for the previous save, staged_s in the save call itself,
  blocked_s the two with the state dict, written_s until the files were all there). The
  save schedule, SIGUSR1, SIGUSR2/SIGTERM and the requeue file are as above. Resume: the
  newest folder that is complete on every rank (its `.metadata` there, and every file it
  names there and as long as its pieces need: vmrun.hostside.checkpoint_layout's rule) is
  loaded with `dcp.load` on every rank; each newer one is named with what it lacks.
  finalmodel.pt is the full state dict, gathered to rank 0: the same plain file as without.
  Without torchrun, `--fsdp` runs a process group of one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

IN_FEATURES = 20
HIDDEN = 64
TEACHER_HIDDEN = 16
CLASSES = 4
TASKS = ("regress", "classify")
EVAL_SEED_OFFSET = 1_000_003  # the eval inputs' generator: never the training set's seed
SNAPSHOT = "snapshot.pt"
FINAL_MODEL = "finalmodel.pt"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"  # --fsdp: CHECKPOINTS/epoch-N/, one DCP folder per save
CHECKPOINT_LOG = "checkpoints.jsonl"  # --fsdp: what each save cost (rank 0)
REQUEUE_FILE_ENV = "VMRUN_REQUEUE_FILE"
BEAT_DIR_ENV = "VMRUN_BEAT_DIR"
# a rank is slow when its step takes this much longer than the median of the others' and at
# least SLOW_GAP_S more (vmrun.results.stragglers keeps the same rule for status and report)
SLOW_RATIO = 1.2
SLOW_GAP_S = 0.005
WARNED_FILE_ENV = "VMRUN_WARNED_FILE"
# metrics.jsonl key -> TensorBoard tag (step: the epoch)
EVENT_TAGS = {
    "loss": "train/loss",
    "accuracy": "train/accuracy",
    "samples_per_s": "train/samples_per_s",
    "epoch_time_s": "train/epoch_time_s",
    "lr": "train/lr",
    "eval_loss": "eval/loss",
    "eval_accuracy": "eval/accuracy",
}
_caught = {"signum": 0, "snapshot": 0}  # set by the signal handlers, read after each epoch


def build_model(task: str = "regress") -> nn.Module:
    """The bare model; `finalmodel.pt` of a run with `--task TASK` loads into
    `build_model(TASK)` with strict=True."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    outputs = CLASSES if task == "classify" else 1
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, outputs))


def make_datasets(
    task: str, size: int, eval_size: int, seed: int
) -> tuple[TensorDataset, TensorDataset]:
    """Deterministic synthetic data, (train, eval): the same arguments give the same tensors.

    Only local generators are used (the global RNG, which drives init and shuffling, is left
    alone), and the training set is drawn first, so adding the eval set or the classify
    teacher changed no training tensor. The eval inputs come from seed + EVAL_SEED_OFFSET;
    the teacher, and the regression targets' normalisation, are the training set's.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(size, IN_FEATURES, generator=gen)
    w1 = torch.randn(IN_FEATURES, TEACHER_HIDDEN, generator=gen) / IN_FEATURES**0.5
    w2 = torch.randn(TEACHER_HIDDEN, 1, generator=gen) / TEACHER_HIDDEN**0.5
    w_class = torch.randn(TEACHER_HIDDEN, CLASSES, generator=gen) / TEACHER_HIDDEN**0.5
    eval_gen = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    x_eval = torch.randn(eval_size, IN_FEATURES, generator=eval_gen)
    if task == "classify":  # the class a tanh teacher with 4 outputs scores highest
        label = [(torch.tanh(inputs @ w1) @ w_class).argmax(dim=1) for inputs in (x, x_eval)]
        return TensorDataset(x, label[0]), TensorDataset(x_eval, label[1])
    y, y_eval = (x @ w1).abs() @ w2, (x_eval @ w1).abs() @ w2
    mean, std = y.mean(), y.std()
    return TensorDataset(x, (y - mean) / std), TensorDataset(x_eval, (y_eval - mean) / std)


def loss_of(task: str, out: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> Any:
    if task == "classify":
        return F.cross_entropy(out, target, reduction=reduction)
    return F.mse_loss(out, target, reduction=reduction)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="vmrun template trainer (DDP, snapshot, resume)")
    p.add_argument("total_epochs", type=int, help="epochs to train in all")
    p.add_argument("save_every", type=int, help="write snapshot.pt after every K-th epoch")
    p.add_argument("--batch-size", "--batch_size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (0: plain SGD)")
    p.add_argument("--seed", type=int, default=0, help="data, init and shuffle seed")
    p.add_argument("--dataset-size", type=int, default=2048)
    p.add_argument("--eval-size", type=int, default=512, help="held-out samples")
    p.add_argument("--task", choices=TASKS, default="regress", help="classify: 4 classes")
    p.add_argument("--out-dir", default=".", help="where snapshot/final model/metrics go")
    p.add_argument(
        "--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True)"
    )
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard the model with FSDP2; sharded DCP checkpoints in checkpoints/epoch-N/",
    )
    args = p.parse_args(argv)
    for name in ("total_epochs", "save_every", "batch_size", "dataset_size", "eval_size"):
        if getattr(args, name) < 1:
            p.error(f"{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lr <= 0:
        p.error(f"lr must be > 0, got {args.lr}")
    return args


def _torchrun_env() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _line_prefix(rank: int) -> str:
    """`[rank R] `, unless torchrun already prefixes each line (see Ctx.say)."""
    return "" if "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in os.environ else f"[rank {rank}] "


@dataclass
class Ctx:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    distributed: bool
    device: torch.device
    backend: str
    restart: int

    def say(self, text: str, *, every_rank: bool = False) -> None:
        """Print from rank 0 (or every rank), prefixed with the rank unless torchrun already
        prefixes each line (vmrun's multi-node launches: `--tee` with a rank template)."""
        if every_rank or self.rank == 0:
            print(f"{_line_prefix(self.rank)}{text}", flush=True)


def setup() -> Ctx:
    """Read torchrun's env; pick the device from LOCAL_RANK before the process group."""
    env = os.environ
    distributed = _torchrun_env()
    rank = int(env["RANK"]) if distributed else 0
    world = int(env["WORLD_SIZE"]) if distributed else 1
    local_rank = int(env.get("LOCAL_RANK", "0")) if distributed else 0
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise SystemExit(
                f"LOCAL_RANK {local_rank} but only {count} CUDA devices here;"
                " launch at most one process per GPU (--nproc-per-node=gpu)"
            )
        torch.cuda.set_device(local_rank)  # before init_process_group (pytorch/examples#1285)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if distributed:
        dist.init_process_group(backend=backend)
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return Ctx(rank, local_rank, world, distributed, device, backend, restart)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same directory, fsync, rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove_stale_temp_files(out_dir: Path) -> None:
    """Temp files left by a writer that was killed mid-save (rank 0, at start)."""
    for name in (SNAPSHOT, FINAL_MODEL, METRICS):
        for stale in out_dir.glob(f".{name}.tmp-*"):
            stale.unlink(missing_ok=True)


def broadcast_from_rank0(ctx: Ctx, payload: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's payload on every rank, as bytes in uint8 tensors.

    Not broadcast_object_list: in torch 2.13 it needs NumPy, which torch itself does not
    install (a bare `pip install torch` environment has none).
    """
    data = b""
    if ctx.rank == 0:
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        data = buffer.getvalue()
    device = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    blob = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if ctx.rank == 0
        else torch.empty(int(size.item()), dtype=torch.uint8)
    )
    blob = blob.to(device)
    dist.broadcast(blob, src=0)
    if ctx.rank == 0:
        return payload
    raw = bytes(blob.cpu().tolist())
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def load_snapshot(ctx: Ctx, path: Path) -> dict[str, Any] | None:
    """Rank 0 reads the snapshot (if any) and broadcasts it: other ranks never touch the file."""
    payload: dict[str, Any] = {"state": None, "error": None}
    if ctx.rank == 0 and path.exists():
        try:
            payload["state"] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            payload["error"] = f"cannot load {path}: {type(exc).__name__}: {exc}"
    if ctx.distributed:
        payload = broadcast_from_rank0(ctx, payload)
    if payload["error"]:
        raise SystemExit(f"[rank {ctx.rank}] {payload['error']}; move it away to start afresh")
    return payload["state"]


def truncate_metrics(path: Path, last_epoch: int) -> None:
    """After a resume, drop lines of epochs the snapshot does not include (they re-run)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["epoch"]) <= last_epoch:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_text(path, "".join(kept))


def rng_state(ctx: Ctx) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if ctx.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(ctx.device)
    return state


def set_rng_state(ctx: Ctx, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if ctx.device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], ctx.device)


def cpu_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The bare model's weights on the CPU: loadable anywhere, no `module.` prefix."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def resume(
    ctx: Ctx, task: str, model: nn.Module, optimizer: torch.optim.Optimizer, out_dir: Path
) -> int:
    """Restore the snapshot (if any) on every rank; return the first epoch to train."""
    if ctx.rank == 0:
        remove_stale_temp_files(out_dir)
        if os.environ.get(REQUEUE_FILE_ENV):  # a leftover from the stop this run resumes
            Path(os.environ[REQUEUE_FILE_ENV]).unlink(missing_ok=True)
    state = load_snapshot(ctx, out_dir / SNAPSHOT)
    start = 1
    if state is not None:
        saved_task = state.get("args", {}).get("task", "regress")
        if saved_task != task:
            raise SystemExit(
                f"[rank {ctx.rank}] {out_dir / SNAPSHOT} is from --task {saved_task}, this run"
                f" is --task {task}: use --task {saved_task}, or another --out-dir"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(ctx, state["rng"])
        start = int(state["epoch"]) + 1
        done = f"epochs 1-{start - 1}" if start > 2 else "epoch 1"
        ctx.say(f"resumed from snapshot at epoch {start} ({done} done)", every_rank=True)
    if ctx.rank == 0:
        truncate_metrics(out_dir / METRICS, start - 1)  # metrics follow the trajectory trained
    return start


def resume_sharded(ctx: Ctx, sharded: Sharded, task: str, out_dir: Path) -> int:
    """resume() for --fsdp: the same chores, then the newest complete DCP checkpoint."""
    if ctx.rank == 0:
        remove_stale_temp_files(out_dir)
        if os.environ.get(REQUEUE_FILE_ENV):  # a leftover from the stop this run resumes
            Path(os.environ[REQUEUE_FILE_ENV]).unlink(missing_ok=True)
    start = sharded.resume(task)
    if ctx.rank == 0:
        truncate_metrics(out_dir / METRICS, start - 1)  # metrics follow the trajectory trained
    return start


def make_data(
    args: argparse.Namespace, ctx: Ctx
) -> tuple[DistributedSampler, DataLoader, tuple[torch.Tensor, torch.Tensor]]:
    """The training loader (rank r gets every W-th index of one seeded permutation, see the
    module docstring) and this rank's eval shard (every W-th eval sample from r, on the
    device: the ranks' shards together are the eval set, each sample once)."""
    dataset, eval_set = make_datasets(args.task, args.dataset_size, args.eval_size, args.seed)
    sampler = DistributedSampler(
        dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        drop_last=True,  # every step is a full global batch
        pin_memory=ctx.device.type == "cuda",
    )
    if len(loader) == 0:
        raise SystemExit(
            f"dataset-size {args.dataset_size} is too small for batch-size {args.batch_size}"
            f" x world size {ctx.world_size}"
        )
    x_eval, y_eval = (t[ctx.rank :: ctx.world_size].to(ctx.device) for t in eval_set.tensors)
    return sampler, loader, (x_eval, y_eval)


@dataclass
class EpochStats:
    """One epoch's training numbers, over every rank."""

    loss: float
    samples: int
    seconds: float
    accuracy: float | None  # classify only: the fraction of training samples right
    rank_step_s: list[float] | None = None  # each rank's mean step work (distributed runs)
    rank_node: list[int] | None = None  # each rank's node, where torchrun says it


class StepTimer:
    """This rank's own work per step: waiting for its batch (wall clock) plus the forward
    pass and loss (CUDA events on a GPU, read at the epoch's end so no step waits for them;
    wall clock on the CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds, self.steps = 0.0, 0
        self.events: list[tuple[Any, Any]] = []
        self.began = 0.0

    def start(self) -> None:
        if self.cuda:
            self.events.append(
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            )
            self.events[-1][0].record()
        else:
            self.began = time.perf_counter()

    def stop(self) -> None:
        self.steps += 1
        if self.cuda:
            self.events[-1][1].record()
        else:
            self.seconds += time.perf_counter() - self.began

    def mean(self) -> float:
        """Seconds per step (call after the epoch's last step: it may wait for the GPU)."""
        gpu = 0.0
        if self.events:
            self.events[-1][1].synchronize()
            gpu = sum(a.elapsed_time(b) for a, b in self.events) / 1000
        return (self.seconds + gpu) / max(self.steps, 1)


class Beat:
    """This rank's heartbeat in $VMRUN_BEAT_DIR/rank-R, rewritten at most once a second."""

    def __init__(self, rank: int):
        folder = os.environ.get(BEAT_DIR_ENV)
        self.path = Path(folder) / f"rank-{rank}" if folder else None
        self.rank, self.due = rank, 0.0

    def step(self, epoch: int, step: int) -> None:
        now = time.time()
        if self.path is None or now < self.due:
            return
        self.due = now + 1.0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(json.dumps({"rank": self.rank, "epoch": epoch, "step": step, "t": now}))
            os.replace(tmp, self.path)
        except OSError:
            self.path = None  # a heartbeat is never worth failing the run for


def slow_ranks(step_s: Sequence[float]) -> list[tuple[int, float, float]]:
    """(rank, its step time, the median of the others') for each rank slower than the
    others by SLOW_RATIO and SLOW_GAP_S."""
    slow = []
    for rank, mine in enumerate(step_s):
        others = sorted(t for r, t in enumerate(step_s) if r != rank)
        if not others:
            continue
        middle = len(others) // 2
        typical = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
        if typical > 0 and mine >= SLOW_RATIO * typical and mine - typical >= SLOW_GAP_S:
            slow.append((rank, mine, typical))
    return slow


def run_epoch(
    ctx: Ctx,
    task: str,
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    epoch: int = 0,
    beat: Beat | None = None,
) -> EpochStats:
    """One pass over this rank's shard; the global mean loss (and accuracy) as trained, and
    each rank's step time (see StepTimer)."""
    model.train()
    began = time.perf_counter()
    timer = StepTimer(ctx.device)
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss sum, samples, right
    batches = iter(loader)
    step = 0
    while True:
        waited = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        timer.seconds += time.perf_counter() - waited
        timer.start()
        x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
        out = model(x)
        loss = loss_of(task, out, y)
        timer.stop()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        totals[0] += loss.detach().double() * x.shape[0]
        totals[1] += x.shape[0]
        if task == "classify":
            totals[2] += (out.detach().argmax(dim=1) == y).sum()
        step += 1
        if beat is not None:
            beat.step(epoch, step)
    step_s, nodes = None, None
    if ctx.distributed:
        dist.all_reduce(totals)
        step_s, nodes = gather_step_times(ctx, timer.mean())
    elapsed = time.perf_counter() - began
    accuracy = (totals[2] / totals[1]).item() if task == "classify" else None
    return EpochStats(
        (totals[0] / totals[1]).item(), int(totals[1].item()), elapsed, accuracy, step_s, nodes
    )


def gather_step_times(ctx: Ctx, mine: float) -> tuple[list[float], list[int] | None]:
    """Every rank's step time (and node, where GROUP_RANK says it), on every rank: one
    all_reduce of a tensor in which each rank fills its own places."""
    node = os.environ.get("GROUP_RANK", "")
    table = torch.zeros(2 * ctx.world_size, dtype=torch.float64, device=ctx.device)
    table[ctx.rank] = mine
    table[ctx.world_size + ctx.rank] = int(node) if node.isdigit() else -1
    dist.all_reduce(table)
    values = table.tolist()
    nodes = [int(n) for n in values[ctx.world_size :]]
    return values[: ctx.world_size], nodes if min(nodes) >= 0 else None


def evaluate(
    ctx: Ctx, task: str, bare: nn.Module, shard: tuple[torch.Tensor, torch.Tensor]
) -> tuple[float, float | None]:
    """Mean loss (and accuracy, classify) over the whole eval set: every rank its shard, with
    the bare model (no DDP hooks, no gradients, no RNG), then one all_reduce of the sums, so
    every world size reports the same numbers for the same weights."""
    x, y = shard
    bare.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss sum, samples, right
    with torch.no_grad():
        out = bare(x).double()
        totals[0] = loss_of(task, out, y if task == "classify" else y.double(), "sum")
        totals[1] = x.shape[0]
        if task == "classify":
            totals[2] = (out.argmax(dim=1) == y).sum()
    if ctx.distributed:
        dist.all_reduce(totals)
    count = max(totals[1].item(), 1.0)
    return totals[0].item() / count, totals[2].item() / count if task == "classify" else None


def install_preemption_handlers() -> None:
    """SIGUSR2 always, SIGTERM only for a requeueable job: the handler notes the signal and
    says so in one line (os.write: a print here could re-enter a buffered stream)."""

    prefix = _line_prefix(int(os.environ["RANK"]) if _torchrun_env() else 0)

    def note(signum: int, _frame: object) -> None:
        _caught["signum"] = max(_caught["signum"], signum)
        name = signal.Signals(signum).name
        os.write(2, f"{prefix}got {name}: will stop after this epoch\n".encode())

    def snapshot(signum: int, _frame: object) -> None:
        _caught["snapshot"] = signum
        os.write(2, f"{prefix}got SIGUSR1: will snapshot after this epoch\n".encode())

    signal.signal(signal.SIGUSR2, note)
    signal.signal(signal.SIGUSR1, snapshot)
    if os.environ.get(REQUEUE_FILE_ENV) and os.environ.get("VMRUN_REQUEUE_ON_TERM") != "0":
        signal.signal(signal.SIGTERM, note)


def agreed_signal(ctx: Ctx) -> int:
    """The signal some rank caught (0: none), the same on every rank. $VMRUN_WARNED_FILE
    existing counts as SIGUSR2: the batch script writes it when the warning came before
    this process could catch it (while it was still importing torch)."""
    caught = _caught["signum"] or _caught["snapshot"]
    warned = os.environ.get(WARNED_FILE_ENV)
    if not caught and warned and os.path.exists(warned):
        caught = int(signal.SIGUSR2)
    if not ctx.distributed:
        return caught
    flag = torch.tensor([caught], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def save_snapshot(
    ctx: Ctx,
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    epoch: int,
) -> None:
    snapshot = {
        "model": cpu_state_dict(model),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "rng": rng_state(ctx),
        "world_size": ctx.world_size,
        "args": {k: v for k, v in vars(args).items() if k != "out_dir"},
    }
    path = Path(args.out_dir) / SNAPSHOT
    atomic_save(snapshot, path)
    ctx.say(f"snapshot saved at epoch {epoch} -> {path}")


def log_epoch(
    ctx: Ctx,
    args: argparse.Namespace,
    lr: float,
    epoch: int,
    stats: EpochStats,
    evaluated: tuple[float, float | None],
) -> dict[str, Any]:
    """Append the epoch's line to metrics.jsonl, say it; returns the line."""
    eval_loss, eval_accuracy = evaluated
    line: dict[str, Any] = {"epoch": epoch, "loss": stats.loss}
    if stats.accuracy is not None:
        line["accuracy"] = stats.accuracy
    line.update(
        samples_per_s=stats.samples / stats.seconds,
        epoch_time_s=stats.seconds,
        world_size=ctx.world_size,
        lr=lr,
        eval_loss=eval_loss,
    )
    if eval_accuracy is not None:
        line["eval_accuracy"] = eval_accuracy
    if stats.rank_step_s is not None:
        line["rank_step_s"] = [round(t, 6) for t in stats.rank_step_s]
    if stats.rank_node is not None:
        line["rank_node"] = stats.rank_node
    with open(Path(args.out_dir) / METRICS, "a") as fh:
        fh.write(json.dumps(line) + "\n")
    accuracies = (
        f" acc {stats.accuracy:.3f}" if stats.accuracy is not None else "",
        f" eval_acc {eval_accuracy:.3f}" if eval_accuracy is not None else "",
    )
    ctx.say(
        f"epoch {epoch}/{args.total_epochs} loss {stats.loss:.4f}{accuracies[0]} eval_loss"
        f" {eval_loss:.4f}{accuracies[1]} samples/s {line['samples_per_s']:.1f}"
        f" time {stats.seconds:.3f}s"
    )
    return line


class Events:
    """TensorBoard events beside metrics.jsonl, written by rank 0 where tensorboard is
    installed (torch's SummaryWriter needs it); elsewhere every method does nothing."""

    def __init__(self, writer: Any = None) -> None:
        self.writer = writer

    @classmethod
    def open(cls, ctx: Ctx, out_dir: Path, start: int) -> Events:
        if ctx.rank != 0:
            return cls()
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:  # not installed, or one this torch cannot use
            ctx.say(f"no TensorBoard events ({exc}): pip install tensorboard to get them")
            return cls()
        # purge_step: TensorBoard drops what an earlier attempt wrote for epochs >= start,
        # as truncate_metrics drops their lines, so a resumed run has each epoch once
        return cls(SummaryWriter(log_dir=str(out_dir), purge_step=start))

    def hparams(self, values: dict[str, Any], tags: list[str]) -> None:
        """The run's settings for the HPARAMS tab, once (step 0), beside the metric tags
        whose latest values it shows."""
        if self.writer is not None:
            from torch.utils.tensorboard.summary import hparams

            experiment, session_start, _ = hparams(values, dict.fromkeys(tags, 0.0))
            for summary in (experiment, session_start):
                self.writer.file_writer.add_summary(summary, 0)

    def epoch(self, line: dict[str, Any]) -> None:
        if self.writer is not None:
            for key, tag in EVENT_TAGS.items():
                if key in line:
                    self.writer.add_scalar(tag, line[key], global_step=line["epoch"])
            self.writer.flush()  # a live TensorBoard sees each epoch as it ends

    def finished(self, epoch: int) -> None:
        """The session's end (status: success) for the HPARAMS tab."""
        if self.writer is not None:
            from torch.utils.tensorboard.summary import hparams

            self.writer.file_writer.add_summary(hparams({}, {})[2], epoch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def node_count(ctx: Ctx) -> int | None:
    """Nodes in the job, as the launcher tells: torchrun's GROUP_WORLD_SIZE, else Slurm's
    node count; None when neither does."""
    if not ctx.distributed:
        return 1
    for key in ("GROUP_WORLD_SIZE", "SLURM_JOB_NUM_NODES"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return None


def hparam_values(args: argparse.Namespace, ctx: Ctx) -> dict[str, Any]:
    values: dict[str, Any] = {
        "task": args.task,
        "world_size": ctx.world_size,
        "batch_size": args.batch_size,
        "global_batch_size": args.batch_size * ctx.world_size,
        "lr": args.lr,
        "momentum": args.momentum,
        "dataset_size": args.dataset_size,
        "seed": args.seed,
    }
    if (nodes := node_count(ctx)) is not None:
        values["nodes"] = nodes
    return values


def checkpoint_problem(folder: Path) -> str:
    """Why the DCP checkpoint in `folder` is not complete here ("": it is): its .metadata
    (read by torch, which wrote it) names each file and where its pieces end."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except FileNotFoundError:
        return "missing .metadata"
    except Exception as exc:  # a torn or foreign .metadata
        return f"unreadable .metadata ({type(exc).__name__})"
    needs: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needs[info.relative_path] = max(needs.get(info.relative_path, 0), info.offset + info.length)
    missing, short = [], []
    for name, size in sorted(needs.items()):
        try:
            have = (folder / name).stat().st_size
        except OSError:
            missing.append(name)
            continue
        if have < size:
            short.append(f"{name} ({have} of {size} bytes)")
    return "; ".join(
        [
            *(["missing " + ", ".join(missing)] if missing else []),
            *(["short " + ", ".join(short)] if short else []),
        ]
    )


def shards(count: int) -> str:
    return f"{count} shard" if count == 1 else f"{count} shards"


def shard_count(folder: Path) -> int:
    from torch.distributed.checkpoint import FileSystemReader

    storage = FileSystemReader(str(folder)).read_metadata().storage_data
    return len({info.relative_path for info in storage.values()})


class Sharded:
    """--fsdp's checkpoints: a DCP folder per save, `CHECKPOINTS/epoch-N/`, written by every
    rank (async_save where this torch has it: one save in flight at a time)."""

    def __init__(self, ctx: Ctx, out_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer):
        import torch.distributed.checkpoint as dcp

        self.ctx, self.out_dir, self.model, self.optimizer = ctx, out_dir, model, optimizer
        self.root = out_dir / CHECKPOINTS
        # the saves' own collectives run beside training's, so on a group of their own;
        # gloo, as async_save needs a CPU backend
        self.group = dist.new_group(backend="gloo")
        self.can_async = hasattr(dcp, "async_save")
        self.pending: Any = None
        self.written_at = 0.0
        self.costs: dict[str, Any] = {}

    def state(self, epoch: int, args: argparse.Namespace | None) -> dict[str, Any]:
        """What a checkpoint holds: DCP-ready model and optimizer state, and `extra` (the
        epoch, task, arguments and RNG state, as one JSON string) and the torch RNG state."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        extra = ""
        if args is not None:
            py_state = random.getstate()
            extra = json.dumps(
                {
                    "epoch": epoch,
                    "task": args.task,
                    "world_size": self.ctx.world_size,
                    "args": {k: v for k, v in vars(args).items() if k != "out_dir"},
                    "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
                }
            )
        return {
            "model": model_state,
            "optim": optim_state,
            "extra": extra,
            "rng": torch.get_rng_state(),
        }

    def save(self, args: argparse.Namespace, epoch: int) -> None:
        """Every rank: wait for the previous save, clear an older try's files of this
        epoch, start this one. The time training stood still for it is said."""
        import torch.distributed.checkpoint as dcp

        began = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - began
        folder = self.root / f"epoch-{epoch}"
        if self.ctx.local_rank == 0 and folder.exists():  # once per node, .metadata first
            (folder / ".metadata").unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)
        dist.barrier(group=self.group)  # no rank writes into the folder before it is cleared
        folder.mkdir(parents=True, exist_ok=True)
        state = self.state(epoch, args)
        staging = time.perf_counter()
        if self.can_async:
            self.pending = dcp.async_save(
                state, checkpoint_id=str(folder), process_group=self.group
            )
        else:
            self.pending = dcp.save(state, checkpoint_id=str(folder), process_group=self.group)
        now = time.perf_counter()
        self.written_at = 0.0
        if hasattr(self.pending, "add_done_callback"):  # when the files are all there
            self.pending.add_done_callback(
                lambda _: setattr(self, "written_at", time.perf_counter())
            )
        self.costs = {
            "epoch": epoch,
            "path": f"{CHECKPOINTS}/epoch-{epoch}",
            "async": self.can_async,
            "waited_s": round(waited, 6),
            "staged_s": round(now - staging, 6),
            "blocked_s": round(now - began, 6),
            "began": now if self.can_async else staging,
        }
        how = "writing in the background" if self.can_async else "written"
        self.ctx.say(
            f"checkpoint {self.costs['path']} {how}: training blocked {now - began:.3f}s"
            f" ({waited:.3f}s waiting for the previous save, {now - staging:.3f}s in the save)"
        )
        if not self.can_async:
            self.wait()

    def wait(self) -> None:
        """Every rank: until the save in flight (if any) is written; rank 0 then says so and
        logs it to checkpoints.jsonl."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        metadata = pending.result() if hasattr(pending, "result") else pending
        costs = self.costs
        written_at = self.written_at or time.perf_counter()
        costs["written_s"] = round(written_at - costs.pop("began"), 6)
        storage = getattr(metadata, "storage_data", None) or {}
        costs["shards"] = len({info.relative_path for info in storage.values()})
        costs["bytes"] = sum(info.length for info in storage.values())
        if self.ctx.rank == 0:
            self.ctx.say(
                f"checkpoint {costs['path']} complete: {shards(costs['shards'])},"
                f" {costs['bytes']} bytes, written in {costs['written_s']:.3f}s"
            )
            with open(self.out_dir / CHECKPOINT_LOG, "a") as fh:
                fh.write(json.dumps(costs) + "\n")

    def poll(self) -> None:
        """wait() for a save already written (no rank waits here: no collective runs)."""
        if self.pending is not None and getattr(self.pending, "done", lambda: True)():
            self.wait()

    def candidates(self) -> list[tuple[int, Path]]:
        """The epoch-N folders here, newest first."""
        found = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                number = folder.name[len("epoch-") :]
                if folder.is_dir() and folder.name.startswith("epoch-") and number.isdigit():
                    found.append((int(number), folder))
        return sorted(found, reverse=True)

    def agreed_epoch(self) -> int:
        """The newest of rank 0's epoch-N folders (rank 0 writes every .metadata) that is
        complete on every rank (0: none), on the checkpoints' gloo group; each newer one is
        named, once per node, with what it lacks there."""
        problems = {epoch: checkpoint_problem(folder) for epoch, folder in self.candidates()}
        count = torch.tensor([len(problems)], dtype=torch.int64)
        dist.broadcast(count, src=0, group=self.group)
        epochs = torch.tensor(sorted(problems, reverse=True), dtype=torch.int64)
        if self.ctx.rank != 0:
            epochs = torch.zeros(int(count.item()), dtype=torch.int64)
        dist.broadcast(epochs, src=0, group=self.group)
        here = [problems.get(e, "not on this node") for e in epochs.tolist()]
        complete = torch.tensor([0 if why else 1 for why in here], dtype=torch.int32)
        dist.all_reduce(complete, op=dist.ReduceOp.MIN, group=self.group)
        chosen = 0
        agreed = complete.tolist()
        for index, epoch in enumerate(epochs.tolist()):
            if agreed[index]:
                chosen = epoch
                break
            if self.ctx.local_rank == 0:
                why = here[index] or "complete here, not on every node"
                self.ctx.say(f"skipped {CHECKPOINTS}/epoch-{epoch}: {why}", every_rank=True)
        return chosen

    def resume(self, task: str) -> int:
        """Load the newest complete checkpoint on every rank; return the first epoch to train."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        epoch = self.agreed_epoch()
        if epoch == 0:
            return 1
        folder = self.root / f"epoch-{epoch}"
        head = {"extra": ""}  # the task first: another task's tensors would not fit
        planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
        dcp.load(head, checkpoint_id=str(folder), planner=planner, process_group=self.group)
        extra = json.loads(head["extra"])
        if extra.get("task", "regress") != task:
            raise SystemExit(
                f"[rank {self.ctx.rank}] {folder} is from --task {extra.get('task')}, this run"
                f" is --task {task}: use --task {extra.get('task')}, or another --out-dir"
            )
        state = self.state(epoch, None)
        dcp.load(state, checkpoint_id=str(folder), process_group=self.group)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
        torch.set_rng_state(state["rng"])
        version, inner, gauss = extra["python_rng"]
        random.setstate((version, tuple(inner), gauss))
        start = int(extra["epoch"]) + 1
        done = f"epochs 1-{start - 1}" if start > 2 else "epoch 1"
        self.ctx.say(
            f"resumed from {CHECKPOINTS}/epoch-{epoch} (complete: {shards(shard_count(folder))})"
            f" at epoch {start} ({done} done)",
            every_rank=True,
        )
        return start

    def full_model(self) -> dict[str, torch.Tensor]:
        """Every rank: the whole model's weights, gathered to rank 0 on the CPU (others: {})."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)


def shard_model(model: nn.Module) -> None:
    """FSDP2: each Linear its own unit, then the whole (in place; parameter names unchanged)."""
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)


def group_of_one(ctx: Ctx) -> None:
    """--fsdp without torchrun: a process group of this process alone, so FSDP and DCP have
    one (the run is then `distributed`, as a world of 1 under torchrun is)."""
    dist.init_process_group(backend=ctx.backend, store=dist.HashStore(), rank=0, world_size=1)
    ctx.distributed = True


@dataclass
class Job:
    """What the epochs work on."""

    args: argparse.Namespace
    ctx: Ctx
    bare: nn.Module
    model: nn.Module  # `bare`, or its DDP wrapper
    optimizer: torch.optim.Optimizer
    sampler: DistributedSampler
    loader: DataLoader
    eval_shard: tuple[torch.Tensor, torch.Tensor]
    events: Events
    beat: Beat | None = None
    slow: tuple[int, ...] = ()  # the slow ranks last named in the log
    sharded: Sharded | None = None  # --fsdp's checkpoints (None: snapshot.pt)


def setup_sharded(
    args: argparse.Namespace, ctx: Ctx, bare: nn.Module, out_dir: Path
) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, Sharded, int]:
    """--fsdp: the model sharded in place (no DDP wrapper: FSDP reduces the gradients), its
    optimizer, the checkpoints, and the first epoch to train."""
    if not ctx.distributed:
        group_of_one(ctx)
    shard_model(bare)  # before the optimizer: it steps the sharded parameters
    optimizer = torch.optim.SGD(bare.parameters(), lr=args.lr, momentum=args.momentum)
    sharded = Sharded(ctx, out_dir, bare, optimizer)
    return bare, bare, optimizer, sharded, resume_sharded(ctx, sharded, args.task, out_dir)


def train(args: argparse.Namespace, ctx: Ctx) -> None:
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx.say(
        f"started: pid {os.getpid()} local_rank {ctx.local_rank} world_size {ctx.world_size}"
        f" backend {ctx.backend} device {ctx.device} restart {ctx.restart}",
        every_rank=True,
    )
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    bare = build_model(args.task).to(ctx.device)
    if args.fsdp:
        bare, model, optimizer, sharded, start = setup_sharded(args, ctx, bare, out_dir)
    else:
        optimizer = torch.optim.SGD(bare.parameters(), lr=args.lr, momentum=args.momentum)
        start = resume(ctx, args.task, bare, optimizer, out_dir)
        model, sharded = bare, None
        if ctx.distributed:
            device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
            model = DistributedDataParallel(bare, device_ids=device_ids)
    sampler, loader, eval_shard = make_data(args, ctx)
    total = args.total_epochs
    if start > total:
        ctx.say(f"nothing to train: the snapshot already covers {total} epochs")
    else:
        ctx.say(
            f"training epochs {start}-{total} of {total} ({args.task}): {args.dataset_size}"
            f" samples, batch {args.batch_size}/rank ({args.batch_size * ctx.world_size}"
            f" global), {len(loader)} steps/epoch, lr {args.lr}, {args.eval_size} held out"
        )
    events = Events.open(ctx, out_dir, start) if start <= total else Events()
    job = Job(
        args, ctx, bare, model, optimizer, sampler, loader, eval_shard, events, Beat(ctx.rank)
    )
    job.sharded = sharded
    try:
        if start == 1:  # a new trajectory: a resumed one has its settings already
            classify = ["train/accuracy", "eval/accuracy"] if args.task == "classify" else []
            events.hparams(hparam_values(args, ctx), ["train/loss", "eval/loss", *classify])
        finished = train_epochs(job, start)
        weights = None
        if sharded is not None:
            sharded.wait()  # the last save is whole before the run ends
            weights = sharded.full_model() if finished else None  # every rank takes part
        if finished and ctx.rank == 0:
            atomic_save(cpu_state_dict(bare) if weights is None else weights, out_dir / FINAL_MODEL)
            ctx.say(f"final model saved -> {out_dir / FINAL_MODEL}")
            if start <= total:
                events.finished(total)
    finally:
        events.close()
    if ctx.distributed:
        dist.barrier()  # no rank tears the group down while another still talks to it


def train_epochs(job: Job, start: int) -> bool:
    """Epochs `start`..total; False when a signal stopped it early, for requeue."""
    args, ctx, total = job.args, job.ctx, job.args.total_epochs
    for epoch in range(start, total + 1):
        job.sampler.set_epoch(epoch)
        stats = run_epoch(ctx, args.task, job.model, job.loader, job.optimizer, epoch, job.beat)
        evaluated = evaluate(ctx, args.task, job.bare, job.eval_shard)
        say_slow_ranks(job, stats)
        saved = record_epoch(job, epoch, stats, evaluated)
        if epoch < total and (signum := agreed_signal(ctx)):
            if job.sharded is not None and not saved:
                job.sharded.save(args, epoch)
            elif ctx.rank == 0 and not saved:
                save_snapshot(ctx, args, job.bare, job.optimizer, epoch)
            if signum == signal.SIGUSR1:  # asked for a snapshot: it is there; go on
                _caught["snapshot"] = 0
                continue
            if job.sharded is not None:
                job.sharded.wait()  # the checkpoint is whole before the requeue file says so
            stop_for_requeue(ctx, epoch, signum, "checkpoint" if job.sharded else "snapshot")
            return False
    return True


def say_slow_ranks(job: Job, stats: EpochStats) -> None:
    """Rank 0 names the slow ranks (by step time) when they change."""
    if stats.rank_step_s is None:
        return
    slow = slow_ranks(stats.rank_step_s)
    if tuple(r for r, *_ in slow) == job.slow:
        return
    job.slow = tuple(r for r, *_ in slow)
    if not slow:
        job.ctx.say("no rank is slow any more")
        return
    nodes = stats.rank_node
    for rank, mine, typical in slow:
        where = f" (node {nodes[rank]})" if nodes else ""
        job.ctx.say(
            f"slow rank {rank}{where}: {mine / typical:.1f}x the others' step time"
            f" ({mine:.3f}s vs {typical:.3f}s)"
        )


def record_epoch(
    job: Job, epoch: int, stats: EpochStats, evaluated: tuple[float, float | None]
) -> bool:
    """Rank 0 writes the epoch's metrics line and events, and the snapshot after every
    save_every-th epoch; True (on every rank) when this epoch has a snapshot."""
    args, ctx = job.args, job.ctx
    saved = epoch % args.save_every == 0
    if job.sharded is not None:
        job.sharded.poll()  # the previous save's line, once it is written
    if ctx.rank == 0:
        lr = job.optimizer.param_groups[0]["lr"]
        job.events.epoch(log_epoch(ctx, args, lr, epoch, stats, evaluated))
        if saved and job.sharded is None:
            save_snapshot(ctx, args, job.bare, job.optimizer, epoch)
    if saved and job.sharded is not None:  # every rank writes its shard
        job.sharded.save(args, epoch)
    return saved


def stop_for_requeue(ctx: Ctx, epoch: int, signum: int, saved: str = "snapshot") -> None:
    """After the snapshot of `epoch`: rank 0 writes the requeue file; every rank says so."""
    name, done = signal.Signals(signum).name, ""
    if ctx.rank == 0:
        if requeue_file := os.environ.get(REQUEUE_FILE_ENV):
            Path(requeue_file).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(requeue_file), json.dumps({"epoch": epoch, "signal": name}))
        done = f": {saved} saved"
    ctx.say(f"stopping after epoch {epoch} for requeue ({name}){done}", every_rank=True)


def shutdown(ctx: Ctx) -> None:
    """Destroy the process group (every rank, also after an error) so peers are not left
    waiting on this one."""
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


@record
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    install_preemption_handlers()  # before the rendezvous, which may wait long
    ctx = setup()
    try:
        train(args, ctx)
    finally:
        shutdown(ctx)
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without interpreter teardown. Once DDP has been built, the gloo group's threads
    # outlive destroy_process_group (DDP keeps a C++ reference to the group), and tearing
    # them down at exit aborts now and then with "terminate called without an active
    # exception" (SIGABRT, ~1 process in 25 with torch 2.13 here), failing a run that had
    # finished. Every file is closed and fsynced by now; flush the streams and go.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)  # `record` turns --help's SystemExit(0) into None
