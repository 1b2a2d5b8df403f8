"""`vmrun train --recover` on real sshd hosts: the run's supervisor (vmrun itself, put on a
host of its own by vmrun: an env from the wheels this machine sends, vmrun's code, a key
made there) brings the run back without the laptop, whose vmrun is gone once the run has
started: a rank that crashes is started again on the same node from its newest snapshot,
the same crash again and again is given up, and the supervisor's key is off every host at
the end. The run copies to a bucket (moto's S3 on a test host of its own). A spot VM's
warnings come from the STAND-IN metadata service (tests/standins/imds.py: IMDS exists only
on EC2) in that node's own namespace."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, clean_host, run_id_of, supervisor_envs, wait_for
from imds_fixtures import metadata
from store_fixtures import bucket_fixture, install_mover, new_bucket, s3_env  # noqa: F401
from testbed import NetnsBed, TestHost
from train_helpers import Gate

from vmrun.remote_paths import remote_workdir

pytest.importorskip("moto")

CRASHY = """\
import json, os, pathlib, sys, time
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
snap = out / "snapshot.pt"
start = int(snap.read_text()) + 1 if snap.exists() else 1
total, crash_at, always = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "always"
crashed = pathlib.Path("crashed")
for epoch in range(start, total + 1):
    time.sleep(0.2)
    if always and epoch == crash_at:  # every time, before its snapshot: a crash loop
        sys.exit(3)
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"epoch": epoch}) + "\\n")
    tmp = out / f".snapshot.pt.tmp-{os.getpid()}"
    tmp.write_text(str(epoch))
    os.replace(tmp, snap)
    print(f"epoch {epoch}/{total}", flush=True)
    print(f"snapshot saved at epoch {epoch}", flush=True)
    if epoch == crash_at and not crashed.exists():
        while sys.argv[3] == "gated" and not pathlib.Path("go").exists():
            time.sleep(0.05)  # the test says when
        crashed.touch()
        while sys.argv[3] == "hang":
            time.sleep(1)  # stuck: no line, no exit
        sys.exit(3)
