"""`vmrun fetch` end to end: the real CLI process against real sshd test hosts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, error_in, errors_in, user_commands, wait_for
from test_transfer import put, sha
from testbed import NetnsBed, TestHost

from vmrun.reporting import Recorder
from vmrun.transfer.manifest import PART_SUFFIX


@pytest.fixture
def remote_dir(bed: NetnsBed) -> Iterator[str]:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    yield name
    for host in ("h1", "h2"):
        subprocess.run(["rm", "-rf", str(bed[host].home / name)], check=False)


def _summary(out: str) -> str:
    lines = [ln for ln in out.splitlines() if "fetched" in ln]
    assert lines, out
    return lines[-1]


def test_fetch_twice_second_moves_nothing(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    h1 = bed["h1"]
    for i in range(30):
        put(h1, f"{remote_dir}/logs/{i}.txt", b"line\n" * i)
    first = bed_client.vmrun("fetch", "-H", "h1", f"~/{remote_dir}", "--to", "out")
    assert first.returncode == 0, first.stderr
    assert re.match(r"fetched 30 files .*0 unchanged", _summary(first.stdout))
    assert (bed_client.cwd / "out" / remote_dir / "logs" / "7.txt").read_bytes() == b"line\n" * 7

    second = bed_client.vmrun("fetch", "-H", "h1", f"~/{remote_dir}", "--to", "out")
    assert second.returncode == 0, second.stderr
    assert _summary(second.stdout).startswith("fetched 0 files, 30 unchanged")


def test_cut_link_mid_transfer_leaves_no_final_file_and_rerun_resumes(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    h1 = bed["h1"]
    # bigger than paramiko's 16 MiB window (the engine for this size): when the link goes,
    # more than what is already buffered here is still to come
    data = os.urandom(40 << 20)
    put(h1, f"{remote_dir}/snapshot.pt", data)
    out = bed_client.cwd / "out" / remote_dir
    proc = bed_client.popen(
        "fetch", "-H", "h1", f"~/{remote_dir}", "--to", "out", "--bwlimit", "8M"
    )
    try:

        def partial() -> bool:
            parts = list(out.glob(f"*{PART_SUFFIX}")) if out.exists() else []
            return bool(parts) and parts[0].stat().st_size >= 2 << 20

        wait_for(partial, 30, "2 MiB of the snapshot to arrive")
        h1.cut_link()
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            h1.heal_link()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 13, err  # connection lost
    assert "connection lost" in err or "stream broke" in err
    assert not (out / "snapshot.pt").exists()
    assert len(list(out.glob(f".snapshot.pt.*{PART_SUFFIX}"))) == 1

    again = bed_client.vmrun("fetch", "-H", "h1", f"~/{remote_dir}", "--to", "out")
    assert again.returncode == 0, again.stderr
    assert "1 resumed" in _summary(again.stdout)
    assert (out / "snapshot.pt").read_bytes() == data
    assert not list(out.glob(f"*{PART_SUFFIX}"))
    wait_for(
        lambda: not [c for c in user_commands(h1) if "tar" in c or "openssl" in c],
        30,
        "the cut session's tar to be gone from the host",
    )


def test_verify_replaces_a_corrupted_copy_that_size_and_mtime_miss(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    h1 = bed["h1"]
    data = os.urandom(300_000)
    there = put(h1, f"{remote_dir}/model.pt", data)
    args = ("fetch", "-H", "h1", f"~/{remote_dir}", "--to", "out")
    first = bed_client.vmrun(*args)
    assert first.returncode == 0, first.stderr
    local = bed_client.cwd / "out" / remote_dir / "model.pt"
    before = local.stat()
    local.write_bytes(bytes(b ^ 0xFF for b in data[:10]) + data[10:])  # same size
    os.utime(local, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime

    plain = bed_client.vmrun(*args)  # documented: size+mtime alone, so it is not noticed
    assert plain.returncode == 0, plain.stderr
    assert _summary(plain.stdout).startswith("fetched 0 files, 1 unchanged")
    assert local.read_bytes() != data

    checked = bed_client.vmrun(*args, "--verify")
    assert checked.returncode == 0, checked.stderr
    line = _summary(checked.stdout)
    assert line.startswith("fetched 1 file (") and "1 replaced (bytes differed)" in line, line
    assert hashlib.sha256(local.read_bytes()).hexdigest() == sha(there)
    assert local.stat().st_mtime_ns == there.stat().st_mtime_ns
    again = bed_client.vmrun(*args, "--verify")
    assert _summary(again.stdout).startswith("fetched 0 files, 1 unchanged"), again.stdout


def test_a_file_rewritten_while_it_travels_fails_verification_with_exit_1(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    """Same size, other bytes, all along: a process on the host keeps rewriting the
    file's last MiB in place (bounded: 90 s), so what its tar sends never matches what
    the host hashed, in the first attempt or the one re-send."""
    h1 = bed["h1"]
    mib = 32
    path = put(h1, f"{remote_dir}/snapshot.pt", os.urandom(mib << 20))
    listed = path.stat().st_mtime_ns
    loop = (
        'while [ $SECONDS -lt 90 ]; do dd if=/dev/urandom of="$0" bs=1M count=1'
        f" seek={mib - 1} conv=notrunc status=none; done"
    )
    rewriter = h1.popen(["bash", "-c", loop, str(path)], as_user=True)
    try:
        wait_for(lambda: path.stat().st_mtime_ns != listed, 30, "the host's rewriter to start")
        done = bed_client.vmrun(
            "fetch", "-H", "h1", f"~/{remote_dir}", "--to", "out", "--bwlimit", "16M"
        )
        assert rewriter.poll() is None  # it rewrote the tail during the whole fetch
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rewriter.pid, signal.SIGKILL)
        rewriter.wait()
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert len(done.stderr.splitlines()) == 1, done.stderr  # one line, no traceback
    [(code, said)] = errors_in(done.stderr)
    assert code == "checksum-mismatch" and said.startswith(f"h1: {remote_dir}/snapshot.pt: "), said
    assert "1 FAILED" in _summary(done.stdout)
    out = bed_client.cwd / "out" / remote_dir
    assert not (out / "snapshot.pt").exists()
    assert not list(out.glob(f"*{PART_SUFFIX}")) and not list(out.glob(".*"))


def test_all_hosts_fetch_into_a_folder_per_host(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    for name in ("h1", "h2"):
        put(bed[name], f"{remote_dir}/who.txt", name.encode())
    (bed_client.cwd / "vmrun.toml").write_text(
        '[[hosts]]\naddress = "h1"\n\n[[hosts]]\naddress = "h2"\n'
    )
    done = bed_client.vmrun("fetch", "--all-hosts", f"~/{remote_dir}")
    assert done.returncode == 0, done.stderr
    for name in ("h1", "h2"):
        got = bed_client.cwd / name / remote_dir / "who.txt"
        assert got.read_bytes() == name.encode()
    assert sorted(re.findall(r"^\[(h\d)\] fetched 1 file", done.stdout, re.M)) == ["h1", "h2"]


@pytest.fixture
def run_on_h1(bed: NetnsBed, remote_dir: str) -> Iterator[tuple[TestHost, str]]:
    """A run record in the layout the runs code writes, with the template's outputs."""
    h1 = bed["h1"]
    run_id = f"t-{uuid.uuid4().hex[:6]}"
    put(h1, f".vmrun/runs/{run_id}/run.json", json.dumps({"workdir": remote_dir}).encode())
    put(h1, f".vmrun/runs/{run_id}/log", b"epoch 1\n")
    out = f"{remote_dir}/results/{run_id}"
    for epoch in (10, 20, 30):
        put(h1, f"{out}/snapshot_{epoch}.pt", b"s%d" % epoch, mtime=1_700_000_000 + epoch)
    put(h1, f"{out}/finalmodel.pt", b"final", mtime=1_700_000_000)
    put(h1, f"{out}/metrics.jsonl", b'{"epoch": 30}\n')
    yield h1, run_id
    subprocess.run(["rm", "-rf", str(h1.home / ".vmrun" / "runs" / run_id)], check=False)


