"""`vmrun train --store s3://...` on real sshd hosts: the node's copier (store_sync.sh, the
real rclone) puts each snapshot in the bucket (moto's S3 server on its own test host) as
soon as it is renamed into place, while the run goes on; a bucket that goes down mid-run
is said once in the run's log, the run goes on, and the copy catches up; the run's record
follows at the end. A run whose node is then gone entirely comes back from the bucket
alone: `report --store`, then a plain `fetch` (the record it brought names the copy), and
`train --resume` on another host, its metrics going on."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, copier_pids, run_id_of, template_out, wait_for
from store_fixtures import (  # noqa: F401
    SECRET,
    bucket_fixture,
    client,
    install_mover,
    new_bucket,
    s3_env,
    two_hosts_with_mover,
)
from testbed import NetnsBed, TestHost
from train_helpers import Gate

from vmrun.remote_paths import remote_workdir

pytest.importorskip("moto")

GATE = """\
import os, pathlib, sys, time
out = pathlib.Path("ckpt")
out.mkdir(exist_ok=True)
def save(n):
    tmp = out / f".snapshot.pt.tmp-{os.getpid()}"
    tmp.write_bytes(bytes([n]) * 100000)
    os.replace(tmp, out / "snapshot.pt")
    print(f"snapshot saved at epoch {n}", flush=True)
def wait(name):
    deadline = time.monotonic() + 180
    while not pathlib.Path(name).exists():
        if time.monotonic() > deadline:
            sys.exit(f"no {name}")
        time.sleep(0.05)
save(1)
wait("go1")
save(2)
wait("go2")
print("all done", flush=True)
"""


@pytest.fixture
def project(
    bed: NetnsBed, bed_client: Client, host_python: Path, rclone_binary: Path
) -> Iterator[Client]:
    """h1 and h2 in vmrun.toml, each with the mover where vmrun looks for its own copy."""
    with two_hosts_with_mover(bed, bed_client, host_python, rclone_binary) as client:
        yield client


def keys(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = client(endpoint)
    found = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {
        o["Key"][len(prefix) :]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        for o in found
    }


def _showing(host: TestHost, secret: str) -> list[int]:
    """The host's processes whose command line or environment holds `secret`."""
    found = []
    for pid in host.user_pids():
        for part in ("cmdline", "environ"):
            try:
                if secret.encode() in Path(f"/proc/{pid}/{part}").read_bytes():
                    found.append(pid)
            except OSError:
                continue
    return found


def store_state(record: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((record / "store.json").read_text()))
    except (OSError, ValueError):
        return {}