print("all done", flush=True)
"""


HOSTS = ("h1", "h2", "h3", "bastion")


@pytest.fixture
def project(
    bed: NetnsBed,
    bed_client: Client,
    host_python: Path,
    rclone_binary: Path,
    supervisor_wheels: Path,
    bucket: tuple[str, TestHost],
) -> Iterator[Client]:
    """h1..h3 in vmrun.toml with the mover; the bucket's store; the supervisor's wheels."""
    endpoint, _ = bucket
    name = new_bucket(endpoint)
    hosts = [f'[[hosts]]\naddress = "{h}"\npython = "{host_python}"\n' for h in HOSTS]
    (bed_client.cwd / "vmrun.toml").write_text(f'store = "s3://{name}/runs"\n\n' + "\n".join(hosts))
    (bed_client.cwd / "crashy.py").write_text(CRASHY)
    bed_client.extra_env.update(s3_env(endpoint))
    bed_client.extra_env["VMRUN_SUPERVISOR_WHEELS"] = str(supervisor_wheels)
    bed_client.extra_env["OMP_NUM_THREADS"] = "1"
    for host in HOSTS:
        install_mover(bed[host], rclone_binary)
    yield bed_client
    for host in HOSTS:
        _stop_supervisor(bed[host])
        clean_host(bed[host])


def _stop_supervisor(host: TestHost) -> None:

    for pid in host.user_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"vmrun\0supervise" in argv:
            os.kill(pid, signal.SIGKILL)
    host.run(["crontab", "-r"], as_user=True, check=False)  # a boot entry a failure left
    keys = host.home / ".ssh" / "authorized_keys"  # a key a lost node kept
    if keys.is_file():
        kept = [x for x in keys.read_text().splitlines(True) if "vmrun-supervisor:" not in x]
        keys.write_text("".join(kept))


def _events(host: TestHost, rid: str) -> list[dict[str, Any]]:
    path = host.home / ".vmrun" / "supervisor" / "runs" / rid / "events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _supervising(host: TestHost) -> bool:
    return any(
        b"vmrun\0supervise" in Path(f"/proc/{p}/cmdline").read_bytes()
        for p in host.user_pids()
        if Path(f"/proc/{p}/cmdline").exists()
    )


def _allowed(host: TestHost) -> str:
    keys = host.home / ".ssh" / "authorized_keys"
    return keys.read_text() if keys.is_file() else ""


def test_a_crashed_rank_is_started_again_from_its_snapshot_with_the_laptop_gone(
    bed: NetnsBed, project: Client
) -> None:
    h1, h3 = bed["h1"], bed["h3"]
    for env in supervisor_envs(h3.home):  # made by this run (the others find it there)
        shutil.rmtree(env)
    done = project.vmrun(
        "train",
        "crashy.py",
        "--launcher",
        "python",
        "-H",
        "h1",
        "--recover",
        "--supervisor",
        "h3",
        "--",
        "8",
        "3",
        "once",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert "its supervisor runs on h3" in done.stderr, done.stderr
    assert "h3: the supervisor's env made" in done.stderr
    assert "vmrun-supervisor:" in _allowed(h1)  # its own key, not the user's
    out = h1.home / remote_workdir(project.cwd) / "out"
    wait_for(
        lambda: "all done" in (h1.home / ".vmrun" / "runs" / rid / "log").read_text(),
        180,
        "the run to finish after its crash",
    )
    epochs = [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, 9))  # none missing, none twice
    events = _events(h3, rid)
    assert [e["action"] for e in events] == ["restart"], events
    assert events[0]["failure"]["exit_code"] == 3 and events[0]["failure"]["epoch"] == 3
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")
    assert f"vmrun-supervisor:{rid}" not in _allowed(h1)  # its key is gone again
    status = project.vmrun("status", "-H", "h1", "--json")
    (run,) = [r for r in json.loads(status.stdout) if r.get("run") == rid]
    assert run["state"] == "done" and run["attempts"] == 2, run
    assert run["recoveries"]["count"] == 1 and not run["recoveries"]["gave_up"], run
    fetched = project.vmrun("fetch", "logs", "--run", rid, "-H", "h1")
    assert fetched.returncode == 0, fetched.stderr
    kept = (project.cwd / "results" / rid / "recoveries").read_text()
    assert kept.startswith("recovery\t") and "recovery 1 of 5" in kept  # with the run's logs
    (out / "metrics.jsonl").replace(project.cwd / "results" / rid / "metrics.jsonl")
    report = project.vmrun("report", rid, "--json")
    (row,) = json.loads(report.stdout)
    (done,) = row["recoveries"]
    assert done["text"].startswith("recovery 1 of 5: exit 3: again on the same nodes"), row
    assert done["epochs_redone"] == 0 and 0 < done["downtime_s"] < 60, row  # saved, then crashed


def test_a_hung_run_is_stopped_with_its_stacks_and_started_again_from_its_snapshot(
    bed: NetnsBed, project: Client
) -> None:
    """After its 3rd epoch's snapshot the script hangs (no line, no exit): the hang watcher
    takes its stack and stops it (exit 124, --on-hang stop being --recover's default), the
    supervisor starts it again from the snapshot, and it ends with every epoch once."""
    h1, h3 = bed["h1"], bed["h3"]
    done = project.vmrun(
        "train",
        "crashy.py",
        "--launcher",
        "python",
        "-H",
        "h1",
        "--recover",
        "--supervisor",
        "h3",
        "--hang-timeout",
        "4s",
        "--",
        "8",
        "3",
        "hang",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    rec = h1.home / ".vmrun" / "runs" / rid
    wait_for(lambda: "all done" in (rec / "log").read_text(), 180, "the run to finish")
    log = (rec / "log").read_text()
    assert "hung on" in log and "stopping the run" in log, log
    events = _events(h3, rid)
    assert [e["action"] for e in events] == ["restart"], events
    assert events[0]["failure"]["exit_code"] == 124 and events[0]["failure"]["epoch"] == 3
    out = h1.home / remote_workdir(project.cwd) / "out"
    epochs = [json.loads(x)["epoch"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, 9))
    (stack,) = (rec / "stacks" / "hang-1").glob("rank-*.json")
    assert "crashy.py" in stack.read_text()
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")


def test_the_same_crash_again_and_again_is_given_up(bed: NetnsBed, project: Client) -> None:
    h1, h3 = bed["h1"], bed["h3"]
    done = project.vmrun(
        "train",
        "crashy.py",
        "--launcher",
        "python",
        "-H",
        "h1",
        "--recover",
        "--supervisor",
        "h3",
        "--",
        "8",
        "2",
        "always",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    deadline = time.monotonic() + 240
    while _supervising(h3) or not _events(h3, rid):
        assert time.monotonic() < deadline, _events(h3, rid)
        time.sleep(0.5)
    actions = [e["action"] for e in _events(h3, rid)]
    assert actions == ["restart", "restart", "give-up"], _events(h3, rid)
    assert {e["failure"]["epoch"] for e in _events(h3, rid)} == {1}  # never further
    assert "crash loop" in _events(h3, rid)[-1]["why"]
    log = (h3.home / ".vmrun" / "supervisor" / "runs" / rid / "log").read_text()
    assert log.count("gave up") == 1, log
    said = project.vmrun("logs", rid, "-H", "h1")  # why, with the run's own lines
    assert said.stdout.count("the supervisor gave up: a crash loop") == 1, said.stdout
    status = project.vmrun("status", "-H", "h1", "--json")
    (run,) = [r for r in json.loads(status.stdout) if r.get("run") == rid]
    assert run["state"] == "failed" and run["recoveries"]["gave_up"], run
    assert run["recoveries"]["count"] == 3 and "crash loop" in run["recoveries"]["last"]
    assert f"vmrun-supervisor:{rid}" not in _allowed(h1)


def _two_nodes_saving(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost], gate: Gate
) -> str:
    """The template on h1 and h2 with its supervisor on h3 and the spare bastion, once its
    first snapshot is in the bucket; its run id. It holds after epoch 7 of 10 until `gate`
    exists (a trainer hook), so it still trains when the test loses a node."""
    from store_fixtures import client

    endpoint, _ = bucket
    name = project.cwd.joinpath("vmrun.toml").read_text().split("s3://")[1].split("/")[0]
    done = project.vmrun(
        "train",
        "-H",
        "h1",
        "-H",
        "h2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "10",
        "--save-every",
        "5",
        "--recover",
        "--supervisor",
        "h3",
        "--spare",
        "bastion",
        *gate.options(7),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    s3 = client(endpoint)

    def saved() -> bool:
        listed = s3.list_objects_v2(Bucket=name, Prefix=f"runs/{rid}/").get("Contents", [])
        return any(o["Key"].endswith("/snapshot.pt") for o in listed)

    wait_for(saved, 120, "a snapshot in the bucket")
    following = lambda: all(f"[{n} " in _said(bed["h3"], rid) for n in ("h1", "h2"))  # noqa: E731
    wait_for(following, 60, "the supervisor to follow both nodes' logs")  # before any fault
    return rid


def _replaced(supervisor: TestHost, rid: str, gate: Gate) -> list[dict[str, Any]]:
    """Once the supervisor has recorded its recovery, the gate opened: the run may end."""
    wait_for(lambda: _events(supervisor, rid), 240, "the supervisor's recovery")
    gate.open()
    return _events(supervisor, rid)


def _ended(log: Path, supervisor: TestHost, rid: str) -> None:
    """Until the run's log says it ended; past the deadline, what the supervisor did."""
    said = supervisor.home / ".vmrun" / "supervisor" / "runs" / rid / "log"
    deadline = time.monotonic() + 200
    while not (log.is_file() and "final model saved" in log.read_text()):
        assert time.monotonic() < deadline, said.read_text()[-3000:] if said.is_file() else ""
        time.sleep(0.2)


def _epochs(host: TestHost, project: Client, rid: str) -> list[int]:
    """The epochs in the run's metrics.jsonl (none before its first: a detached run's
    start returns as soon as its supervisor runs)."""
    out = host.home / remote_workdir(project.cwd) / "results" / rid / "metrics.jsonl"
    text = out.read_text() if out.is_file() else ""
    return [json.loads(x)["epoch"] for x in text.splitlines()]


def _said(supervisor: TestHost, rid: str) -> str:
    path = supervisor.home / ".vmrun" / "supervisor" / "runs" / rid / "log"
    return path.read_text() if path.is_file() else ""


def _found_gone(supervisor: TestHost, rid: str, node: str) -> None:
    """Until the supervisor's follower says the node failed; past the deadline, its log."""
    deadline = time.monotonic() + 60
    while f"node {node} failed" not in _said(supervisor, rid):
        own = [x for x in _said(supervisor, rid).splitlines() if x.startswith("vmrun:")]
        assert time.monotonic() < deadline, "\n".join(own)[-3000:]
        time.sleep(0.1)


def test_a_network_blip_is_recovered_on_the_same_nodes_not_taken_for_a_stop(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost], gate: Gate
) -> None:
    """h2's link cut (no reset: its packets vanish) until the supervisor has found it
    silent and its follower has stopped h1, then healed: the follower's own stop is not the
    user's, so the run is brought back, on the same nodes (h2 answers again; the spare is
    kept for a node that stays gone), and ends with every epoch once."""
    h1, h2, h3 = bed["h1"], bed["h2"], bed["h3"]
    rid = _two_nodes_saving(bed, project, bucket, gate)
    cut = time.monotonic()
    h2.cut_link()
    try:
        _found_gone(h3, rid, "h2")
        print(f"h2 found silent {time.monotonic() - cut:.1f} s after the cut")
    finally:
        h2.heal_link()
    log = h1.home / ".vmrun" / "runs" / rid / "log"
    events = _replaced(h3, rid, gate)
    _ended(log, h3, rid)
    assert [(e["action"], e["nodes"]) for e in events] == [("restart", ["h1", "h2"])], events
    assert events[0]["failure"]["returned"] == ["h2"]
    assert "was stopped (vmrun stop)" not in _said(h3, rid)
    assert _epochs(h1, project, rid) == list(range(1, 11))  # every epoch once
    assert "recovery 1 of 5: h2 stopped answering, then answered again" in log.read_text()
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")


