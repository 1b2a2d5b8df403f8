"""Multi-node `vmrun train` on real network-namespace hosts: real torchrun, c10d, gloo.

The nodes n1 and n2 sit on two networks, "main" (where this machine reaches them) and
"inner"; n3 sits on "inner" alone and is reached through the bastion (ProxyJump), so the
address it must use for the master is not the one vmrun SSHes to. Every node's /etc/hosts
maps its hostname to 127.0.1.1, as Ubuntu's does: without the interface wiring, gloo would
bind there and fail ("connectFullMesh failed ... remote=[127.0.0.1]").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from conftest import Client, error_in, run_id_of, run_pids, template_out, wait_for
from testbed import NetnsBed, TestHost
from train_helpers import Gate, assert_matches_one_process, train_then_fault

from vmrun.remote_paths import remote_workdir


def node_lines(stdout: str, host: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith(f"[{host} ")]


def test_two_nodes_one_process_each_match_a_single_process_run(
    cluster: dict[str, TestHost], multi: Client, tmp_path: Path
) -> None:
    """The final weights of a deterministic 2-node run equal a 1-process run with the same
    global batch: real DDP across the nodes, not two independent runs."""
    args = ["4", "2", "--batch-size", "16", "--dataset-size", "512", "--deterministic"]
    done = multi.vmrun(
        "train", "-H", "n1", "-H", "n2", "--nproc-per-node", "1", "--", *args, timeout=300
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert "2 nodes x 1 process(es)" in done.stderr
    for host in ("n1", "n2"):
        started = [ln for ln in node_lines(done.stdout, host) if "started: pid" in ln]
        assert len(started) == 1 and "world_size 2" in started[0], done.stdout
    ranks = {
        re.match(r"\[(\w+) rank(\d)\]", ln).groups()
        for ln in done.stdout.splitlines()
        if "started: pid" in ln
    }
    assert ranks == {("n1", "0"), ("n2", "1")}, done.stdout  # the master holds rank 0
    final = template_out(cluster["n1"], multi, rid) / "finalmodel.pt"
    assert final.exists()
    assert not (template_out(cluster["n2"], multi, rid) / "finalmodel.pt").exists()

    one = ["4", "2", "--batch-size", "32", "--dataset-size", "512", "--deterministic"]
    assert_matches_one_process(final, one, tmp_path / "single")
    metrics = [json.loads(x) for x in (final.parent / "metrics.jsonl").read_text().splitlines()]
    assert [m["world_size"] for m in metrics] == [2, 2, 2, 2]
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"]  # it learned: the match means something


def ranks_by_host(stdout: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for line in stdout.splitlines():
        match = re.match(
            r"\[(\w+) rank(\d+)\] started: pid \d+ local_rank (\d+) world_size (\d+)", line
        )
        if match:
            found.setdefault(match.group(1), set()).add(int(match.group(2)))
    return found


# its own deadlines: train 300 s, fetch 2 x 120 s, logs/status 3 x 120 s
@pytest.mark.timeout(900)
def test_two_nodes_two_processes_merged_log_and_node_filter(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    done = multi.vmrun("train", "--epochs", "3", "--save-every", "1", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    assert "2 nodes x 2 process(es)" in done.stderr
    assert ranks_by_host(done.stdout) == {"n1": {0, 1}, "n2": {2, 3}}, done.stdout
    assert all("world_size 4" in ln for ln in done.stdout.splitlines() if "started: pid" in ln)
    epochs = re.findall(r"^\[n1 rank0\] epoch (\d)/3", done.stdout, re.M)
    assert epochs == ["1", "2", "3"]
    only_n2 = multi.vmrun("logs", rid, "--node", "n2")
    assert only_n2.returncode == 0, only_n2.stderr
    lines = only_n2.stdout.splitlines()
    assert lines and all(ln.startswith("[n2") for ln in lines), only_n2.stdout
    assert ranks_by_host(only_n2.stdout) == {"n2": {2, 3}}
    both = multi.vmrun("logs", rid)
    assert ranks_by_host(both.stdout) == {"n1": {0, 1}, "n2": {2, 3}}
    status = multi.vmrun("status")
    for host in ("n1", "n2"):
        assert re.search(rf"{rid}\s+{host}\s+done", status.stdout), status.stdout

    # `fetch results` of the newest run: from the hosts it ran on, merged into one folder
    # (each node's outputs there, the master's record beside them, the other node's record
    # in a folder of its own), every file byte for byte as on its host; then nothing moves
    # the second time.
    fetched = multi.vmrun("fetch", "results", timeout=120)
    assert fetched.returncode == 0, fetched.stderr + fetched.stdout
    local = multi.cwd / "results" / rid
    assert "n2" in os.listdir(local) and "n1" not in os.listdir(local), os.listdir(local)
    n1_files = {"snapshot.pt", "finalmodel.pt", "metrics.jsonl", "log", "run.json", "exit_code"}
    assert n1_files <= set(os.listdir(local)), os.listdir(local)
    assert {"log", "run.json", "exit_code"} <= set(os.listdir(local / "n2"))
    assert "snapshot.pt" not in os.listdir(local / "n2")  # global rank 0 wrote on n1 alone
    got = [p for p in local.rglob("*") if p.is_file()]
    for host in ("n1", "n2"):  # torchrun's per-rank logs come from every node
        mine = [p for p in got if (p.relative_to(local).parts[0] == "n2") == (host == "n2")]
        assert any(p.name == "stdout.log" for p in mine), host
    for path in got:
        rel = path.relative_to(local)
        host = "n2" if rel.parts[0] == "n2" else "n1"
        rel = Path(*rel.parts[1:]) if host == "n2" else rel
        record = cluster[host].home / ".vmrun/runs" / rid
        places = [record / rel, template_out(cluster[host], multi, rid) / rel]
        if host == "n1":  # an output only the other node wrote
            places.append(template_out(cluster["n2"], multi, rid) / rel)
        remote = next(p for p in places if p.exists())
        assert path.read_bytes() == remote.read_bytes(), (host, rel)
    import torch

    from vmrun.trainer.template import build_model

    build_model().load_state_dict(torch.load(local / "finalmodel.pt", weights_only=True))
    again = multi.vmrun("fetch", "results", timeout=120)
    assert again.returncode == 0, again.stderr
    summaries = re.findall(r"^\[(n\d)\] fetched 0 files, \d+ unchanged", again.stdout, re.M)
    assert sorted(summaries) == ["n1", "n2"], again.stdout


ENV_SCRIPT = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
keys = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_IB_DISABLE")
print("env", *(f"{k}={os.environ.get(k)}" for k in keys), f"sum={int(total.item())}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_a_node_behind_a_bastion_meets_the_others_on_the_inner_network(
    bed: NetnsBed, cluster: dict[str, TestHost], multi: Client
) -> None:
    """n3 is reached over SSH through the bastion; the rendezvous must use n1's inner address
    (its main one is not on n3's network), and each node the interface on that route, which
    reaches the workers' environment with the user's NCCL settings."""
    (multi.cwd / "envcheck.py").write_text(ENV_SCRIPT)
    args = ("train", "envcheck.py", "--nproc-per-node", "1", "--nccl-debug", "info")
    done = multi.vmrun(*args, "-H", "n1", "-H", "n2", "-H", "n3", "--", "x", timeout=300)
    # n3 is not in vmrun.toml: no interpreter is known for it, and nothing starts anywhere
    code, said = error_in(done.stderr)
    assert done.returncode == 2 and code == "host-not-set-up" and said.startswith("n3: ")
    assert not (cluster["n1"].home / ".vmrun" / "runs").exists()
    toml = multi.cwd / "vmrun.toml"
    toml.write_text(
        toml.read_text() + f'[[hosts]]\naddress = "n3"\npython = '
        f'"{_python(multi)}"\nenv = {{ NCCL_IB_DISABLE = "1" }}\n'
    )
    done = multi.vmrun(*args, "--", "x", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    inner = cluster["n1"].addr_on("inner")
    assert f"rendezvous at {inner}:" in done.stderr
    want = {"n1": "eth1", "n2": "eth1", "n3": "eth0"}
    for name, ifname in want.items():
        meta = json.loads((cluster[name].home / ".vmrun/runs" / rid / "run.json").read_text())
        assert meta["rdzv"].startswith(f"{inner}:") and meta["ifname"] == ifname, (name, meta)
        ib = "1" if name == "n3" else "None"
        line = (
            f"env GLOO_SOCKET_IFNAME={ifname} NCCL_SOCKET_IFNAME=={ifname} NCCL_DEBUG=INFO"
            f" NCCL_IB_DISABLE={ib} sum=6"
        )
        assert re.search(rf"^\[{name} rank\d\] {re.escape(line)}$", done.stdout, re.M), (
            name,
            done.stdout,
        )


def _python(multi: Client) -> str:
    match = re.search(r'python = "([^"]+)"', (multi.cwd / "vmrun.toml").read_text())
    assert match
    return match.group(1)


# its own deadlines: 120 + 120 + 60 + the resume's 300 s, and more
@pytest.mark.timeout(900)
def test_a_cut_worker_fails_the_run_fast_and_resume_continues_on_every_node(
    cluster: dict[str, TestHost], multi: Client, gate: Gate
) -> None:
    """n2's link cut after epoch 2's snapshot (the ranks held there by a trainer hook, so
    the run cannot have ended however fast the machine): the run fails fast naming n2."""
    n1, n2 = cluster["n1"], cluster["n2"]
    args = ["--nproc-per-node", "1", *gate.options(2), "--", "6", "2"]
    run = train_then_fault(multi, n1.home, args, n2.cut_link)
    gate.open()  # n2's rank goes on, to find its peers gone; the resume is not held
    rid, log, err, took = run.rid, run.log, run.stderr, run.took
    assert run.returncode not in (0, None), err
    print(f"node failure reported {took:.1f} s after the cut")
    # keepalive 1 s x 3 notices the cut in ~4 s, then n1's ranks are stopped; unnoticed, the
    # run would hang in gloo (30 min). 60 s: room for 2 torch ranks on a loaded 2-core machine
    assert took < 60, f"the failure took {took:.0f} s to report"
    code, said = error_in(err)
    assert code == "run-failed" and said.startswith("n2: ") and "stopped answering" in said, err
    assert run_pids(n1, rid) == []  # nothing of the run is left on the reachable host
    assert b"epoch 6/6" not in log.read_bytes()
    n2.heal_link()
    healed = time.monotonic()
    # The cut host's own run ends by itself once it can tell the rest is gone: no orphans
    # there either, before anyone runs `vmrun stop` or `--resume` on it.
    wait_for(lambda: run_pids(n2, rid) == [], 60, "the cut host's run to end by itself")
    print(f"the cut host's run ended {time.monotonic() - healed:.1f} s after the heal")
    logins = {h: cluster[h].sshd_log().count("Accepted publickey") for h in ("n1", "n2")}
    again = multi.vmrun("train", "--resume", rid, *gate.options(2), timeout=300)
    assert again.returncode == 0, again.stderr + again.stdout
    # one connection per host: the run is looked up, prepared, staged, started and followed
    # on it (the record listed once: no second lookup for the busy check or the preparation)
    assert {
        h: cluster[h].sshd_log().count("Accepted publickey") - n for h, n in logins.items()
    } == {"n1": 1, "n2": 1}
    assert "copied snapshot.pt from n1 to n2" in again.stderr
    # only the new attempt is shown live, after its separator; never the old attempt's lines
    assert "epoch 1/6" not in again.stdout and "epoch 2/6" not in again.stdout, again.stdout
    banner = re.search(
        r"^\[n1\] --- attempt 2, resumed from epoch (\d+) \(snapshot\.pt\) ---$", again.stdout, re.M
    )
    assert banner is not None, again.stdout
    resumed = re.findall(
        r"^\[(n\d) rank\d\] resumed from snapshot at epoch (\d+)", again.stdout, re.M
    )
    assert {h for h, _ in resumed} == {"n1", "n2"}, again.stdout  # every node, same epoch
    assert len({e for _, e in resumed}) == 1 and int(resumed[0][1]) >= 3
    assert banner.group(1) == resumed[0][1]  # the separator names the epoch it resumed at
    metrics = template_out(n1, multi, rid) / "metrics.jsonl"
    assert [json.loads(x)["epoch"] for x in metrics.read_text().splitlines()] == list(range(1, 7))
    assert (template_out(n2, multi, rid) / "snapshot.pt").exists()
    assert run_pids(n1) == [] and run_pids(n2) == []
    # the record tells this attempt's code and keeps the first attempt's (a template run)
    record = json.loads((n2.home / ".vmrun" / "runs" / rid / "run.json").read_text())
    assert [c["attempt"] for c in record["code_earlier"]] == [1]
    assert record["code_earlier"][0]["tree_sha256"] == record["code"]["tree_sha256"]


FAILING_SCRIPT = """\
# The ranks on the host named by argv[1] exit with 3 once the process group is up; the
# others wait for a message that never comes: only vmrun stopping them ends them.
import os, socket, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
local, world = int(os.environ["LOCAL_RANK"]), dist.get_world_size()
print(f"started: pid {os.getpid()} local_rank {local} world_size {world}", flush=True)
dist.barrier()  # every rank has said it started before any fails (torchrun kills the rest)
if socket.gethostname() == sys.argv[1]:
    print("failing on purpose", flush=True)
    os._exit(3)
time.sleep(900)
"""


def _drain(stream: IO[str] | None, into: list[tuple[float, str]]) -> threading.Thread:
    """Read a child's stream to its end in a thread, each line with its arrival time."""
    assert stream is not None

    def read() -> None:
        for line in stream:
            into.append((time.monotonic(), line))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _arrived(lines: list[tuple[float, str]], needle: str) -> float:
    """When the first line holding `needle` arrived (0.0: not yet)."""
    return next((at for at, line in list(lines) if needle in line), 0.0)


def test_a_failing_node_fails_the_run_and_stops_the_others_master_holds_rank0(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """n1's workers exit with 3 while n2's block: the run is reported failed naming n1, the
    rank that failed first and its own exit code (torchrun's is 1); n2's workers are stopped
    (none left anywhere), promptly. `--master n2` puts the rendezvous on n2 and global rank
    0 there, though n1 comes first in vmrun.toml."""
    n1, n2 = cluster["n1"], cluster["n2"]
    (multi.cwd / "fail.py").write_text(FAILING_SCRIPT)
    proc = multi.popen(
        "train", "fail.py", "--master", "n2", "--nproc-per-node", "2", "--", n1.hostname
    )
    stdout: list[tuple[float, str]] = []
    stderr: list[tuple[float, str]] = []
    readers = [_drain(proc.stdout, stdout), _drain(proc.stderr, stderr)]
    try:
        wait_for(
            lambda: _arrived(stdout, "failing on purpose") or proc.poll() is not None,
            180,
            "n1's ranks to fail",
        )
        failed = _arrived(stdout, "failing on purpose")
        assert failed, "".join(ln for _, ln in stderr + stdout)
        proc.wait(timeout=120)
        took = time.monotonic() - failed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    out, err = "".join(ln for _, ln in stdout), "".join(ln for _, ln in stderr)
    print(f"a failing node's run reported and stopped {took:.1f} s after the failure")
    rid = run_id_of(err)
    assert proc.returncode == 3, err + out  # the workers' own code, not torchrun's 1
    assert ranks_by_host(out) == {"n2": {0, 1}, "n1": {2, 3}}, out
    assert re.search(r"rendezvous at \S+ on n2; ", err), err
    code, said = error_in(err)
    assert code == "run-failed" and said.startswith("n1: "), err
    assert re.search(r"rank [23] \(local rank [01]\) on n1 exited with 3", said), said
    assert re.search(r"^\[n1\] .*exitcode\s*: 3\b", out, re.M), out
    assert re.search(r"n2 stopped [1-9]\d* process\(es\)", err), err
    # torchrun on n1 notices its ranks' exit, then vmrun stops n2's; unnoticed, n2's ranks
    # would sleep 900 s. 90 s: room for 4 gloo ranks on a loaded 2-core machine
    assert took < 90, f"the failure took {took:.0f} s to report"
    assert run_pids(n1, rid) == [] and run_pids(n2, rid) == []  # no orphaned worker


MULTINODE_SCRIPT = """\
# The upstream multinode tutorial's shape (pytorch/examples distributed/ddp-tutorial-series
# multinode.py): RANK and LOCAL_RANK from torchrun, positional epochs and save_every,
# snapshot.pt saved by global rank 0 and loaded by every rank if present. gloo, not nccl:
# the test hosts have no GPU.
import os, sys
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

def main(total_epochs, save_every):
    init_process_group(backend="gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    global_rank = int(os.environ["RANK"])
    data = TensorDataset(torch.rand(256, 20), torch.rand(256, 1))
    model = torch.nn.Linear(20, 1)
    epochs_run = 0
    if os.path.exists("snapshot.pt"):
        snap = torch.load("snapshot.pt")
        model.load_state_dict(snap["MODEL_STATE"])
        epochs_run = snap["EPOCHS_RUN"]
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    for epoch in range(epochs_run, total_epochs):
        loader.sampler.set_epoch(epoch)
        print(f"[GPU{global_rank}] Epoch {epoch} | Batchsize: 32 | Steps: {len(loader)}")
        for x, y in loader:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        if global_rank == 0 and epoch % save_every == 0:
            torch.save({"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch},
                       "snapshot.pt")
            print(f"Epoch {epoch} | Training snapshot saved at snapshot.pt")
    destroy_process_group()

if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
"""


def test_a_multinode_tutorial_script_runs_unchanged(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    (multi.cwd / "multinode.py").write_text(MULTINODE_SCRIPT)
    done = multi.vmrun("train", "multinode.py", "--epochs", "3", "--save-every", "1", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    for epoch in range(3):
        for rank, host in ((0, "n1"), (1, "n1"), (2, "n2"), (3, "n2")):
            assert (
                f"[{host} rank{rank}] [GPU{rank}] Epoch {epoch} | Batchsize: 32 | Steps: 2"
                in done.stdout
            ), done.stdout
    workdir = remote_workdir(multi.cwd)
    assert (cluster["n1"].home / workdir / "snapshot.pt").exists()
    assert not (cluster["n2"].home / workdir / "snapshot.pt").exists()  # global rank 0 only
    # The run's results are what it wrote in the work directory, not the code synced there.
    fetched = multi.vmrun("fetch", "results", "-H", "n1")
    assert fetched.returncode == 0, fetched.stderr
    local = multi.cwd / "results" / run_id_of(done.stderr)
    assert (local / "snapshot.pt").exists() and (local / "log").exists()
    assert not (local / "multinode.py").exists()


def test_bad_multinode_input_starts_nothing(
    bed: NetnsBed, cluster: dict[str, TestHost], multi: Client, tmp_path: Path
) -> None:
    for args, needle in (
        (["--master", "h9"], "--master h9: not one of the run's hosts"),
        (["--nnodes", "3"], "--nnodes 3 but 2 hosts were given"),
        (["--nnodes", "3:4"], "not within MIN:MAX"),
        (["--nccl-debug", "LOUD"], "--nccl-debug LOUD"),
        (["-H", "n1", "--master", "n1"], "--master and --nnodes are for several hosts"),
    ):
        bad = multi.vmrun("train", "--epochs", "1", *args)
        assert bad.returncode == 2 and needle in bad.stderr, (args, bad.stderr)
    # A master address the others cannot reach is refused before anything starts.
    toml = multi.cwd / "vmrun.toml"
    text = toml.read_text()
    wrong = bed["bastion"].addr_on("inner")
    toml.write_text(text.replace('address = "n1"\n', f'address = "n1"\nprivate_addr = "{wrong}"\n'))
    unreachable = multi.vmrun("train", "--epochs", "1", timeout=120)
    assert unreachable.returncode == 12, unreachable.stderr
    code, said = error_in(unreachable.stderr)
    assert code == "rendezvous-unreachable" and f"{wrong}:29400" in said, unreachable.stderr
    # Different torch builds on the nodes: refused, naming both.
    stub = Path(tempfile.mkdtemp(prefix="vmrun-stub-torch-", dir="/tmp"))
    try:
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(stub)], check=True)
        site = next(stub.glob("lib/python3*/site-packages"))
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(
            "# STAND-IN for another torch build: a version string (there is no second torch)\n"
            "__version__ = '1.13.1+stub'\n"
        )
        subprocess.run(["chmod", "-R", "a+rX", str(stub)], check=True)
        toml.write_text(
            f'[[hosts]]\naddress = "n1"\npython = "{_python(multi)}"\n\n'
            f'[[hosts]]\naddress = "n2"\npython = "{stub}/bin/python"\n'
        )
        mixed = multi.vmrun("train", "--epochs", "1", timeout=120)
    finally:
        shutil.rmtree(stub, ignore_errors=True)
    assert mixed.returncode == 2, mixed.stderr
    code, said = error_in(mixed.stderr)
    assert code == "hosts-differ" and "1.13.1+stub on n2" in said, mixed.stderr
    for host in ("n1", "n2"):
        assert not (cluster[host].home / ".vmrun" / "runs").exists()


ENV_WORLD_SCRIPT = """\
# A script that reads vmrun's `--launcher env` wiring itself: init from the environment
# (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one all_reduce across the hosts.
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1) * (int(os.environ["RANK"]) + 1)
dist.all_reduce(total)
print(f"RANK={os.environ['RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']}"
      f" sum={int(total.item())}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
"""


def test_env_launcher_on_two_nodes_forms_one_world(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """`--launcher env` on two hosts: one process per host in one world (ranks 0 and 1, world
    size 2, the all_reduce sums both), not two 1-process jobs. `--launcher python` (mp.spawn:
    a world of one host) is refused first, with nothing synced or started."""
    (multi.cwd / "envworld.py").write_text(ENV_WORLD_SCRIPT)
    refused = multi.vmrun("train", "envworld.py", "--launcher", "python", "--", "x")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--launcher python" in lines[0], refused.stderr
    assert "use --launcher torchrun" in lines[0]
    for host in ("n1", "n2"):
        assert not (cluster[host].home / ".vmrun" / "runs").exists()
        assert not (cluster[host].home / remote_workdir(multi.cwd)).exists()

    toml = multi.cwd / "vmrun.toml"  # each host's price goes into the run's record
    toml.write_text(
        toml.read_text()
        .replace('address = "n1"\n', 'address = "n1"\nprice = 0.25\n')
        .replace('address = "n2"\n', 'address = "n2"\nprice = 0.5\n')
    )
    done = multi.vmrun("train", "envworld.py", "--launcher", "env", "--", "x", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    got = re.findall(r"^\[(n\d)\] RANK=(\d+) WORLD_SIZE=(\d+) sum=(\d+)$", done.stdout, re.M)
    assert sorted(got) == [("n1", "0", "2", "3"), ("n2", "1", "2", "3")], done.stdout
    assert "2 nodes x 1 process(es)" in done.stderr
    for host in ("n1", "n2"):
        meta = json.loads((cluster[host].home / ".vmrun/runs" / rid / "run.json").read_text())
        assert meta["launcher"] == "env" and meta["nnodes"] == "2", meta
        assert meta["price_per_hour"] == 0.75 and meta["prices"]["n2"] == 0.5, meta
        assert run_pids(cluster[host], rid) == []


CUDA_SCRIPT = """\
# Written for a GPU host: CUDA unconditionally, as many scripts are.
import torch
device = torch.device("cuda")
print(torch.ones(1).cuda().to(device), flush=True)
"""


def test_a_cuda_script_on_a_cpu_host_is_warned_about_before_it_starts(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """The warning comes before the run starts (not after a raw CUDA traceback), and the
    run still fails: vmrun does not guess that the script cannot fall back to the CPU."""
    (multi.cwd / "cudaonly.py").write_text(CUDA_SCRIPT)
    done = multi.vmrun(
        "train", "cudaonly.py", "-H", "n1", "--nproc-per-node", "1", "--", "x", timeout=300
    )
    assert done.returncode not in (0, 2), done.stderr + done.stdout
    lines = done.stderr.splitlines()
    warned = next(i for i, ln in enumerate(lines) if "warning: cudaonly.py uses CUDA/nccl" in ln)
    assert "but n1 has no GPU (gpus=0)" in lines[warned], lines[warned]
    started = next(i for i, ln in enumerate(lines) if re.search(r"run \S+ started on n1", ln))
    assert warned < started, done.stderr
    assert run_pids(cluster["n1"], run_id_of(done.stderr)) == []


FAIL_AFTER = """\
# Fails at once, or (argv[1] == "late") after reporting its first epoch.
import sys
if sys.argv[1] == "late":
    print("epoch 1/3 loss 0.5", flush=True)
sys.exit(3)
"""


def test_resume_is_suggested_only_for_a_run_that_trained(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """Two hosts: a script that fails before any epoch is told to fix the cause (resuming
    would fail the same way); one that failed after `epoch 1/3` is told to resume."""
    (multi.cwd / "failfast.py").write_text(FAIL_AFTER)
    for when, resume in (("early", False), ("late", True)):
        done = multi.vmrun("train", "failfast.py", "--nproc-per-node", "1", "--", when, timeout=300)
        assert done.returncode not in (0, 2), done.stderr + done.stdout
        rid = run_id_of(done.stderr)
        assert ("resume with `vmrun train --resume " in done.stderr) is resume, done.stderr
        if not resume:
            assert "failed before its first epoch, so resuming would fail" in done.stderr
        assert run_pids(cluster["n1"], rid) == [] and run_pids(cluster["n2"], rid) == []
