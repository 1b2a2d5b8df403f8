"""What a run on one host shows: whole lines per rank, torchrun's noise only when asked.

Real torchrun on a real sshd test host (the shared venv with CPU torch); the ranks write
their lines in pieces at the same time, as `print(a, b)` does under PYTHONUNBUFFERED.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, run_id_of
from testbed import NetnsBed
from train_helpers import pieces_script, rank_lines

LINES = 120
PIECES = pieces_script(LINES)


@pytest.fixture
def project(bed: NetnsBed, bed_client: Client, host_python: Path) -> Iterator[Client]:
    (bed_client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{host_python}"\n'
    )
    yield bed_client
    clean_host(bed["h1"])


def test_ranks_lines_arrive_whole_and_prefixed_and_torchruns_noise_is_hidden(
    bed: NetnsBed, project: Client
) -> None:
    (project.cwd / "pieces.py").write_text(PIECES)
    done = project.vmrun("train", "pieces.py", "-H", "h1", "--", "x", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    every = sorted((r, i) for r in (0, 1) for i in range(LINES))
    assert sorted(rank_lines(done.stdout)) == every
    log = (bed["h1"].home / ".vmrun/runs" / rid / "log").read_text()
    assert "Setting OMP_NUM_THREADS" in log  # the host's log keeps torchrun's banner...
    assert "OMP_NUM_THREADS" not in done.stdout and "*****" not in done.stdout  # ...not shown

    shown = project.vmrun("logs", rid, "-H", "h1")
    assert shown.returncode == 0, shown.stderr
    assert sorted(rank_lines(shown.stdout)) == every
    assert "OMP_NUM_THREADS" not in shown.stdout
    verbose = project.vmrun("logs", rid, "-H", "h1", "--verbose")
    assert "*****\nSetting OMP_NUM_THREADS" in verbose.stdout
    assert sorted(rank_lines(verbose.stdout)) == every

    followed = project.vmrun("logs", "-f", rid, "-H", "h1")
    assert followed.returncode == 0, followed.stderr
    assert sorted(rank_lines(followed.stdout)) == every
    assert followed.stderr.splitlines()[-1] == (
        f"vmrun: run {rid} finished on h1; `vmrun fetch --run {rid}` brings its files"
    )


TICKS = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
start = time.time()
for i in range(4):  # rank 0 at 0, 0.8, 1.6, 2.4 s; rank 1 0.4 s after each
    time.sleep(max(0.0, start + i * 0.8 + rank * 0.4 - time.time()))
    print(f"tick {i} from rank {rank}")
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
"""


def test_a_multinode_log_is_merged_by_time_and_following_it_says_it_finished(
    multi: Client,
) -> None:
    (multi.cwd / "ticks.py").write_text(TICKS)
    done = multi.vmrun("train", "ticks.py", "--nproc-per-node", "1", "--", "x", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    expected = [
        f"[{host} rank{r}] tick {i} from rank {r}"
        for i in range(4)
        for r, host in ((0, "n1"), (1, "n2"))
    ]
    shown = multi.vmrun("logs", rid)
    assert shown.returncode == 0, shown.stderr
    assert [ln for ln in shown.stdout.splitlines() if " tick " in ln] == expected
    last = multi.vmrun("logs", rid, "-n", "3")  # the merged log's last lines, whatever they
    # are (torchrun's agents may add lines after the ranks' last, on a loaded machine)
    assert last.stdout.splitlines() == shown.stdout.splitlines()[-3:]

    followed = multi.vmrun("logs", "-f", rid)
    assert followed.returncode == 0, followed.stderr
    assert sorted(ln for ln in followed.stdout.splitlines() if " tick " in ln) == sorted(expected)
    assert followed.stderr.splitlines()[-1] == (
        f"vmrun: run {rid} finished on n1, n2; `vmrun fetch --run {rid}` brings its files"
    )