def test_a_paused_node_is_found_silent_within_30_s_and_replaced(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost], gate: Gate
) -> None:
    """Two nodes, h2 then paused (SIGSTOP of its sshd, its sessions and the run's
    processes: nothing is killed, no socket closed, as a VM its hypervisor froze): the
    supervisor (on h3) finds it silent within 30 s with its own checks, whatever its log
    stream does, and puts the spare in its place; h1 gives it the newest snapshot; the run
    ends with every epoch once."""
    h1, h2, h3 = bed["h1"], bed["h2"], bed["h3"]
    rid = _two_nodes_saving(bed, project, bucket, gate)
    paused: set[int] = set()
    began = time.monotonic()
    try:
        paused = h2.pause()
        _found_gone(h3, rid, "h2")
        found = time.monotonic() - began
        print(f"the paused h2 found silent {found:.1f} s after the pause")
        assert found < 30, _said(h3, rid)[-2000:]
        log = h1.home / ".vmrun" / "runs" / rid / "log"
        events = _replaced(h3, rid, gate)
        _ended(log, h3, rid)
        assert [(e["action"], e["swap"]) for e in events] == [("replace", {"h2": "bastion"})]
        assert _epochs(h1, project, rid) == list(range(1, 11))  # every epoch once
        assert "recovery 1 of 5: lost h2: replaced h2 by bastion" in log.read_text()
        # the spare got py-spy from the supervisor, who got it from here: nothing downloaded
        assert "py-spy" not in log.read_text()
        assert (bed["bastion"].home / ".vmrun" / "tools").is_dir()
    finally:
        h2.resume(paused)
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")


