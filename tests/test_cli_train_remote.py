"""`vmrun train` on real sshd test hosts: real torchrun (CPU torch, gloo), real disconnects.

The hosts' interpreter is the shared venv with torch (conftest's host_python), named per
host in vmrun.toml as `vmrun setup` would record it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, error_in, run_id_of, run_pids, template_out, wait_for
from testbed import NetnsBed
from train_helpers import Gate, env_options, hook_env

from vmrun.remote_paths import remote_workdir
from vmrun.reporting import Recorder
from vmrun.runs.lines import Prefixer

EPOCH_LINE = re.compile(rb"epoch (\d+)/(\d+)")


@pytest.fixture
def project(bed: NetnsBed, bed_client: Client, host_python: Path) -> Iterator[Client]:
    """A project whose vmrun.toml knows h1 and h2 with the shared interpreter."""
    (bed_client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{host_python}"\n\n'
        f'[[hosts]]\naddress = "h2"\npython = "{host_python}"\n'
    )
    bed_client.extra_env["OMP_NUM_THREADS"] = "1"
    yield bed_client
    for name in ("h1", "h2", "h3"):
        clean_host(bed[name])


def test_template_run_end_to_end(bed: NetnsBed, project: Client) -> None:
    h1 = bed["h1"]
    done = project.vmrun("train", "-H", "h1", "--epochs", "4", "--save-every", "2", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid = run_id_of(done.stderr)
    epochs = [int(m.group(1)) for m in EPOCH_LINE.finditer(done.stdout.encode())]
    assert epochs == [1, 2, 3, 4]
    out = template_out(h1, project, rid)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[-1]["loss"] < 0.5 * metrics[0]["loss"]
    assert metrics[0]["world_size"] == 2
    assert "snapshot saved at epoch 2" in done.stdout and "snapshot saved at epoch 4" in done.stdout
    import torch

    from vmrun.trainer.template import build_model

    model = build_model()
    model.load_state_dict(torch.load(out / "finalmodel.pt", weights_only=True))
    status = project.vmrun("status", "-H", "h1")
    assert re.search(rf"{rid}\s+h1\s+done\s+epoch 4/4", status.stdout), status.stdout


def test_seed_style_user_script_runs_unchanged(bed: NetnsBed, project: Client) -> None:
    script = project.cwd / "multigpu_torchrun.py"
    script.write_text("""import os, sys
import torch
import torch.distributed as dist

def main(total_epochs: int, save_every: int) -> None:
    dist.init_process_group("gloo")
    rank = int(os.environ["LOCAL_RANK"])
    for epoch in range(total_epochs):
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        print(f"[GPU{rank}] Epoch {epoch} | sum {int(t.item())}", flush=True)
        if rank == 0 and epoch % save_every == 0:
            torch.save({"EPOCHS_RUN": epoch}, "snapshot.pt")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)