def test_snapshots_reach_the_bucket_as_written_and_a_bucket_down_mid_run_catches_up(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost]
) -> None:
    endpoint, bucket_host = bucket
    name = new_bucket(endpoint)
    h1 = bed["h1"]
    (project.cwd / "gate.py").write_text(GATE)
    env = s3_env(endpoint)
    toml = project.cwd / "vmrun.toml"  # the project's store, no flag
    toml.write_text(f'store = "s3://{name}/runs"\n\n' + toml.read_text())
    # the copier sees the run's environment: tried again every 2 s at most, not 15
    done = project.vmrun(
        "train",
        "gate.py",
        "--launcher",
        "python",
        "-H",
        "h1",
        "--detach",
        "--env",
        "VMRUN_STORE_BACKOFF=2",
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    prefix = f"runs/{rid}/"
    record = h1.home / ".vmrun" / "runs" / rid
    workdir = h1.home / remote_workdir(project.cwd)

    def snapshot(n: int) -> bool:
        return keys(endpoint, name, prefix).get("ckpt/snapshot.pt") == bytes([n]) * 100000

    wait_for(lambda: snapshot(1), 60, "the first snapshot in the bucket while the run waits")
    assert copier_pids(h1) and not _showing(h1, SECRET)  # not in any argv or environment
    stored = keys(endpoint, name, prefix)
    assert "gate.py" not in stored, sorted(stored)  # the code is not the run's output
    assert not [k for k in stored if ".tmp-" in k or k.endswith(".partial")], sorted(stored)

    bucket_host.refuse_port(9000)  # the bucket is down
    try:
        (workdir / "go1").touch()
        wait_for(
            lambda: store_state(record).get("state") == "failing",
            60,
            "the copier to find the bucket down",
        )
        status = project.vmrun("status", "-H", "h1", "--json", env=env)
        (run,) = [r for r in json.loads(status.stdout) if r.get("run") == rid]
        assert run["state"] == "running"
        assert run["store"]["state"] == "failing" and run["store"]["files_waiting"] >= 1, run
        table = project.vmrun("status", "-H", "h1", env=env)
        assert "behind" in table.stdout + table.stderr, table.stdout + table.stderr
    finally:
        bucket_host.unblock_port(9000)
    wait_for(lambda: snapshot(2), 60, "the second snapshot once the bucket is back")
    (workdir / "go2").touch()
    wait_for(lambda: store_state(record).get("state") == "done", 60, "the copier's last copy")
    wait_for(lambda: not copier_pids(h1), 10, "the copier to exit")
    stored = keys(endpoint, name, prefix)
    log = stored[".vmrun/log"].decode()
    assert "all done" in log
    assert log.count("failed (") == 1 and log.count("caught up") == 1, log
    assert stored[".vmrun/exit_code"].strip() == b"0"
    meta = json.loads(stored[".vmrun/run.json"])
    assert meta["store"] == f"s3://{name}/runs/{rid}" and meta["store_node"] == "h1"
    assert not [
        f for f in record.iterdir() if f.name.startswith("store.") and f.name not in ("store.json",)
    ], sorted(f.name for f in record.iterdir())
    for text in (stored[".vmrun/run.json"].decode(), log, (record / "run.json").read_text()):
        assert SECRET not in text

    _fetched_from_the_bucket_twice(project, f"s3://{name}/runs", rid, env)
    _listed_from_the_bucket(project, f"s3://{name}/runs", rid, env)


def _listed_from_the_bucket(project: Client, store: str, rid: str, env: Any) -> None:
    """`status --from-store`: the run as its copy says, the hosts not asked."""
    listed = project.vmrun("status", "--from-store", "--json", env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr + listed.stdout
    (run,) = json.loads(listed.stdout)
    assert (run["run"], run["state"], run["exit"], run["hosts"]) == (rid, "done", 0, None)
    assert run["bucket"] == f"{store}/{rid}" and run["store"]["state"] == "copied"
    assert run["record"]["store"] == f"{store}/{rid}" and run["duration_s"] > 0
    table = project.vmrun("status", "--store", store, env=env, timeout=120)
    assert table.returncode == 0, table.stderr + table.stdout
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(rid)]
    assert store in row and "done" in row and "in the bucket" in row, table.stdout


def _fetched_from_the_bucket_twice(project: Client, store: str, rid: str, env: Any) -> None:
    """`fetch results --store`: the run's files straight from the bucket; again, nothing."""
    fetched = project.vmrun(
        "fetch", "results", "--run", rid, "--store", store, env=env, timeout=120
    )
    assert fetched.returncode == 0, fetched.stderr + fetched.stdout
    local = project.cwd / "results" / rid
    assert (local / "ckpt" / "snapshot.pt").read_bytes() == bytes([2]) * 100000
    assert "all done" in (local / "log").read_text()
    again = project.vmrun("fetch", "results", "--run", rid, "--store", store, env=env, timeout=120)
    assert again.returncode == 0 and "unchanged" in again.stdout + again.stderr, again.stdout


def _listed_while_its_node_is_cut(project: Client, store: str, rid: str, env: Any) -> None:
    """`status -H h1 --store`: h1 does not answer; its copy, recent and with no end, says
    the run runs."""
    listed = project.vmrun("status", "-H", "h1", "--store", store, "--json", env=env)
    assert listed.returncode == 12, listed.stderr + listed.stdout  # h1 did not answer
    run, place = json.loads(listed.stdout)
    assert (run["run"], run["state"], run["hosts"]) == (rid, "running", None), run
    assert "as its bucket copy said" in run["reason"] and run["epochs_done"] >= 10, run
    assert (run["epochs_asked"], run["bucket"]) == (40, f"{store}/{rid}"), run
    assert place["hosts"] == ["h1"] and place["error"]["code"] == "host-unreachable"


def test_a_run_whose_node_is_gone_is_fetched_and_resumed_elsewhere_from_the_bucket(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost], gate: Gate
) -> None:
    """The run holds after its epoch 20 of 40 (a trainer hook) until the node is gone."""
    endpoint, _ = bucket
    name = new_bucket(endpoint)
    h1, h2 = bed["h1"], bed["h2"]
    env = s3_env(endpoint)
    store = f"s3://{name}/runs"
    done = project.vmrun(
        "train",
        "-H",
        "h1",
        "--epochs",
        "40",
        "--save-every",
        "10",
        "--store",
        store,
        "--detach",
        *gate.options(20),
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)

    def saved() -> bool:
        stored = keys(endpoint, name, f"runs/{rid}/")
        return "snapshot.pt" in stored and b"snapshot saved" in stored.get(".vmrun/log", b"")

    wait_for(saved, 120, "a snapshot in the bucket, and the log that says so")
    h1.stop_sshd()  # the node is gone, with everything on it
    try:
        shutil.rmtree(h1.home / ".vmrun" / "runs", ignore_errors=True)
        shutil.rmtree(h1.home / "vmrun", ignore_errors=True)
        assert not copier_pids(h1)
        _listed_while_its_node_is_cut(project, store, rid, env)

        report = project.vmrun("report", rid, "--store", store, "--json", env=env, timeout=120)
        assert report.returncode == 0, report.stderr + report.stdout
        (row,) = json.loads(report.stdout)  # its metrics and logs, from the bucket
        assert row["run"] == rid and row["error"] is None, row
        # no --store: its record, which `report` brought here, names its copy
        fetched = project.vmrun("fetch", "results", "--run", rid, env=env, timeout=120)
        assert fetched.returncode == 0, fetched.stderr + fetched.stdout
        assert f"from {store}/{rid}/" in fetched.stdout, fetched.stdout
        local = project.cwd / "results" / rid
        assert (local / "snapshot.pt").stat().st_size > 0 and (local / "run.json").is_file()
        saved = [json.loads(x)["epoch"] for x in (local / "metrics.jsonl").read_text().splitlines()]
        assert saved and saved == list(range(1, len(saved) + 1))

        gate.open()
        resumed = project.vmrun(
            "train",
            "--resume",
            rid,
            "--store",
            store,
            "-H",
            "h2",
            *gate.options(20),
            env=env,
            timeout=600,
        )
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        said = [x for x in resumed.stdout.splitlines() if x.startswith(("vmrun", "---"))]
        assert "attempt 2, resumed from epoch" in resumed.stdout, "\n".join(said)
        assert not [line for line in said if "failed" in line], "\n".join(said)
        out = template_out(h2, project, rid)
        epochs = [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert epochs == list(range(1, 41))  # the metrics go on, each epoch once
        record = h2.home / ".vmrun" / "runs" / rid
        assert (record / "attempt").read_text().strip() == "2"
        wait_for(lambda: store_state(record).get("state") == "done", 60, "the last copy")
        stored = keys(endpoint, name, f"runs/{rid}/")
        assert stored["metrics.jsonl"] == (out / "metrics.jsonl").read_bytes()
        assert json.loads(stored[".vmrun/run.json"])["store_node"] == "h2"
    finally:
        h1.start_sshd()