def _objects(endpoint: str, bucket: str, rid: str) -> dict[str, bytes]:
    """Every object of the run's bucket copy, by key, with its bytes."""
    from store_fixtures import client

    s3 = client(endpoint)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{rid}/").get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def test_a_replaced_master_that_comes_back_is_fenced_and_its_bucket_stays_the_newer_attempts(
    bed: NetnsBed, project: Client, bucket: tuple[str, TestHost], gate: Gate
) -> None:
    """The master h1 (the node copying to the bucket) cut and left cut, with its snapshots:
    the spare becomes the master, every node copies the newest snapshot from the run's
    bucket, and the run ends there with every epoch once. Then h1 comes back with its old
    attempt still running (its ranks, torchrun, its copier): the old attempt learns from
    the bucket that a newer one took the run over, stops, and copies nothing; every object
    of the run's bucket copy stays the newer attempt's, byte for byte."""
    from conftest import run_pids

    h1, h3, spare = bed["h1"], bed["h3"], bed["bastion"]
    endpoint, _ = bucket
    name = project.cwd.joinpath("vmrun.toml").read_text().split("s3://")[1].split("/")[0]
    rid = _two_nodes_saving(bed, project, bucket, gate)
    h1.cut_link()
    try:
        events = _replaced(h3, rid, gate)
        _ended(spare.home / ".vmrun" / "runs" / rid / "log", h3, rid)
        assert [(e["action"], e["swap"]) for e in events] == [("replace", {"h1": "bastion"})]
        assert _epochs(spare, project, rid) == list(range(1, 11))
        copied = spare.home / ".vmrun" / "runs" / rid / "store.json"
        wait_for(lambda: '"state": "done"' in copied.read_text(), 120, "the newer attempt's copy")
        newer = _objects(endpoint, name, rid)
        assert newer[f"runs/{rid}/.vmrun/generation"] == b"2\n"
        assert run_pids(h1, rid), "h1's old attempt should still run while it is cut off"
    finally:
        h1.heal_link()
    record = h1.home / ".vmrun" / "runs" / rid
    wait_for(lambda: not run_pids(h1, rid), 60, "the old attempt to be gone from h1")
    wait_for(lambda: not (record / "store.pid").exists(), 60, "the old copier to end")
    now = _objects(endpoint, name, rid)
    assert {k for k in now if now[k] != newer.get(k)} == set()  # nothing of the old attempt's
    assert now == newer
    assert "replaced by attempt 2" in (record / "log").read_text()
    assert '"state": "replaced"' in (record / "store.json").read_text()  # no last pass
    # stopped as replaced, unless its peers' resets ended it first (its own exit recorded)
    stopped = record / "stopped"
    assert (record / "exit_code").exists() or stopped.read_text().strip() == "replaced"
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")


