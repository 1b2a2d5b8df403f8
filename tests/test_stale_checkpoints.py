"""Checkpoints an earlier run left in a multi-node run's working directory
(vmrun.backends.hosts.stale), on real test hosts (the `multi` fixture: n1 and n2): refused
when they differ across the nodes, moved aside with --fresh, accepted when they are the same
everywhere."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import Client, errors_in, run_id_of, run_pids
from testbed import TestHost

from vmrun.remote_paths import remote_workdir

# Loads snapshot.pt when it is there (the multinode tutorial's rule), says where it starts,
# then one all_reduce: a run whose nodes disagree would not get this far in one world.
SCRIPT = """\
import os, sys
import torch, torch.distributed as dist

dist.init_process_group("gloo")
start = torch.load("snapshot.pt")["EPOCHS_RUN"] if os.path.exists("snapshot.pt") else 0
print(f"starting at epoch {start}", flush=True)
total = torch.ones(1)
dist.all_reduce(total)
print(f"sum={int(total.item())}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
"""


def _put(host: TestHost, multi: Client, rel: str, data: bytes, mtime: int | None = None) -> Path:
    """A file an earlier run left in the project's work directory, owned by the host user."""
    workdir = host.home / remote_workdir(multi.cwd)
    path = workdir / rel
    host.run(["mkdir", "-p", str(path.parent)], as_user=True)
    path.write_bytes(data)
    os.chown(path, host.uid, host.gid)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _refusal(stderr: str, code: str = "checkpoints-differ") -> str:
    [(said, line)] = errors_in(stderr)
    assert said == code, stderr
    return line


def test_checkpoints_on_one_node_only_or_different_refuse_the_run(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """snapshot.pt on n1 alone, and ckpt/last.ckpt of the same size but other bytes on each
    node (so only their hashes tell): exit 2 naming both and where, nothing synced or
    started, nothing moved; the hint names --resume and --fresh."""
    n1, n2 = cluster["n1"], cluster["n2"]
    (multi.cwd / "stale.py").write_text(SCRIPT)
    snap = _put(n1, multi, "snapshot.pt", b"epoch 40 of an earlier run")
    one = _put(n1, multi, "ckpt/last.ckpt", b"A" * 64, mtime=1_700_000_000)
    two = _put(n2, multi, "ckpt/last.ckpt", b"B" * 64, mtime=1_700_000_100)
    refused = multi.vmrun("train", "stale.py", "--nproc-per-node", "1", "--", "x", timeout=180)
    assert refused.returncode == 2, refused.stderr + refused.stdout
    line = _refusal(refused.stderr)
    assert f"~/{remote_workdir(multi.cwd)}/" in line, line
    assert "snapshot.pt on n1, not on n2" in line, line
    assert "ckpt/last.ckpt differs between n1, n2 (content)" in line, line
    assert "`--resume RUN` to continue a run, or `--fresh` to move them aside" in line, line
    assert snap.read_bytes() == b"epoch 40 of an earlier run"
    assert one.read_bytes() == b"A" * 64 and two.read_bytes() == b"B" * 64
    for host in (n1, n2):
        assert not (host.home / ".vmrun" / "runs").exists()
        assert not (host.home / remote_workdir(multi.cwd) / "stale.py").exists()  # not synced
        assert run_pids(host) == []


def test_fresh_moves_them_aside_and_the_same_files_everywhere_pass(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """--fresh renames n1's snapshot.pt into .vmrun-stale-<time>/ (the bytes kept, said where)
    and every rank starts at epoch 0 in one world. Then model.ckpt with the same bytes on both
    nodes, at different mtimes (a deliberate copy), lets a plain run start without a word; the
    folder moved aside is not counted again."""
    n1, n2 = cluster["n1"], cluster["n2"]
    (multi.cwd / "stale.py").write_text(SCRIPT)
    _put(n1, multi, "snapshot.pt", b"epoch 40 of an earlier run")
    done = multi.vmrun(
        "train", "stale.py", "--fresh", "--nproc-per-node", "1", "--", "x", timeout=300
    )
    assert done.returncode == 0, done.stderr + done.stdout
    workdir = n1.home / remote_workdir(multi.cwd)
    assert not (workdir / "snapshot.pt").exists()
    aside = list(workdir.glob(".vmrun-stale-*/snapshot.pt"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"epoch 40 of an earlier run"
    shown = f"~/{remote_workdir(multi.cwd)}/{aside[0].parent.name}/"
    assert f"n1: moved 1 checkpoint file(s) (snapshot.pt) aside to {shown}" in done.stderr
    assert "n2: moved" not in done.stderr
    starts = re.findall(r"^\[(n\d) rank\d\] starting at epoch (\d+)$", done.stdout, re.M)
    assert sorted(starts) == [("n1", "0"), ("n2", "0")], done.stdout
    assert done.stdout.count("sum=2") == 2, done.stdout

    kept = [
        _put(host, multi, "model.ckpt", b"the same weights", mtime=1_700_000_000 + i)
        for i, host in enumerate((n1, n2))
    ]
    again = multi.vmrun("train", "stale.py", "--nproc-per-node", "1", "--", "x", timeout=300)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "checkpoint" not in again.stderr, again.stderr
    assert all(p.read_bytes() == b"the same weights" for p in kept)
    assert len(list(workdir.glob(".vmrun-stale-*"))) == 1
    for host in (n1, n2):
        assert run_pids(host, run_id_of(again.stderr)) == []


def test_fresh_on_one_host_moves_its_checkpoints_and_is_refused_with_resume(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    n1 = cluster["n1"]
    clash = multi.vmrun("train", "--resume", "x-20250101-000000-abcd", "--fresh")
    assert clash.returncode == 2
    assert "--resume continues from them: use one" in _refusal(clash.stderr, "flags-conflict")
    (multi.cwd / "stale.py").write_text(SCRIPT)
    _put(n1, multi, "snapshot.pt", b"epoch 40 of an earlier run")
    done = multi.vmrun(
        "train",
        "stale.py",
        "-H",
        "n1",
        "--fresh",
        "--nproc-per-node",
        "1",
        "--",
        "x",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    workdir = n1.home / remote_workdir(multi.cwd)
    assert "n1: moved 1 checkpoint file(s) (snapshot.pt) aside" in done.stderr
    assert [p.read_bytes() for p in workdir.glob(".vmrun-stale-*/snapshot.pt")] == [
        b"epoch 40 of an earlier run"
    ]
    assert "starting at epoch 0" in done.stdout, done.stdout