if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
""")
    (project.cwd / "notes.txt").write_text("synced too\n")
    (project.cwd / ".gitignore").write_text("notes.txt\n")
    with open(project.cwd / "table.bin", "wb") as fh:  # sparse: 101 MiB of zeros to sync
        fh.truncate(101 << 20)
    done = project.vmrun(
        "train",
        "multigpu_torchrun.py",
        "-H",
        "h2",
        "--epochs",
        "3",
        "--save-every",
        "2",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    for epoch in range(3):
        assert f"Epoch {epoch} | sum 3" in done.stdout
    workdir = bed["h2"].home / remote_workdir(project.cwd)
    assert (workdir / "snapshot.pt").exists()
    assert not (workdir / "notes.txt").exists()  # .gitignore is honoured
    # a big file is warned about before it goes, and its progress is shown
    assert "warning: h2: syncing a large file: table.bin (101 MiB)" in done.stderr
    assert "table.bin (101.0 MiB) verified" in done.stderr
    assert (workdir / "table.bin").stat().st_size == 101 << 20


def test_cut_connection_run_goes_on_and_logs_reattach_with_every_line(
    bed: NetnsBed, project: Client
) -> None:
    h1 = bed["h1"]
    proc = project.popen("train", "-H", "h1", "--", "60", "20", "--dataset-size", "4096")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until training really runs
            if "epoch 2/60" in line:
                break
        h1.cut_link()
        _, err = proc.communicate(timeout=60)
    finally:
        h1.heal_link()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 13, err
    code, said = error_in(err)
    assert code == "connection-lost" and "vmrun logs -f" in said, err  # how to reattach
    rid = run_id_of(err)
    again = project.vmrun("logs", "-f", "--verbose", rid, "-H", "h1", timeout=300)
    assert again.returncode == 0, again.stderr
    epochs = [int(m.group(1)) for m in EPOCH_LINE.finditer(again.stdout.encode())]
    assert epochs == list(range(1, 61))  # every line, exactly once
    # and nothing else: the host's log, as vmrun shows a log (whole lines, [rankN] prefixes)
    shown = Recorder()
    lines = Prefixer(None, shown, verbose=True)
    lines.feed((h1.home / ".vmrun/runs" / rid / "log").read_bytes())
    lines.flush()
    assert again.stdout.encode() == shown.data


def test_killed_worker_restarts_from_the_last_snapshot(
    bed: NetnsBed, project: Client, trainer_hooks: Path
) -> None:
    """A worker SIGKILLed under --max-restarts: torchrun restarts the workers, which resume at
    the epoch after the last snapshot saved before the kill and finish the run. Every rank
    stalls mid-epoch 5 on the first attempt (a trainer hook, tests/trainer_hooks), so no
    snapshot can land between reading the log and the kill."""
    h2 = bed["h2"]
    done = project.vmrun(
        "train",
        "-H",
        "h2",
        "--detach",
        "--max-restarts",
        "2",
        *env_options(hook_env(trainer_hooks, STALL_AT_EPOCH="5")),
        "--",
        "12",
        "3",
        "--dataset-size",
        "8192",
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    log = h2.home / ".vmrun/runs" / rid / "log"
    out = template_out(h2, project, rid)
    wait_for(
        lambda: all((out / f"stalled-rank{r}.pid").exists() for r in (0, 1)),
        120,
        "both ranks to stall in epoch 5",
    )
    saved = [int(k) for k in re.findall(rb"snapshot saved at epoch (\d+) ->", log.read_bytes())]
    assert saved == [3], log.read_bytes()  # seen before the kill
    victim = int((out / "stalled-rank1.pid").read_text())
    assert victim in run_pids(h2, rid)
    os.kill(victim, signal.SIGKILL)
    follow = project.vmrun("logs", "-f", rid, "-H", "h2", timeout=300)
    assert follow.returncode == 0, follow.stderr + follow.stdout
    resumed = re.findall(
        r"^\[rank(\d)\] resumed from snapshot at epoch (\d+) ", follow.stdout, re.M
    )
    assert sorted(resumed) == [("0", str(saved[-1] + 1)), ("1", str(saved[-1] + 1))], follow.stdout
    after = follow.stdout[follow.stdout.index("resumed from snapshot") :]
    assert [int(e) for e in re.findall(r"epoch (\d+)/12", after)] == list(range(4, 13))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == list(range(1, 13))


def test_stop_leaves_no_process_and_is_recorded(bed: NetnsBed, project: Client) -> None:
    h1 = bed["h1"]
    done = project.vmrun("train", "-H", "h1", "--detach", "--", "500", "100")
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    log = h1.home / ".vmrun/runs" / rid / "log"
    wait_for(lambda: b"epoch 1/500" in log.read_bytes(), 120, "training to start")
    assert len(run_pids(h1, rid)) >= 4  # shell, torchrun, two workers
    busy = project.vmrun("train", "-H", "h1", "--epochs", "1")
    code, said = error_in(busy.stderr)
    assert busy.returncode == 2 and code == "host-busy" and rid in said, busy.stderr
    stopped = project.vmrun("stop", "-H", "h1")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped run {rid}" in stopped.stdout and "none left" in stopped.stdout
    assert run_pids(h1, rid) == []
    status = project.vmrun("status", "-H", "h1")
    assert re.search(rf"{rid}\s+h1\s+stopped", status.stdout), status.stdout


def test_bad_input_starts_nothing(bed: NetnsBed, project: Client) -> None:
    h3 = bed["h3"]
    no_env = project.vmrun("train", "-H", "h3", "--epochs", "2")
    assert no_env.returncode == 2
    code, said = error_in(no_env.stderr)
    assert code == "host-not-set-up" and said.startswith("h3: ") and "vmrun setup h3" in said
    assert not (h3.home / ".vmrun" / "runs").exists()
    # offline: the made-up name fails to resolve in an empty network namespace, not via DNS
    unknown = project.vmrun("train", "-H", "nosuchhost.invalid", "--epochs", "2", offline=True)
    assert unknown.returncode == 12 and "cannot resolve" in unknown.stderr
    for args, needle in (
        (["missing.py"], "no such file"),
        (["--epochs", "0"], ">= 1"),
        (["--save-every", "0"], ">= 1"),
    ):
        bad = project.vmrun("train", "-H", "h1", *args)
        assert bad.returncode == 2 and needle in bad.stderr, bad.stderr
    assert not (bed["h1"].home / ".vmrun" / "runs").exists()


@pytest.mark.timeout(900)  # its own deadlines: 120 + 120 + 300 s, and more
def test_fetch_every_brings_snapshots_while_the_run_goes_on(
    bed: NetnsBed, project: Client, gate: Gate
) -> None:
    """The run holds after epoch 4's snapshot (a trainer hook) until that snapshot is here,
    so it is fetched mid-run however slow the machine; then the end fetches the rest."""
    h1 = bed["h1"]
    proc = project.popen(
        "train", "-H", "h1", "--fetch-every", "0.5", *gate.options(4), "--", "8", "4"
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore
    try:
        reader.start()
        started = wait_for(
            lambda: re.search(r"run (\S+) started on", "".join(err)), 120, "the run to start"
        )
        rid = started.group(1)  # type: ignore[attr-defined]
        local = project.cwd / "results" / rid
        remote_log = h1.home / ".vmrun/runs" / rid / "log"
        wait_for(lambda: (local / "snapshot.pt").exists(), 120, "a snapshot fetched mid-run")
        assert b"final model saved" not in remote_log.read_bytes(), "".join(err)  # still going
        gate.open()
        _, rest = proc.communicate(timeout=300)  # what the reader thread did not take
        reader.join(10)
        err.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(err)
    remote = template_out(h1, project, rid)
    for name in ("snapshot.pt", "finalmodel.pt", "metrics.jsonl"):  # the last round: results
        assert (local / name).read_bytes() == (remote / name).read_bytes(), name
    assert "h1: fetched" in "".join(err)
    # the end says where the files are now, not how to fetch what is fetched already (the
    # reader thread and communicate() share the pipe, so the order of their parts is open)
    said = "".join(err)
    assert f"vmrun: run {rid} finished on h1; its files are in results/{rid}/\n" in said, said
    assert "brings its files" not in said, said
    bad = project.vmrun("train", "-H", "h1", "--fetch-every", "5", "--detach")
    assert bad.returncode == 2 and "--fetch-every needs" in bad.stderr


def test_ctrl_c_with_fetch_every_detaches_at_once_mid_fetch(bed: NetnsBed, project: Client) -> None:
    """Ctrl-C while a --fetch-every round is fetching a big checkpoint (OpenSSH's client,
    from 128 MiB), its link gone silent (cut; the keepalive set long, so nothing notices
    for a minute), detaches at once: it waited for the round before, up to 600 s. The file
    cut short stays under its temporary name; nothing partial under the final one."""
    h1 = bed["h1"]
    (project.cwd / "stall.py").write_text(
        "import os, time\nprint('ready', flush=True)\n"
        "while not os.path.exists('go'):\n    time.sleep(0.1)\n"
        "open('ckpt.pt', 'wb').write(bytes(256 << 20))\ntime.sleep(600)\n"
    )
    slow_keepalive = {"VMRUN_KEEPALIVE_INTERVAL": "20", "VMRUN_KEEPALIVE_COUNT_MAX": "3"}
    proc = project.popen(
        "train",
        "stall.py",
        "-H",
        "h1",
        "--launcher",
        "python",
        "--fetch-every",
        "0.2",
        env=slow_keepalive,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)  # type: ignore
    workdir = h1.home / remote_workdir(project.cwd)
    try:
        reader.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready" in line:
                break
        started = wait_for(lambda: re.search(r"run (\S+) started on", "".join(err)), 60, "start")
        local = project.cwd / "results" / started.group(1)  # type: ignore[attr-defined]
        (workdir / "go").touch()
        wait_for(lambda: any(local.glob(".ckpt.pt.*.vmrun-part")), 60, "the fetch", interval=0.01)
        h1.cut_link()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        took = time.monotonic() - sent
        reader.join(10)
    finally:
        h1.heal_link()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = "".join(err)
    assert proc.returncode == 0, said
    rid = run_id_of(said)
    assert took < 8, (took, said)  # it was the round's whole wait (here, a minute)
    assert f"detached from run {rid}" in said and "failed this round" not in said, said
    whole = (workdir / "ckpt.pt").read_bytes()
    assert not (local / "ckpt.pt").exists() or (local / "ckpt.pt").read_bytes() == whole
    assert project.vmrun("stop", rid, "-H", "h1").returncode == 0


def test_allow_concurrent_runs_share_a_host_without_clashing(
    bed: NetnsBed, project: Client
) -> None:
    h1 = bed["h1"]
    first = project.vmrun("train", "-H", "h1", "--detach", "--", "500", "100")
    assert first.returncode == 0, first.stderr
    rid_a = run_id_of(first.stderr)
    log = h1.home / ".vmrun/runs" / rid_a / "log"
    wait_for(lambda: b"epoch 1/500" in log.read_bytes(), 120, "the first run to train")
    second = project.vmrun(
        "train", "-H", "h1", "--allow-concurrent", "--epochs", "2", "--save-every", "1", timeout=300
    )
    assert second.returncode == 0, second.stderr + second.stdout
    assert "also runs in" not in second.stderr  # the template writes in results/<run-id>/
    rid_b = run_id_of(second.stderr)
    metrics = (template_out(h1, project, rid_b) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(m)["epoch"] for m in metrics] == [1, 2]
    assert not (template_out(h1, project, rid_a) / "finalmodel.pt").exists()
    assert run_pids(h1, rid_a)  # the first run went on beside the second
    assert project.vmrun("stop", rid_a, "-H", "h1").returncode == 0
    assert run_pids(h1, rid_a) == []


def test_concurrent_user_scripts_are_warned_about_their_shared_directory(
    bed: NetnsBed, project: Client
) -> None:
    """Two script runs of one project share its work directory as their cwd: the second is
    told so, on one line that names the directory and the run already going on."""
    h1 = bed["h1"]
    (project.cwd / "wait.py").write_text(
        "import sys, time\nprint('waiting', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
    )
    first = project.vmrun(
        "train", "wait.py", "-H", "h1", "--launcher", "python", "--detach", "--", "120"
    )
    assert first.returncode == 0, first.stderr
    rid_a = run_id_of(first.stderr)
    log = h1.home / ".vmrun/runs" / rid_a / "log"
    wait_for(lambda: log.exists() and b"waiting" in log.read_bytes(), 60, "the first run")
    second = project.vmrun(
        "train", "wait.py", "-H", "h1", "--launcher", "python", "--allow-concurrent", "--", "0"
    )
    assert second.returncode == 0, second.stderr
    workdir = remote_workdir(project.cwd)
    warnings = [ln for ln in second.stderr.splitlines() if "warning:" in ln]
    assert len(warnings) == 1, second.stderr
    assert f"warning: h1: {rid_a} also runs in ~/{workdir}" in warnings[0]
    assert "snapshot.pt" in warnings[0]
    assert project.vmrun("stop", rid_a, "-H", "h1").returncode == 0
    assert run_pids(h1, rid_a) == []


def test_exit_code_last_lines_and_the_interpreter_setup_recorded(
    bed: NetnsBed, project: Client, host_python: Path
) -> None:
    h3 = bed["h3"]  # not in vmrun.toml: its interpreter comes from setup's record on the host
    record = h3.home / ".vmrun" / "host.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text(json.dumps({"python": str(host_python), "gpus": 0}))
    for path in (record.parent, record):
        os.chown(path, h3.uid, h3.gid)
    (project.cwd / "fail.py").write_text(
        "import sys\nfor i in range(5):\n    print('line', i)\nsys.exit(3)\n"
    )
    done = project.vmrun("train", "fail.py", "-H", "h3", "--launcher", "python", "--", "x")
    assert done.returncode == 3, done.stderr
    assert "exited with 3" in done.stderr and done.stdout.splitlines()[-1] == "line 4"
    rid = run_id_of(done.stderr)
    meta = json.loads((h3.home / ".vmrun/runs" / rid / "run.json").read_text())
    assert meta["python"] == str(host_python)
    tail = project.vmrun("logs", rid, "-H", "h3", "-n", "2")
    assert tail.returncode == 0 and tail.stdout == "line 3\nline 4\n", tail.stdout


def test_ctrl_c_detaches_and_the_run_goes_on(bed: NetnsBed, project: Client) -> None:
    h2 = bed["h2"]
    proc = project.popen("train", "-H", "h2", "--", "500", "100")
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "epoch 1/500" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # detaching is not a failure: information, exit 0
    rid = run_id_of(err)
    assert f"detached from run {rid}" in err and f"vmrun logs -f {rid}" in err
    assert "error" not in err
    assert run_pids(h2, rid)  # Ctrl-C only detached: the run goes on
    stopped = project.vmrun("stop", rid, "-H", "h2")
    assert stopped.returncode == 0 and run_pids(h2, rid) == []