def test_a_supervisor_started_again_goes_on_from_its_journal(
    bed: NetnsBed, project: Client
) -> None:
    """The supervisor killed mid-run and started again by its @reboot line (as its host's
    boot would): it follows the run again, and the crash after it is recovered."""

    h1, h3 = bed["h1"], bed["h3"]
    done = project.vmrun(
        "train",
        "crashy.py",
        "--launcher",
        "python",
        "-H",
        "h1",
        "--recover",
        "--supervisor",
        "h3",
        "--",
        "6",
        "3",
        "gated",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    folder = h3.home / ".vmrun" / "supervisor" / "runs" / rid
    (line,) = [
        x
        for x in h3.run(["crontab", "-l"], as_user=True, text=True).stdout.splitlines()
        if f"vmrun-supervisor:{rid}" in x
    ]
    first = int((folder / "pid").read_text().split()[0])
    os.kill(first, signal.SIGKILL)  # its host went down
    wait_for(lambda: not _supervising(h3), 30, "the supervisor to be gone")
    boot = line.removeprefix("@reboot ").split(" > ")[0]
    h3.run(["sh", "-c", boot], as_user=True, timeout=60)  # what cron runs at boot
    wait_for(lambda: _supervising(h3), 30, "the supervisor to be back")
    assert int((folder / "pid").read_text().split()[0]) != first
    (h1.home / remote_workdir(project.cwd) / "go").touch()  # now the rank crashes
    log = h1.home / ".vmrun" / "runs" / rid / "log"
    wait_for(lambda: "all done" in log.read_text(), 180, "the run to finish after its crash")
    assert [e["action"] for e in _events(h3, rid)] == ["restart"]
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")
    left = h3.run(["crontab", "-l"], as_user=True, text=True, check=False).stdout
    assert f"vmrun-supervisor:{rid}" not in left  # no boot entry left behind


def test_a_run_stopped_by_the_user_is_not_brought_back(bed: NetnsBed, project: Client) -> None:
    h1, h3 = bed["h1"], bed["h3"]
    done = project.vmrun(
        "train",
        "crashy.py",
        "--launcher",
        "python",
        "-H",
        "h1",
        "--recover",
        "--supervisor",
        "h3",
        "--",
        "6",
        "3",
        "gated",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    wait_for(lambda: _supervising(h3), 30, "the supervisor")
    stopped = project.vmrun("stop", rid, "-H", "h1", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end with the run")
    assert _events(h3, rid) == []  # nothing recovered
    assert f"vmrun-supervisor:{rid}" not in _allowed(h1)
    assert not (h3.home / ".vmrun" / "supervisor" / "runs" / rid / "id_ed25519").exists()


def test_a_spot_notice_saves_the_epoch_and_a_spare_takes_the_node(
    bed: NetnsBed, project: Client, tmp_path: Path, gate: Gate
) -> None:
    """h2 is a spot VM: its rebalance recommendation makes the run snapshot and go on; its
    interruption notice makes the run snapshot the epoch under way and stop, and the
    supervisor resumes it on the spare at the next epoch: nothing redone, every epoch once.
    The run (epochs paced at 0.2 s) holds after its epoch 14 of 16 until the test has seen
    the recovery (a notice, noted by the template, ends a hold: its check still comes)."""
    h1, h2, h3 = bed["h1"], bed["h2"], bed["h3"]
    with metadata(h2, tmp_path) as (state, requests):
        done = project.vmrun(
            "train",
            "-H",
            "h1",
            "-H",
            "h2",
            "--nproc-per-node",
            "1",
            "--epochs",
            "16",
            "--save-every",
            "16",
            "--recover",
            "--supervisor",
            "h3",
            "--spare",
            "bastion",
            "--env",
            "VMRUN_SPOT_EVERY=0.5",  # the resume needs it again
            *gate.options(14, EPOCH_DELAY="0.2"),
            timeout=600,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        rid = run_id_of(done.stderr)
        log, noted = (host.home / ".vmrun" / "runs" / rid / "log" for host in (h1, h2))
        wait_for(lambda: len(_epochs(h1, project, rid)) >= 3, 120, "three epochs")
        state.write_text(json.dumps({"rebalance": {"noticeTime": "2026-11-29T10:00:00Z"}}))
        wait_for(lambda: "snapshot saved at epoch" in log.read_text(), 60, "the asked snapshot")
        assert "spot rebalance recommendation" in noted.read_text()
        assert "for requeue" not in log.read_text()  # it goes on
        action = {"action": "terminate", "time": "2026-11-29T10:02:00Z"}
        state.write_text(json.dumps({"instance-action": action}))
        events = _replaced(h3, rid, gate)
        _ended(log, h3, rid)
    text = log.read_text()
    stops = [x for x in text.splitlines() if "for requeue (SIGUSR2): snapshot saved" in x]
    assert len(stops) == 1, text[-3000:]
    epoch = int(stops[0].split("stopping after epoch ")[1].split()[0])
    assert f"resumed from snapshot at epoch {epoch + 1} " in text, text[-3000:]
    assert _epochs(h1, project, rid) == list(range(1, 17))  # none missing, none twice
    assert noted.read_text().count("spot interruption notice (terminate at 2026-11-29") == 1
    assert [(e["action"], e["swap"]) for e in events] == [("replace", {"h2": "bastion"})]
    assert events[0]["failure"]["noticed"] == ["h2"] and events[0]["failure"]["exit_code"] == 75
    assert "recovery 1 of 5: spot notice on h2: replaced h2 by bastion" in text
    asked = requests.read_text().splitlines()
    assert asked[0].startswith("PUT /latest/api/token ok"), asked[:3]  # IMDSv2: a token first
    assert all(x.endswith(" ok") for x in asked), [x for x in asked if not x.endswith(" ok")]
    wait_for(lambda: not _supervising(h3), 60, "the supervisor to end")


def test_a_node_whose_gpu_is_unfit_is_replaced_by_a_spare_before_the_run_starts(
    bed: NetnsBed, project: Client
) -> None:
    """h2's GPU has a row remapping pending (the STAND-IN `nvidia-smi -q`, recorded on a
    real A100): with --recover the run starts on h1 and the spare in h2's place, said."""
    from gpu_standins import SICK, install

    install(bed["h2"], SICK, [])
    toml = project.cwd / "vmrun.toml"
    toml.write_text(
        toml.read_text().replace(
            'address = "h2"\n', 'address = "h2"\nnvidia_smi = "~/.vmrun/bin/nvidia-smi"\n'
        )
    )
    done = project.vmrun(
        "train",
        "-H",
        "h1",
        "-H",
        "h2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "300",
        "--save-every",
        "5",
        "--recover",
        "--supervisor",
        "h3",
        "--spare",
        "bastion",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert re.search(
        r"h2: GPU 0000:\S+ a row remapping is pending.*; --recover puts the spare"
        r" bastion in its place",
        done.stderr,
    ), done.stderr
    assert f"run {rid} started on h1, bastion" in done.stderr, done.stderr
    assert not (bed["h2"].home / ".vmrun" / "runs" / rid).exists()
    stopped = project.vmrun("stop", rid, "-H", "h1", "-H", "bastion", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
