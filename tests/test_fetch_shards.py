"""`vmrun train --fsdp -H h1 -H h2` (one rank each, real torchrun over gloo, FSDP2 on CPU)
and then `vmrun fetch`: each node wrote its own shard of every checkpoint (rank 0 the
`.metadata` on the master), and the fetch merges them into one folder here that is a
complete checkpoint by checkpoint_layout's rule and that torch.distributed.checkpoint
loads, in this process, into a state dict built from its metadata. A script whose two
nodes write one path with other bytes: said, the master's kept, the rest of both nodes'
files merged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, run_id_of, template_out
from testbed import NetnsBed

from vmrun.hostside import checkpoint_layout


@pytest.fixture
def project(bed: NetnsBed, bed_client: Client, host_python_tb: Path) -> Iterator[Client]:
    """h1 and h2 in vmrun.toml; their torch has numpy (DCP's gather of each rank's plan)."""
    (bed_client.cwd / "vmrun.toml").write_text(
        "".join(
            f'[[hosts]]\naddress = "{h}"\npython = "{host_python_tb}"\n\n' for h in ("h1", "h2")
        )
    )
    bed_client.extra_env["OMP_NUM_THREADS"] = "1"
    try:
        yield bed_client
    finally:
        for name in ("h1", "h2"):
            clean_host(bed[name])


@pytest.mark.timeout(900)
def test_fetch_brings_every_nodes_shards_into_one_checkpoint_that_loads(
    bed: NetnsBed, project: Client
) -> None:
    done = project.vmrun(
        *("train", "--fsdp", "-H", "h1", "-H", "h2", "--nproc-per-node", "1"),
        *("--epochs", "2", "--save-every", "1"),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    for host, shard in (("h1", "__0_0.distcp"), ("h2", "__1_0.distcp")):  # each its own
        names = {p.name for p in (template_out(bed[host], project, rid) / "checkpoints").rglob("*")}
        assert shard in names, (host, names)

    fetched = project.vmrun("fetch", timeout=300)
    assert fetched.returncode == 0, fetched.stderr + fetched.stdout
    assert "node-files-differ" not in fetched.stderr
    local = project.cwd / "results" / rid
    found = checkpoint_layout.scan(str(local))
    assert [(c.kind, c.path, c.complete, c.shards) for c in found.checkpoints] == [
        ("dcp", "checkpoints/epoch-2", True, 2),
        ("dcp", "checkpoints/epoch-1", True, 2),
    ]
    newest = local / "checkpoints" / "epoch-2"
    assert sorted(p.name for p in newest.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for host, shard in (("h1", "__0_0.distcp"), ("h2", "__1_0.distcp")):
        remote = template_out(bed[host], project, rid) / "checkpoints" / "epoch-2" / shard
        assert (newest / shard).read_bytes() == remote.read_bytes()
    # the master's record beside the outputs, the other node's in a folder of its own
    assert {"run.json", "log", "metrics.jsonl", "finalmodel.pt"} <= {
        p.name for p in local.iterdir()
    }
    assert {"run.json", "log"} <= {p.name for p in (local / "h2").iterdir()}

    from vmrun.trainer.template import build_model

    state = _load(newest)
    model = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    build_model().load_state_dict(model)  # strict: every name and shape, both ranks' pieces

    again = project.vmrun("fetch", timeout=300)  # nothing new: nothing moves
    assert again.returncode == 0, again.stderr
    assert "fetched 0 files" in again.stdout, again.stdout


def _load(folder: Path) -> dict[str, object]:
    """Every tensor of the checkpoint, read by torch.distributed.checkpoint in this one
    process (no process group) into a state dict built from its own metadata."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(folder))
    meta = reader.read_metadata()
    state: dict[str, object] = {
        key: torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in meta.state_dict_metadata.items()
        if isinstance(item, TensorStorageMetadata)
    }
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state


SCRIPT = """\
import os
rank = int(os.environ["RANK"])
os.makedirs("outputs", exist_ok=True)
with open("outputs/same.txt", "w") as fh:
    fh.write("the same on every node\\n")
with open("outputs/differs.txt", "w") as fh:
    fh.write(f"rank {rank}\\n")
with open(f"outputs/rank-{rank}.txt", "w") as fh:
    fh.write(f"only rank {rank}\\n")
"""


@pytest.mark.timeout(600)
def test_one_path_with_other_bytes_on_two_nodes_is_said_and_the_masters_kept(
    bed: NetnsBed, project: Client
) -> None:
    (project.cwd / "writes.py").write_text(SCRIPT)
    done = project.vmrun(
        *("train", "writes.py", "-H", "h1", "-H", "h2", "--nproc-per-node", "1"), timeout=300
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    fetched = project.vmrun("fetch", timeout=300)
    assert fetched.returncode == 1, fetched.stderr + fetched.stdout
    said = [ln for ln in fetched.stderr.splitlines() if "node-files-differ" in ln]
    assert said == [
        f"vmrun: error[node-files-differ]: results/{rid}/outputs/differs.txt: h2 holds other"
        " bytes than h1; h1's is fetched, h2's left there"
    ], fetched.stderr
    out = project.cwd / "results" / rid / "outputs"
    assert (out / "differs.txt").read_text() == "rank 0\n"  # the master's, never overwritten
    assert (out / "same.txt").read_text() == "the same on every node\n"
    assert (out / "rank-0.txt").exists() and (out / "rank-1.txt").exists()  # every node's
    assert sorted(p.name for p in out.iterdir()) == [
        "differs.txt",
        "rank-0.txt",
        "rank-1.txt",
        "same.txt",
    ]  # no other copy under another name
