"""`vmrun train --fsdp --store s3://... -H h1 -H h2` on real sshd hosts: every node's copier
(store_sync.sh, the real rclone) sends its own ranks' shards under the run's one prefix,
the master its record and each checkpoint's `.metadata` only once the bucket holds every
shard it names; so each checkpoint in the bucket (moto's S3 server on its own test host)
is complete by checkpoint_layout's rule, and the node that is not the master never
claims the attempt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, run_id_of, template_out, wait_for
from store_fixtures import bucket_fixture, install_mover, new_bucket, s3_env, two_hosts_with_mover  # noqa: F401
from test_train_store import keys, store_state
from testbed import NetnsBed, TestHost

from vmrun.hostside import checkpoint_layout

pytest.importorskip("moto")


@pytest.fixture
def project(
    bed: NetnsBed, bed_client: Client, host_python_tb: Path, rclone_binary: Path
) -> Iterator[Client]:
    """h1 and h2 in vmrun.toml with the mover; their torch has numpy (DCP's gather of each
    rank's plan needs it)."""
    with two_hosts_with_mover(bed, bed_client, host_python_tb, rclone_binary) as client:
        yield client


def test_every_ranks_shard_reaches_the_bucket_and_each_checkpoint_there_is_complete(
    bed: NetnsBed,
    project: Client,
    bucket: tuple[str, TestHost],
    tmp_path: Path,
) -> None:
    endpoint, _ = bucket
    name = new_bucket(endpoint)
    env = s3_env(endpoint)
    h1, h2 = bed["h1"], bed["h2"]
    done = project.vmrun(
        "train",
        "--fsdp",
        "-H",
        "h1",
        "-H",
        "h2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "2",
        "--save-every",
        "1",
        "--store",
        f"s3://{name}/runs",
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    records = {h.name: h.home / ".vmrun" / "runs" / rid for h in (h1, h2)}
    for host, record in records.items():
        wait_for(lambda r=record: store_state(r).get("state") == "done", 120, f"{host}'s copy")
    assert store_state(records["h1"])["role"] == "record"
    assert store_state(records["h2"])["role"] == "outputs"
    assert store_state(records["h2"])["conflicts"] == [], store_state(records["h2"])
    stored = keys(endpoint, name, f"runs/{rid}/")
    on_hosts = {
        h.name: sorted(
            str(p.relative_to(template_out(h, project, rid)))
            for p in template_out(h, project, rid).rglob("*.distcp")
        )
        for h in (h1, h2)
    }
    assert on_hosts["h1"] and on_hosts["h2"], on_hosts  # each node wrote its own shards
    for shards in on_hosts.values():
        for shard in shards:
            assert shard in stored, (shard, sorted(stored))
    points = sorted({k.rsplit("/", 1)[0] for k in stored if k.startswith("checkpoints/epoch-")})
    assert points == ["checkpoints/epoch-1", "checkpoints/epoch-2"], sorted(stored)
    for point in points:  # each as a host would find it, from the bucket's bytes alone
        folder = tmp_path / point
        folder.mkdir(parents=True)
        for key, data in stored.items():
            if key.startswith(point + "/"):
                (folder / key.rsplit("/", 1)[1]).write_bytes(data)
        found = checkpoint_layout.dcp_checkpoint(str(folder))
        assert found.complete and found.shards == 2, found
    meta = json.loads(stored[".vmrun/run.json"])
    assert meta["store_node"] == "h1"
    assert stored[".vmrun/generation"].strip() == b"1"
    assert ".vmrun/log" in stored and not (records["h2"] / "generation").exists()
    # each node's check wrote its own probe (one shared object fails a mover's read-back)
    assert {".vmrun/started", ".vmrun/started.1"} <= set(stored), sorted(stored)
    assert not [k for k in stored if k.endswith((".tmp", ".partial")) or ".tmp-" in k], stored