def test_named_things_of_a_run(bed_client: Client, run_on_h1: tuple[TestHost, str]) -> None:
    _, run_id = run_on_h1
    local = bed_client.cwd / "results" / run_id
    done = bed_client.vmrun("fetch", "checkpoints", "--latest", "2", "--run", run_id, "-H", "h1")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(local)) == ["snapshot_20.pt", "snapshot_30.pt"]

    done = bed_client.vmrun("fetch", "metrics", "-H", "h1")  # no --run: the newest run
    assert done.returncode == 0, done.stderr
    assert (local / "metrics.jsonl").exists()
    done = bed_client.vmrun("fetch", "metrics", "logs", "--run", run_id, "-H", "h1")
    assert done.returncode == 0, done.stderr
    assert (local / "metrics.jsonl").read_bytes() == b'{"epoch": 30}\n'
    assert (local / "log").read_bytes() == b"epoch 1\n" and (local / "run.json").exists()

    done = bed_client.vmrun("fetch", "results", "--run", run_id, "-H", "h1")
    assert done.returncode == 0, done.stderr
    assert "snapshot_10.pt" in os.listdir(local) and "finalmodel.pt" in os.listdir(local)
    assert _summary(done.stdout).startswith("fetched 2 files")  # the rest was there

    missing = bed_client.vmrun("fetch", "checkpoints", "--run", "no-such-run", "-H", "h1")
    code, said = error_in(missing.stderr)
    assert missing.returncode == 2 and code == "run-not-found" and "no-such-run" in said


