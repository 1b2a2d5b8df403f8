"""The template with --fsdp under real torchrun (2 CPU processes, gloo): FSDP2 and sharded
DCP checkpoints in checkpoints/epoch-N/, resumed from the newest complete one, the stop for
requeue as without, and a final model that loads into the bare one. The folders are read
with vmrun.hostside.checkpoint_layout, the rule vmrun's other ends use."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client
from test_trainer_preempt import signal_run
from train_helpers import TEMPLATE, base_env, marked, read_metrics, run, torchrun_argv

from vmrun.hostside import checkpoint_layout as layout

pytestmark = pytest.mark.slow

SHARDS = ["__0_0.distcp", "__1_0.distcp"]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """One 2-rank --fsdp run of 4 epochs, a checkpoint every 2: (its out dir, its output)."""
    out = tmp_path_factory.mktemp("fsdp") / "out"
    with marked() as mark:
        argv = torchrun_argv(["4", "2", "--fsdp", "--out-dir", str(out)])
        done = run(argv, base_env(mark), out.parent)
    assert done.returncode == 0, done.stdout
    yield out, done.stdout


def test_each_save_is_a_complete_two_shard_folder(fsdp_run: tuple[Path, str]) -> None:
    out, output = fsdp_run
    scanned = layout.scan(str(out))
    assert [(c.kind, c.path, c.complete, c.shards) for c in scanned.checkpoints] == [
        ("dcp", "checkpoints/epoch-4", True, 2),
        ("dcp", "checkpoints/epoch-2", True, 2),
    ]
    for epoch in (2, 4):
        names = sorted(p.name for p in (out / "checkpoints" / f"epoch-{epoch}").iterdir())
        assert names == [".metadata", *SHARDS]  # no temporary file left behind
        assert f"[rank 0] checkpoint checkpoints/epoch-{epoch} complete: 2 shards" in output
    assert not (out / "snapshot.pt").exists()
    assert [m["epoch"] for m in read_metrics(out)] == [1, 2, 3, 4]


def test_each_save_says_what_it_cost_training(fsdp_run: tuple[Path, str]) -> None:
    out, output = fsdp_run
    saves = [json.loads(ln) for ln in (out / "checkpoints.jsonl").read_text().splitlines()]
    assert [(s["epoch"], s["path"], s["shards"]) for s in saves] == [
        (2, "checkpoints/epoch-2", 2),
        (4, "checkpoints/epoch-4", 2),
    ]
    for save in saves:
        assert save["async"] is True and save["bytes"] > 0
        assert 0 <= save["waited_s"] <= save["blocked_s"] and save["staged_s"] <= save["blocked_s"]
        assert save["written_s"] > 0
    assert "[rank 0] checkpoint checkpoints/epoch-2 writing in the background: training" in output


def test_the_final_model_loads_into_the_bare_model(fsdp_run: tuple[Path, str]) -> None:
    import torch

    sys.path.insert(0, str(Path(TEMPLATE).parent))
    try:
        from template import build_model
    finally:
        sys.path.pop(0)
    out, _ = fsdp_run
    state = torch.load(out / "finalmodel.pt", weights_only=True)
    model = build_model()
    model.load_state_dict(state)  # strict: every name, every shape
    assert state["0.weight"].shape == (64, 20) and state["2.weight"].shape == (1, 64)


def test_resume_skips_newer_incomplete_folders_and_names_what_they_lack(
    fsdp_run: tuple[Path, str], tmp_path: Path
) -> None:
    """epoch-6 half written (no .metadata), epoch-4 lost a shard: epoch-2 it is; then every
    epoch 3-6 is trained once, as the uninterrupted run trained 3 and 4."""
    done_out, _ = fsdp_run
    out = tmp_path / "out"
    shutil.copytree(done_out, out)
    ckpts = out / "checkpoints"
    (ckpts / "epoch-6").mkdir()
    shutil.copy(ckpts / "epoch-4" / SHARDS[0], ckpts / "epoch-6" / SHARDS[0])
    (ckpts / "epoch-4" / SHARDS[1]).unlink()
    with marked() as mark:
        argv = torchrun_argv(["6", "2", "--fsdp", "--out-dir", str(out)])
        done = run(argv, base_env(mark), tmp_path)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert "[rank 0] skipped checkpoints/epoch-6: missing .metadata" in lines, done.stdout
    assert f"[rank 0] skipped checkpoints/epoch-4: missing {SHARDS[1]}" in lines, done.stdout
    for rank in (0, 1):
        resumed = f"[rank {rank}] resumed from checkpoints/epoch-2 (complete: 2 shards)"
        assert any(ln.startswith(resumed) for ln in lines), done.stdout
    metrics = read_metrics(out)
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    first = {m["epoch"]: m["loss"] for m in read_metrics(done_out)}
    assert [metrics[2]["loss"], metrics[3]["loss"]] == pytest.approx([first[3], first[4]])
    assert [c.path for c in layout.scan(str(out)).checkpoints if c.complete] == [
        "checkpoints/epoch-6",
        "checkpoints/epoch-4",
        "checkpoints/epoch-2",
    ]


def test_a_stop_mid_run_resumes_from_its_checkpoint_training_every_epoch_once(
    tmp_path: Path, trainer_hooks: Path
) -> None:
    requeue = tmp_path / "requeue.json"
    out = tmp_path / "out"
    argv = torchrun_argv(["6", "6", "--fsdp", "--out-dir", "out"])  # no save but the signal's
    env = {"VMRUN_REQUEUE_FILE": str(requeue)}
    output = signal_run(tmp_path, trainer_hooks, env, argv, 2, signal.SIGUSR2, delay="0.3")
    note = json.loads(requeue.read_text())
    epoch = note["epoch"]
    assert note == {"epoch": epoch, "signal": "SIGUSR2"} and 2 <= epoch < 6, output
    stop = f"stopping after epoch {epoch} for requeue (SIGUSR2)"
    assert f"[rank 0] {stop}: checkpoint saved\n" in output, output
    (found,) = layout.scan(str(out)).checkpoints
    assert found.path == f"checkpoints/epoch-{epoch}" and found.complete and found.shards == 2
    assert not (out / "finalmodel.pt").exists()
    with marked() as mark:
        argv = torchrun_argv(["6", "6", "--fsdp", "--out-dir", "out"])
        rerun = run(argv, base_env(mark, env), tmp_path)
    assert rerun.returncode == 0, rerun.stdout
    assert f"resumed from checkpoints/epoch-{epoch} (complete: 2 shards)" in rerun.stdout
    assert [m["epoch"] for m in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert not requeue.exists() and (out / "finalmodel.pt").exists()


def test_vmrun_train_local_fsdp_runs_end_to_end(client: Client) -> None:
    import torch

    from vmrun.trainer.template import build_model

    with marked() as mark:
        done = client.vmrun(
            *("train", "--local", "--fsdp", "--epochs", "2", "--save-every", "1"),
            *("--nproc-per-node", "2"),
            env={"OMP_NUM_THREADS": "1", "VMRUN_TEST_MARK": mark},
            timeout=180,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (client.cwd / "results").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["argv"][-5:] == ["2", "1", "--fsdp", "--out-dir", f"results/{run_dir.name}"]
    assert "[rank0] checkpoint checkpoints/epoch-2 complete: 2 shards" in done.stdout
    scanned = layout.scan(str(run_dir))
    assert [(c.path, c.complete, c.shards) for c in scanned.checkpoints] == [
        ("checkpoints/epoch-2", True, 2),
        ("checkpoints/epoch-1", True, 2),
    ]
    assert [m["epoch"] for m in read_metrics(run_dir)] == [1, 2]
    build_model().load_state_dict(torch.load(run_dir / "finalmodel.pt", weights_only=True))
    report = client.vmrun("report", "--json", timeout=60)
    assert report.returncode == 0 and run_dir.name in report.stdout, report.stderr
