"""A sweep: the same training at several sizes in turn, recorded so it can be continued.

`vmrun sweep --nodes 1,2 --nproc-per-node 1,2` runs one training per (nodes, processes)
pair, smallest first, and keeps what it did in `results/sweep-<id>/sweep.json`: the options
every size shares, where it runs, and each size's run id and outcome. The record is
rewritten atomically after every size, so an interrupted sweep keeps its finished runs and
`--resume <id>` runs only what is left. Executing a size is the CLI's job (it already knows
how to train and fetch on hosts, clusters and this machine); this module is the plan and the
record, with nothing that opens a connection.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vmrun.errors import UsageError
from vmrun.runs.state import RunState

RECORD = "sweep.json"
PREFIX = "sweep-"


@dataclass
class Size:
    """One point of the sweep, and what became of it."""

    nodes: int
    nproc: int
    run: str | None = None  # the run id, once started
    state: RunState = RunState.PENDING
    detail: str = ""  # why it failed or stopped, in one line

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.nproc}"

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc


@dataclass
class Sweep:
    id: str
    where: dict[str, Any]  # {"local": True} | {"hosts": [labels]} | {"cluster": name}
    options: dict[str, Any]  # the train options every size shares (epochs, lr, task, ...)
    sizes: list[Size] = field(default_factory=list)

    @property
    def folder(self) -> str:
        return f"results/{self.id}"

    def left(self) -> list[Size]:
        return [s for s in self.sizes if s.state != RunState.DONE]

    def run_ids(self) -> list[str]:
        return [s.run for s in self.sizes if s.state == RunState.DONE and s.run]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "where": self.where,
            "options": self.options,
            "sizes": [{**asdict(s), "state": str(s.state)} for s in self.sizes],
        }


def parse_counts(flag: str, text: str | None, default: int = 1) -> list[int]:
    """`1,2,4` -> [1, 2, 4]: whole numbers >= 1, sorted, each once."""
    if text is None:
        return [default]
    values = []
    for part in text.split(","):
        word = part.strip()
        if not word.isdigit() or int(word) < 1:
            raise UsageError(
                f"{flag} {text!r}: give whole numbers >= 1 separated by commas, e.g. 1,2"
            )
        values.append(int(word))
    return sorted(set(values))


def plan_sizes(nodes: list[int], nprocs: list[int]) -> list[Size]:
    """Every pair, the smallest world first (ties: fewer nodes first), so the baseline of the
    report (the smallest run) is the first to finish."""
    pairs = sorted(((n, p) for n in nodes for p in nprocs), key=lambda np: (np[0] * np[1], np[0]))
    return [Size(n, p) for n, p in pairs]


def new_sweep(
    sweep_id: str, where: dict[str, Any], options: dict[str, Any], sizes: list[Size]
) -> Sweep:
    return Sweep(sweep_id, where, options, sizes)


def check_sweep_id(text: str) -> str:
    name = text.rstrip("/").rsplit("/", 1)[-1]
    if not name.startswith(PREFIX) or not all(c.isalnum() or c in "-_." for c in name):
        raise UsageError(f"--resume {text!r}: give a sweep id such as sweep-20260101-120000-ab12")
    return name


def load(project: Path, sweep_id: str) -> Sweep:
    path = project / "results" / check_sweep_id(sweep_id) / RECORD
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"no sweep {sweep_id} here: {path} does not exist",
            hint="run `vmrun sweep` without --resume",
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable sweep record ({exc})") from None
    sizes = [
        Size(int(s["nodes"]), int(s["nproc"]), s.get("run"), RunState(s.get("state", "pending")),
             str(s.get("detail", "")))
        for s in raw.get("sizes", [])
    ]  # fmt: skip
    return Sweep(str(raw["id"]), dict(raw.get("where", {})), dict(raw.get("options", {})), sizes)


def save(project: Path, sweep: Sweep) -> Path:
    """Write the record atomically: a reader never sees half of it."""
    folder = project / sweep.folder
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORD
    write_text_atomic(path, json.dumps(sweep.to_json(), indent=2) + "\n")
    return path


def write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