def test_fetch_every_rounds_fetch_the_nodes_in_parallel_and_note_each_apart(
    bed: NetnsBed, bed_client: Client, remote_dir: str, tmp_path: Path
) -> None:
    """`train --fetch-every`'s rounds (vmrun.backends.hosts.fetching): every node at once,
    each into its own folder; a node that cannot be reached yet does not hold the others
    back, and a node without the run is noted without stopping the rest. Notes come per
    node, in order."""
    from vmrun.backends.hosts.fetching import Fetcher
    from vmrun.ssh.group import Group
    from vmrun.ssh.hosts import parse_host
    from vmrun.ssh.inventory import HostEntry

    run_id = f"t-{uuid.uuid4().hex[:6]}"
    record = json.dumps({"workdir": remote_dir}).encode()
    for name in ("h1", "h2"):
        put(bed[name], f".vmrun/runs/{run_id}/run.json", record)
        put(bed[name], f"{remote_dir}/results/{run_id}/snapshot_1.pt", name.encode())
    settings = bed_client.settings(connect_timeout=60)  # h2 waits for its link, not fails
    group = Group([HostEntry(parse_host(n)) for n in ("h2", "h1", "h3")], settings)
    conns = list(group.connections.values())
    said = Recorder()
    fetcher = Fetcher(group, ["h2", "h1", "h3"], run_id, tmp_path, every=3600, out=said)
    local = {name: tmp_path / "results" / run_id / name / "snapshot_1.pt" for name in ("h1", "h2")}
    first = threading.Thread(target=fetcher.round, args=("checkpoints",))
    bed["h2"].cut_link()
    try:
        first.start()
        # h2 comes first and cannot even connect: h1's file arrives meanwhile all the same
        wait_for(local["h1"].exists, 30, "h1's snapshot while h2 is unreachable")
        assert first.is_alive() and not local["h2"].exists() and said.lines == []
        bed["h2"].heal_link()
        first.join(timeout=90)
        assert not first.is_alive()
        fetcher.round("checkpoints")  # nothing new: only h3's failure to say
    finally:
        bed["h2"].heal_link()
        if first.is_alive():  # a failure above: let its round end before the conns close
            first.join(timeout=90)
        for conn in conns:
            conn.close()
        for name in ("h1", "h2"):
            subprocess.run(["rm", "-rf", str(bed[name].home / ".vmrun/runs" / run_id)], check=False)
    assert all(local[name].read_bytes() == name.encode() for name in local)
    missing = f"h3: fetching checkpoints failed this round: no record of run {run_id} in ~/"
    assert [n.split(" (")[0] for n in said.lines] == [
        f"h2: fetched results/{run_id}/h2/snapshot_1.pt",
        f"h1: fetched results/{run_id}/h1/snapshot_1.pt",
        f"{missing}.vmrun/runs",
        f"{missing}.vmrun/runs",
    ], said.lines


