"""A sharded (`--fsdp`) run resumed where its shards are scattered, on real sshd hosts with
real torchrun over gloo, FSDP2 on CPU and the real rclone against moto's S3: its two hosts
gone, `train --resume RUN --store ... -H h3 -H bastion` on two hosts that never saw it gives
each the newest checkpoint complete in the bucket, whole (the ranks may land elsewhere),
names the newer one that is not, and goes on from there, every epoch once. Under
`--recover`, a worker's link cut and left cut: the spare in its place gets that worker's
shards (and the master's) from the bucket, the master keeps its own and gets the lost
worker's, and the run finishes, every epoch once."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, run_id_of, template_out, wait_for
from store_fixtures import bucket_fixture, client, install_mover, new_bucket, s3_env  # noqa: F401
from test_train_recover import _ended, _epochs, _replaced, _said, _stop_supervisor, _supervising
from test_train_store import keys
from testbed import NetnsBed, TestHost
from train_helpers import Gate

from vmrun.hostside import checkpoint_layout

pytest.importorskip("moto")

HOSTS = ("h1", "h2", "h3", "bastion")


@pytest.fixture
def project(
    bed: NetnsBed, bed_client: Client, host_python_tb: Path, rclone_binary: Path
) -> Iterator[Client]:
    """Four hosts in vmrun.toml with the mover; their torch has numpy (DCP needs it)."""
    hosts = [f'[[hosts]]\naddress = "{h}"\npython = "{host_python_tb}"\n' for h in HOSTS]
    (bed_client.cwd / "vmrun.toml").write_text("\n".join(hosts))
    bed_client.extra_env["OMP_NUM_THREADS"] = "1"
    for name in HOSTS:
        install_mover(bed[name], rclone_binary)
    try:
        yield bed_client
    finally:
        for name in HOSTS:
            if bed[name].link_cut:
                bed[name].heal_link()
            bed[name].start_sshd()
            _stop_supervisor(bed[name])
            clean_host(bed[name])


# the template sharded on h1 and h2, a checkpoint every 2 of its 6 epochs
TWO_HOSTS_SIX_EPOCHS = (
    *("train", "--fsdp", "-H", "h1", "-H", "h2", "--nproc-per-node", "1"),
    *("--epochs", "6", "--save-every", "2"),
)


def test_two_new_hosts_resume_a_sharded_run_from_the_newest_checkpoint_whole_in_the_bucket(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost], gate: Gate
) -> None:
    """The run holds after epoch 5 of 6 (a trainer hook) once epoch-4 is in the bucket;
    its two hosts are then gone with everything on them. The bucket also gets an epoch-6
    folder of shards alone (a save whose .metadata never came)."""
    endpoint, _ = bucket
    name = new_bucket(endpoint)
    env = s3_env(endpoint)
    store = f"s3://{name}/runs"
    h1, h2, h3, bastion = (bed[h] for h in HOSTS)
    started = project.vmrun(
        *TWO_HOSTS_SIX_EPOCHS,
        "--store",
        store,
        "--detach",
        *gate.options(5),
        env=env,
        timeout=600,
    )
    assert started.returncode == 0, started.stderr + started.stdout
    rid = run_id_of(started.stderr)
    place = f"runs/{rid}/"

    def saved() -> bool:
        return "checkpoints/epoch-4/.metadata" in keys(endpoint, name, place)

    wait_for(saved, 300, "epoch-4 whole in the bucket")
    stored = keys(endpoint, name, place)
    for host in (h1, h2):  # gone, with everything on them
        host.stop_sshd()
        shutil.rmtree(host.home / ".vmrun" / "runs", ignore_errors=True)
        shutil.rmtree(host.home / "vmrun", ignore_errors=True)
    shard = stored["checkpoints/epoch-4/__0_0.distcp"]
    client(endpoint).put_object(
        Bucket=name, Key=f"{place}checkpoints/epoch-6/__0_0.distcp", Body=shard
    )
    gate.open()
    resumed = project.vmrun(
        "train",
        "--resume",
        rid,
        "--store",
        store,
        "-H",
        "h3",
        "-H",
        "bastion",
        *gate.options(5),
        env=env,
        timeout=600,
    )
    said = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, said
    assert (
        f"run {rid}: skipped checkpoints/epoch-6, newer but not whole anywhere:"
        " no .metadata anywhere (still being written)"
    ) in said, said
    assert (
        f"run {rid}: resumes from checkpoints/epoch-4, complete: 2 shards"
        " (to bastion, h3 from the bucket)"
    ) in said, said
    assert "--- attempt 2, resumed from epoch 5 (checkpoints/epoch-4) ---" in said, said
    for rank in (0, 1):
        line = f"rank{rank}] resumed from checkpoints/epoch-4 (complete: 2 shards) at epoch 5"
        assert line in said, said
    out = template_out(h3, project, rid)
    epochs = [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3, 4, 5, 6]  # every epoch once
    for host in (h3, bastion):
        found = checkpoint_layout.scan(str(template_out(host, project, rid)))
        points = {c.path: c for c in found.checkpoints}
        assert points["checkpoints/epoch-4"].complete, points  # whole on each node
        assert "checkpoints/epoch-2" not in points, sorted(points)  # only the one chosen
    assert (out / "finalmodel.pt").is_file()


def test_a_lost_workers_shards_reach_the_spare_from_the_bucket_and_the_run_finishes(
    bed: NetnsBed,
    project: Client,
    bucket: tuple[str, TestHost],
    gate: Gate,
    supervisor_wheels: Path,
) -> None:
    """h1 and h2 train with the supervisor on h3 and the spare bastion; the run holds after
    epoch 5 of 6 once epoch-4 is whole in the bucket; h2's link is cut and left cut."""
    endpoint, _ = bucket
    name = new_bucket(endpoint)
    text = project.cwd.joinpath("vmrun.toml").read_text()
    project.cwd.joinpath("vmrun.toml").write_text(f'store = "s3://{name}/runs"\n\n' + text)
    project.extra_env.update(s3_env(endpoint))
    project.extra_env["VMRUN_SUPERVISOR_WHEELS"] = str(supervisor_wheels)
    h1, h2, h3, bastion = (bed[h] for h in HOSTS)
    started = project.vmrun(
        *TWO_HOSTS_SIX_EPOCHS,
        "--recover",
        "--supervisor",
        "h3",
        "--spare",
        "bastion",
        *gate.options(5),
        timeout=600,
    )
    assert started.returncode == 0, started.stderr + started.stdout
    rid = run_id_of(started.stderr)
    place = f"runs/{rid}/"
    wait_for(
        lambda: "checkpoints/epoch-4/.metadata" in keys(endpoint, name, place),
        300,
        "epoch-4 whole in the bucket",
    )
    following = lambda: all(f"[{n} " in _said(h3, rid) for n in ("h1", "h2"))  # noqa: E731
    wait_for(following, 60, "the supervisor to follow both nodes' logs")
    assert not (template_out(h1, project, rid) / "checkpoints/epoch-4/__1_0.distcp").exists()
    h2.cut_link()
    try:
        events = _replaced(h3, rid, gate)
        log = h1.home / ".vmrun" / "runs" / rid / "log"
        _ended(log, h3, rid)
        assert [(e["action"], e["swap"]) for e in events] == [("replace", {"h2": "bastion"})]
        said = _said(h3, rid)
        assert (
            f"run {rid}: resumes from checkpoints/epoch-4, complete: 2 shards"
            " (to bastion, h1 from the bucket)"
        ) in said, said[-3000:]
        written = log.read_text()
        assert "--- attempt 2, resumed from epoch 5 (checkpoints/epoch-4) ---" in written
        assert "resumed from checkpoints/epoch-4 (complete: 2 shards) at epoch 5" in written
        assert _epochs(h1, project, rid) == [1, 2, 3, 4, 5, 6]  # every epoch once
        for host in (h1, bastion):  # the lost worker's shard on both, from the bucket
            found = checkpoint_layout.scan(str(template_out(host, project, rid)))
            points = {c.path: c for c in found.checkpoints}
            assert points["checkpoints/epoch-4"].complete, points
    finally:
        h2.heal_link()
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")
