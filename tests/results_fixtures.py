"""Results folders for the report and plot tests; loaded by tests/conftest.py through
`pytest_plugins`.

`local_runs` (session): a project whose results/ holds two real `vmrun train --local` runs
of the template, 1 and 2 processes, 3 epochs each. The builders below write a run's folder
as each place leaves it (the fields are those vmrun.backends.hosts.backend,
vmrun.backends.slurm.backend and vmrun.runs.local write), for tests that need shapes this
machine cannot make.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from conftest import ROOT, slow_fixture

T0 = 1_700_000_000.0


def epochs(
    n: int, *, world: int = 1, rate: float = 1000.0, loss0: float = 1.0, **extra: float
) -> list[dict]:
    """n epochs as the template writes them (plus any extra fields, the same each epoch)."""
    return [
        {
            "epoch": e,
            "loss": loss0 / e,
            "samples_per_s": rate,
            "epoch_time_s": 8192 / rate,
            "world_size": world,
            "lr": 0.1,
            **extra,
        }
        for e in range(1, n + 1)
    ]


def write_metrics(folder: Path, lines: Sequence[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def local_run(
    results: Path, rid: str, lines: Sequence[dict], *, nproc: str = "2", epochs_asked: int = 3
) -> Path:
    """As `train --local` leaves it: run.json, metrics.jsonl, train.log."""
    d = results / rid
    write_metrics(d, lines)
    (d / "run.json").write_text(
        json.dumps(
            {
                "id": rid,
                "status": "finished",
                "script": "/x/vmrun/trainer/template.py",
                "template": True,
                "launcher": "torchrun",
                "args": [str(epochs_asked), "5"],
                "nproc": nproc,
                "max_restarts": 0,
                "argv": [],
                "cwd": str(results.parent),
                "run_dir": str(d),
                "env_keys": [],
                "python": sys.executable,
                "pid": 1,
                "start_time": "2023-11-14T22:13:20+00:00",
                "end_time": "2023-11-14T22:14:05+00:00",
                "exit_code": 0,
            }
        )
    )
    (d / "train.log").write_text("[rank0] epoch 1/3 ...\n")
    return d


def hosts_run(
    results: Path,
    rid: str,
    lines: Sequence[dict],
    hosts: Sequence[str],
    *,
    nproc: str = "2",
    exits: Sequence[int] | None = None,
    duration: float = 60.0,
) -> Path:
    """As `vmrun fetch` leaves a run of SSH hosts: a folder per host when there are several
    (rank 0's, the first, has the metrics), each with the host's run.json, log, exit_code
    (whose mtime, kept by fetch, is when the run ended there)."""
    d = results / rid
    for i, host in enumerate(hosts):
        place = d / host if len(hosts) > 1 else d
        place.mkdir(parents=True, exist_ok=True)
        if i == 0:
            write_metrics(place, lines)
        (place / "run.json").write_text(
            json.dumps(
                {
                    "name": "template",
                    "template": True,
                    "launcher": "torchrun",
                    "args": ["3", "5"],
                    "nproc_requested": None,
                    "nproc": nproc,
                    "max_restarts": 0,
                    "env_keys": [],
                    "nodes": list(hosts),
                    "master": hosts[0],
                    "nnodes": str(len(hosts)),
                    "rdzv": None,
                    "script": "template.py",
                    "workdir": "vmrun/p-1",
                    "host": host,
                    "out_dir": f"vmrun/p-1/results/{rid}",
                    "python": "python3",
                    "argv": [],
                    "ifname": "",
                    "id": rid,
                    "started": T0,
                }
            )
        )
        (place / "log").write_text("epoch 1/3\n")
        if exits is not None:
            (place / "exit_code").write_text(f"{exits[i]}\n")
            os.utime(place / "exit_code", (T0 + duration - i, T0 + duration - i))
    return d


def slurm_run(
    results: Path, rid: str, lines: Sequence[dict], *, nodes: int = 2, per_node: int = 1
) -> Path:
    """As `vmrun fetch -C` leaves a Slurm run: outputs and the record (starts, exit) in one
    folder; the job was requeued once (two starts, the last exit is the run's)."""
    d = results / rid
    write_metrics(d, lines)
    (d / "run.json").write_text(
        json.dumps(
            {
                "run_id": rid,
                "cluster": "bed",
                "launcher": "torchrun",
                "script": "template.py",
                "template": True,
                "args": ["4", "2"],
                "epochs": 4,
                "nodes": nodes,
                "tasks_per_node": 1,
                "nproc_per_node": per_node,
                "world_size": nodes * per_node,
                "gpus_per_node": None,
                "partition": None,
                "time": None,
                "max_requeues": 3,
                "submitted": T0 - 30,
                "record_dir": "r",
                "code_dir": "c",
                "out_dir": "o",
                "metrics": "o/metrics.jsonl",
            }
        )
    )
    (d / "starts").write_text(f"1 {int(T0)}\n2 {int(T0) + 50}\n")
    (d / "exit").write_text(f"1 requeue {int(T0) + 40}\n2 0 {int(T0) + 95}\n")
    (d / "job.log").write_text("[c1 rank0] epoch 1/4\n")
    return d


@pytest.fixture(scope="session")
@slow_fixture
def local_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project with two real template runs made by `vmrun train --local`: 1 and 2
    processes (in that order), 3 epochs each. Its results/ is copied by the tests. Made
    once a session: under xdist, the first worker to ask makes it for both (a lock)."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this session's
    project = shared / "local-runs"
    with open(shared / ".local-runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (project / ".complete").exists():
            shutil.rmtree(project, ignore_errors=True)
            project.mkdir()
            _make_local_runs(project)
            (project / ".complete").touch()
    yield project


def _make_local_runs(project: Path) -> None:
    from train_helpers import base_env, kill_marked, new_mark

    for nproc in ("1", "2"):
        mark = new_mark()
        env = base_env(mark, {"PYTHONPATH": str(ROOT), "NO_COLOR": "1"})
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "vmrun",
                    "train",
                    "--local",
                    "--epochs",
                    "3",
                    "--nproc-per-node",
                    nproc,
                ],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            kill_marked(mark)
        assert done.returncode == 0, done.stderr + done.stdout


def line_colours(png: Path, palette: Sequence[str], least: int = 30) -> list[str]:
    """The palette's colours that the image really has (at least `least` pixels of exactly
    that colour: a line's inside; antialiased edges blend into other values)."""
    import numpy as np
    from matplotlib.image import imread

    pixels = (np.asarray(imread(png))[..., :3] * 255).round().astype(np.int64)
    codes = pixels[..., 0] << 16 | pixels[..., 1] << 8 | pixels[..., 2]
    values, counts = np.unique(codes, return_counts=True)
    found = dict(zip(values.tolist(), counts.tolist(), strict=True))
    return [c for c in palette if found.get(int(c[1:], 16), 0) >= least]


def svg_line_ids(svg: Path) -> list[str]:
    """The ids `save_plot` gives the runs' lines (`run-<id>`), in the order drawn."""
    import xml.etree.ElementTree as ET

    ids = [el.get("id", "") for el in ET.parse(svg).iter()]
    return [i for i in ids if i.startswith("run-")]


def svg_line_looks(svg: Path) -> dict[str, tuple[tuple[str, str], tuple[tuple[str, str], ...]]]:
    """By line id (`run-<id>`): (its dash pattern, the marker shape it uses) and where its
    markers are drawn."""
    import xml.etree.ElementTree as ET

    xlink = "{http://www.w3.org/1999/xlink}href"
    root = ET.parse(svg).getroot()
    shapes = {el.get("id"): el.get("d", "") for el in root.iter() if el.get("id")}
    looks = {}
    for group in root.iter():
        gid = group.get("id", "")
        if not gid.startswith("run-"):
            continue
        styles = [el.get("style", "") for el in group.iter() if el.tag.endswith("path")]
        dashes = next((s for st in styles for s in st.split(";") if "dasharray" in s), "solid")
        uses = [el for el in group.iter() if el.tag.endswith("use")]
        marker = shapes.get(uses[0].get(xlink, "").lstrip("#"), "") if uses else ""
        marks = tuple((u.get("x", ""), u.get("y", "")) for u in uses)
        looks[gid] = ((dashes, marker), marks)
    return looks