def test_watch_pulls_new_files_until_ctrl_c(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    h1 = bed["h1"]
    old = 1_700_000_000  # long finished: no settling wait
    put(h1, f"{remote_dir}/a.txt", b"a", mtime=old)
    args = ("fetch", "--watch", "--interval", "0.2", "-H", "h1", f"~/{remote_dir}")
    proc = bed_client.popen(*args, env={"PYTHONUNBUFFERED": "1"})
    lines: list[str] = []  # each round's line as it is printed (quiet rounds print nothing)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:  # Ctrl-C once a round has said what it fetched, not only once its file is here
        wait_for(lambda: len(lines) >= 1, 30, "the first round")
        put(h1, f"{remote_dir}/b.txt", b"b", mtime=old)
        wait_for(lambda: len(lines) >= 2, 30, "a new file to be pulled")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    assert len(lines) == 2 and all(ln.startswith("fetched 1 file (1 B") for ln in lines), lines
    assert (bed_client.cwd / remote_dir / "b.txt").read_bytes() == b"b"
    assert "stopped watching" in stderr


def test_bad_requests_are_refused_before_connecting(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    for args, needle in (
        (["../etc/passwd"], "outside the work directory"),
        (["a/../../b"], "outside the work directory"),
        (["~/../x"], "outside the home directory"),
        (["--all-hosts", "-H", "h1", "x"], "either --host or --all-hosts"),
        (["--bwlimit", "fast", "x"], "--bwlimit"),
        (["--run", "r1", "../other-run/x"], "outside the run directory"),
        (["--run", "../r1", "x"], "bad run id"),
    ):
        done = bed_client.vmrun("fetch", "-H", "h1", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert needle in done.stderr, (args, done.stderr)
    gone = bed_client.vmrun("fetch", "-H", "h1", f"~/{remote_dir}/nothing-here")
    assert gone.returncode == 14 and error_in(gone.stderr)[0] == "remote-path-not-found"


def test_an_unquoted_tilde_expanded_here_gets_a_hint_to_quote_it(
    bed: NetnsBed, bed_client: Client, remote_dir: str
) -> None:
    """`vmrun fetch ~/x` unquoted: the shell here gives vmrun this machine's home; the host
    has no such path, and the error line says how to ask for the host's home."""
    home = bed_client.environ()["HOME"]
    put(bed["h1"], f"{remote_dir}/x.txt", b"there")
    done = bed_client.vmrun("fetch", "-H", "h1", f"{home}/{remote_dir}/x.txt")
    assert done.returncode == 14, done.stderr
    assert f"quote it: vmrun fetch '~/{remote_dir}/x.txt'" in done.stderr, done.stderr
    quoted = bed_client.vmrun("fetch", "-H", "h1", f"~/{remote_dir}/x.txt", "--to", home)
    assert quoted.returncode == 0, quoted.stderr
    gone = bed_client.vmrun("fetch", "-H", "h1", f"~/{remote_dir}/nothing-here")
    assert "quote it" not in gone.stderr  # a path in the host's home: no such hint


def test_relative_paths_are_in_the_projects_work_directory(
    bed: NetnsBed, bed_client: Client
) -> None:
    """Where `vmrun train SCRIPT` ran it: `outputs/x` there lands in ./outputs/x here."""
    from vmrun.remote_paths import remote_workdir

    workdir = remote_workdir(bed_client.cwd)
    put(bed["h1"], f"{workdir}/outputs/eval.csv", b"acc,0.9\n")
    try:
        done = bed_client.vmrun("fetch", "outputs/eval.csv", "-H", "h1")
        assert done.returncode == 0, done.stderr
        assert (bed_client.cwd / "outputs" / "eval.csv").read_bytes() == b"acc,0.9\n"
    finally:
        subprocess.run(["rm", "-rf", str(bed["h1"].home / workdir)], check=False)


def test_what_names_map_to_the_run_layout() -> None:
    from vmrun.runs.outputs import CHECKPOINTS, FETCHED_CHECKPOINTS, RunLocation, resolve_what

    run = RunLocation("r1", "gpu1", ".vmrun/runs/r1", "work/results/r1")
    (ckpt,) = resolve_what("checkpoints", run, latest=3)
    assert (ckpt.remote, ckpt.local, ckpt.select, ckpt.latest) == (
        "work/results/r1",
        "results/r1",
        FETCHED_CHECKPOINTS,
        3,
    )
    assert set(CHECKPOINTS) | {"*.distcp", ".metadata"} == set(FETCHED_CHECKPOINTS)
    (logs,) = resolve_what("logs", run, host_dir="gpu1")
    assert (logs.remote, logs.local) == (".vmrun/runs/r1", "results/r1/gpu1")
    ckpts, rest, record = resolve_what("results", run, latest=1)
    assert ckpts.latest == 1 and rest.latest is None and set(CHECKPOINTS) <= set(rest.exclude)
    assert record.remote == ".vmrun/runs/r1"
    # a merged fetch of a run's nodes: the outputs into the run's folder, the record of a
    # node other than the master into one of its own there
    ckpts, rest, record = resolve_what("results", run, node_dir="gpu2")
    places = (ckpts.local, rest.local, record.local)
    assert places == ("results/r1", "results/r1", "results/r1/gpu2")
    (inner,) = resolve_what("sub/metrics.jsonl", run)
    assert (inner.remote, inner.local) == (
        "work/results/r1/sub/metrics.jsonl",
        "results/r1/sub/metrics.jsonl",
    )
    (absolute,) = resolve_what("/data/x.pt", run)
    assert (absolute.remote, absolute.local) == ("/data/x.pt", "results/r1/x.pt")


WANDB_LIKE = """\
import os, pathlib, time
# writes where wandb.init() writes with WANDB_MODE=offline (wandb itself needs the internet
# to install; its offline folder layout is what docs/fetch.md's recipe fetches)
assert os.environ["WANDB_MODE"] == "offline", os.environ.get("WANDB_MODE")
run = pathlib.Path("wandb") / f"offline-run-{time.strftime('%Y%m%d_%H%M%S')}-abc123"
(run / "files").mkdir(parents=True)
(run / "run-abc123.wandb").write_bytes(b"W&B" * 100)
(run / "files" / "wandb-summary.json").write_text('{"loss": 0.25}')
print("epoch 1/1 loss 0.25")
"""


def test_a_scripts_offline_wandb_folder_comes_back_as_the_readme_says(
    bed: NetnsBed, bed_client: Client
) -> None:
    """docs/fetch.md, "Weights & Biases on hosts without internet": train with
    -e WANDB_MODE=offline, then `vmrun fetch wandb` brings the run's wandb/ folder into ./wandb/."""
    from vmrun.remote_paths import remote_workdir

    (bed_client.cwd / "train.py").write_text(WANDB_LIKE)
    (bed_client.cwd / "vmrun.toml").write_text('[[hosts]]\naddress = "h1"\npython = "python3"\n')
    try:
        done = bed_client.vmrun(
            "train", "train.py", "--launcher", "python", "-e", "WANDB_MODE=offline", timeout=120
        )
        assert done.returncode == 0, done.stderr
        fetched = bed_client.vmrun("fetch", "wandb", "-H", "h1")
        assert fetched.returncode == 0, fetched.stderr
        (run,) = (bed_client.cwd / "wandb").glob("offline-run-*-abc123")
        assert (run / "run-abc123.wandb").read_bytes() == b"W&B" * 100
        assert (run / "files" / "wandb-summary.json").read_text() == '{"loss": 0.25}'
    finally:
        subprocess.run(
            ["rm", "-rf", str(bed["h1"].home / remote_workdir(bed_client.cwd))], check=False
        )
