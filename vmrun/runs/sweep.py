"""A sweep: the same training at several sizes in turn, recorded so it can be continued.

`vmrun sweep --nodes 1,2 --nproc-per-node 1,2` runs one training per (nodes, processes)
pair, smallest first, and keeps what it did in `results/sweep-<id>/sweep.json`: the options
every size shares, where it runs, and each size's run id and outcome. Other options given a
list (`--cpus-per-task 1,2`, `--lr 0.1,0.01`, `-e KEY=A,B`, ...) are more axes of the same
grid: each point of the cartesian product is a "size" too, named by what varies. The record is
rewritten atomically after every size, so an interrupted sweep keeps its finished runs and
`--resume <id>` runs only what is left. Executing a size is the CLI's job (it already knows
how to train and fetch on hosts, clusters and this machine); this module is the plan and the
record, with nothing that opens a connection.
"""

from __future__ import annotations

import itertools
import json
import os
import re
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
    values: dict[str, Any] = field(default_factory=dict)  # the other axes' values, by key
    tag: str = ""  # those values in a run name: `cpus2-lr0.01`

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.nproc}" + (f"-{self.tag}" if self.tag else "")

    def varied(self) -> dict[str, str]:
        """The other axes' values in words, by short name: {"cpus": "2", "lr": "0.01"}."""
        return {short_name(k): value_text(v) for k, v in self.values.items()}

    def words(self) -> str:
        """`cpus=2 lr=0.01` (empty when only the size varies)."""
        return " ".join(f"{k}={v}" for k, v in self.varied().items())

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


def parse_counts(flag: str, text: str | None, default: int = 1, *, least: int = 1) -> list[int]:
    """`1,2,4` -> [1, 2, 4]: whole numbers >= `least`, sorted, each once."""
    if text is None:
        return [default]
    values = []
    for part in text.split(","):
        word = part.strip()
        if not (word.isascii() and word.isdigit()) or int(word) < least:
            raise UsageError(
                f"{flag} {text!r}: give whole numbers >= {least} separated by commas, e.g. 1,2"
            )
        values.append(int(word))
    return sorted(set(values))


def parse_numbers(flag: str, text: str) -> list[float]:
    """`0.1,0.01` -> [0.01, 0.1]: numbers > 0, sorted, each once."""
    values = []
    for part in text.split(","):
        try:
            value = float(part.strip())
        except ValueError:
            value = 0.0
        if not 0 < value < float("inf"):
            raise UsageError(
                f"{flag} {text!r}: give numbers > 0 separated by commas, e.g. 0.1,0.01"
            )
        values.append(value)
    return sorted(set(values))


def split_values(text: str) -> list[str]:
    """`a,b\\,c` -> ["a", "b,c"]: a list of -e values (`\\,` is a comma inside one), each once."""
    values = [part.replace("\\,", ",") for part in re.split(r"(?<!\\),", text)]
    return list(dict.fromkeys(values))


Axis = tuple[str, list[Any]]  # an option's key (`lr`, `env:KEY`) and its values, in order
SHORT = {"cpus_per_task": "cpus", "gpus_per_node": "gpus", "batch_size": "batch", "lr": "lr"}


def short_name(key: str) -> str:
    """What an axis is called in a run name, a legend and a report column."""
    return key.removeprefix("env:") if key.startswith("env:") else SHORT.get(key, key)


def value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _tags(key: str, values: list[Any]) -> list[str]:
    """Each value as a part of a run name; an env value that is not safe in one (or two that
    read the same once made safe) goes by its position in the list instead."""
    name = short_name(key)
    texts = [value_text(v) for v in values]
    if not key.startswith("env:"):
        return [f"{name}{t}" for t in texts]
    safe = [re.sub(r"[^A-Za-z0-9.]+", "_", t).strip("_")[:24] for t in texts]
    if "" in safe or len(set(safe)) < len(safe):
        safe = [f"v{i}" for i in range(1, len(texts) + 1)]
    return [f"{name}_{t}" for t in safe]


def plan_sizes(nodes: list[int], nprocs: list[int], axes: list[Axis] | None = None) -> list[Size]:
    """Every point of the grid, the smallest world first (ties: fewer nodes first), so the
    baseline of the report (the smallest run) is the first to finish; at one size, the
    other axes' points in the order given."""
    pairs = sorted(((n, p) for n in nodes for p in nprocs), key=lambda np: (np[0] * np[1], np[0]))
    axes = [(k, vs) for k, vs in axes or [] if vs]
    keys = [k for k, _ in axes]
    tagged = [list(zip(vs, _tags(k, vs), strict=True)) for k, vs in axes]
    points = list(itertools.product(*tagged))
    return [
        Size(
            n,
            p,
            values=dict(zip(keys, (v for v, _ in point), strict=True)),
            tag="-".join(t for _, t in point),
        )
        for n, p in pairs
        for point in points
    ]


def one_process_per_gpu(sizes: list[Size], gpus: int | None) -> list[Size]:
    """A cluster sweep without --nproc-per-node runs one process per GPU (the point's
    --gpus-per-node, else the sweep's), as `train -C` does; smallest world first again."""
    for size in sizes:
        size.nproc = int(size.values.get("gpus_per_node", gpus) or size.nproc)
    return sorted(sizes, key=lambda s: (s.world_size, s.nodes))


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
            code="sweep-not-found",
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable sweep record ({exc})") from None
    sizes = [
        Size(
            int(s["nodes"]),
            int(s["nproc"]),
            s.get("run"),
            RunState(s.get("state", "pending")),
            str(s.get("detail", "")),
            dict(s.get("values") or {}),
            str(s.get("tag", "")),
        )
        for s in raw.get("sizes", [])
    ]
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
