"""`vmrun tensorboard` on real sshd test hosts: a real TensorBoard on the host (h1's python has
tensorboard, h2's has not), reached through vmrun's forward and opened in a real headless
Chromium; Ctrl-C and SIGKILL of vmrun leave no TensorBoard process on the host; --local
serves fetched event files with a TensorBoard here and refetches while it serves.

The event files are real ones written on the host with torch's SummaryWriter in the host's
python (the run itself only prints), so the tests do not depend on what the template writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import (
    Client,
    _client,
    clean_host,
    error_in,
    errors_in,
    run_id_of,
    template_out,
    wait_for,
)
from slurm_fixtures import cluster_toml
from testbed import NetnsBed, SlurmCluster, TestHost
from web_helpers import Lines, all_pids, browser_dom, get, port_of, processes

from vmrun.remote_paths import remote_workdir
from vmrun.ssh.forward import bind_free

# Writes N scalars of TAG into DIR (steps FROM..FROM+N-1) with a fresh SummaryWriter: one new
# events file; or, with APPEND=file, then appends that file's records to it (a file that grew).
WRITER = """
import os, sys
from torch.utils.tensorboard import SummaryWriter
out, tag, first, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
w = SummaryWriter(out)
for step in range(first, first + n):
    w.add_scalar(tag, 1.0 / (step + 1), step)
w.close()
if len(sys.argv) > 5:
    new = [f for f in os.listdir(out) if f.startswith("events.out.tfevents.")]
    new = [os.path.join(out, f) for f in new if os.path.join(out, f) != sys.argv[5]]
    with open(sys.argv[5], "ab") as grown, open(new[0], "rb") as more:
        grown.write(more.read())
    os.remove(new[0])
"""
RUN_SCRIPT = "print('a run that writes nothing itself', flush=True)\n"


@dataclass
class Runs:
    client: Client
    h1_template: str  # a template run on h1 (python with tensorboard)
    h2_script: str  # a script run on h2 (python without tensorboard)
    python_tb: Path


def write_events(
    host: TestHost,
    python: Path,
    out: Path,
    tag: str,
    first: int,
    n: int,
    append_to: Path | None = None,
) -> None:
    argv = [str(python), "-c", WRITER, str(out), tag, str(first), str(n)]
    host.run([*argv, *([str(append_to)] if append_to else [])], as_user=True, timeout=120)


def tb_pids(host: TestHost) -> list[int]:
    """TensorBoard's processes on the host (its Python and its data server)."""
    return processes(host.user_pids(), "tensorboard")


@pytest.fixture(scope="module")
def runs(
    bed: NetnsBed,
    host_python_tb: Path,
    host_python: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Runs]:
    """One project, two finished runs with real event files; afterwards nothing on the hosts."""
    client = _client(tmp_path_factory.mktemp("tensorboard"))
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    (client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{host_python_tb}"\n\n'
        f'[[hosts]]\naddress = "h2"\npython = "{host_python}"\n'
    )
    client.extra_env["OMP_NUM_THREADS"] = "1"
    (client.cwd / "quiet.py").write_text(RUN_SCRIPT)
    h1, h2 = bed["h1"], bed["h2"]
    try:
        done = client.vmrun(
            "train", "-H", "h1", "--epochs", "1", "--nproc-per-node", "1", timeout=300
        )
        assert done.returncode == 0, done.stderr
        template = run_id_of(done.stderr)
        out = template_out(h1, client, template)
        write_events(h1, host_python_tb, out, "check/out_loss", 0, 5)
        workdir = h1.home / remote_workdir(client.cwd)
        write_events(h1, host_python_tb, workdir / "runs" / "exp1", "check/runs_loss", 0, 5)
        done = client.vmrun("train", "quiet.py", "-H", "h2", "--launcher", "python", timeout=300)
        assert done.returncode == 0, done.stderr
        script = run_id_of(done.stderr)
        workdir = h2.home / remote_workdir(client.cwd)
        write_events(h2, host_python_tb, workdir / "runs" / "exp2", "check/local_loss", 0, 5)
        yield Runs(client, template, script, host_python_tb)
    finally:
        for host in (h1, h2):
            for pid in tb_pids(host):  # a failed test's leftovers (each test checks none)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            clean_host(host)


def tags(port: int) -> dict[str, list[str]]:
    data = json.loads(get(port, "/data/plugin/scalars/tags"))
    return {run: sorted(found) for run, found in data.items()}


def scalars(port: int, run: str, tag: str) -> list[list[float]]:
    query = urllib.parse.urlencode({"run": run, "tag": tag})
    return json.loads(get(port, f"/data/plugin/scalars/scalars?{query}"))


def test_tensorboard_on_the_host_in_a_real_browser_then_ctrl_c_leaves_nothing(
    bed: NetnsBed, runs: Runs, tmp_path: Path
) -> None:
    h1 = bed["h1"]
    started = time.monotonic()
    lines = Lines(runs.client.popen("tensorboard", "-H", "h1", "--port", "0"))
    url = lines.url(120)
    to_url = time.monotonic() - started
    port = port_of(url)
    # the newest run on h1 is the template run: its output folder and the work dir's runs/
    wait_for(lambda: len(tags(port)) >= 2, 60, "TensorBoard to load both folders")
    found = tags(port)
    # its root: the template's own events (the host's python has tensorboard) and ours
    assert {"check/out_loss", "train/loss", "eval/loss"} <= set(
        found.get(f"{runs.h1_template}/.", [])
    ), found
    assert found["runs/exp1"] == ["check/runs_loss"], found
    assert [p[1:] for p in scalars(port, "runs/exp1", "check/runs_loss")][:2] == [
        [0, 1.0],
        [1, 0.5],
    ]
    # several browser connections at once, all through the one SSH connection
    paths = ["/data/runs", "/data/plugin/scalars/tags", "/", "/data/environment"] * 4
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda path: get(port, path), paths))
    assert all(bodies) and sorted(json.loads(bodies[0])) == sorted(found)
    # a real browser renders the scalar dashboard: the tags are on the page
    dom = browser_dom(url, tmp_path)
    assert "check/out_loss" in dom and "check/runs_loss" in dom, dom[-2000:]
    assert tb_pids(h1), "TensorBoard runs on h1"
    code, err = lines.finish(signal.SIGINT)
    assert code == 0, err
    assert err.strip().splitlines()[-1] == "vmrun: stopped TensorBoard on h1", err
    assert not tb_pids(h1), "Ctrl-C stopped TensorBoard on h1 before vmrun exited"
    print(f"command to URL: {to_url:.1f} s")


def test_busy_port_moves_on_and_sigkilled_vmrun_leaves_no_tensorboard(
    bed: NetnsBed, runs: Runs
) -> None:
    h1 = bed["h1"]
    with bind_free(0) as holder:
        busy = holder.getsockname()[1]
        lines = Lines(runs.client.popen("tensorboard", runs.h1_template, "--port", str(busy)))
        url = lines.url(120)
        assert port_of(url) != busy
        wait_for(lambda: any("in use" in line for line in lines.err), 10, "the port's line")
        moved = [line for line in lines.err if "in use" in line]
        assert moved == [f"vmrun: local port {busy} is in use; using {port_of(url)}\n"]
        assert f"{runs.h1_template}/." in tags(port_of(url))
    wait_for(lambda: tb_pids(h1), 30, "TensorBoard on h1")
    lines.finish(signal.SIGKILL)  # the connection drops with vmrun: no goodbye at all
    started = time.monotonic()
    wait_for(lambda: not tb_pids(h1), 30, "TensorBoard on h1 to end after vmrun was killed")
    print(f"TensorBoard gone from h1 {time.monotonic() - started:.1f} s after SIGKILL")


def test_a_lost_link_ends_vmrun_in_one_line_and_tensorboard_on_the_host(
    bed: NetnsBed, runs: Runs
) -> None:
    """A link gone silent: vmrun's watchdog ends it (exit 13, one line); the host hears no
    heartbeat and ends TensorBoard itself."""
    h1 = bed["h1"]
    lines = Lines(runs.client.popen("tensorboard", runs.h1_template, "--port", "0"))
    lines.url(120)
    wait_for(lambda: tb_pids(h1), 30, "TensorBoard on h1")
    h1.cut_link()
    try:
        code, err = lines.finish(None, timeout=30)
        started = time.monotonic()
        wait_for(lambda: not tb_pids(h1), 60, "TensorBoard on h1 to end without its client")
        print(f"TensorBoard gone from h1 {time.monotonic() - started:.1f} s after vmrun's exit")
    finally:
        h1.heal_link()
    assert code == 13, err
    code, last = error_in(err)
    assert code == "connection-lost" and last.startswith("h1: "), err
    assert "while serving TensorBoard" in last, err


def test_a_host_without_tensorboard_says_how_to_fix_it(bed: NetnsBed, runs: Runs) -> None:
    h2 = bed["h2"]
    done = runs.client.vmrun("tensorboard", runs.h2_script, "-H", "h2", timeout=120)
    assert done.returncode == 14, done.stderr
    [(code, line)] = errors_in(done.stderr)  # one line, and no other
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert code == "tensorboard-failed" and line.startswith("h2: "), done.stderr
    assert "has no tensorboard" in line, line
    assert "`vmrun setup --pip tensorboard -H h2`" in line, line
    assert f"`vmrun tensorboard {runs.h2_script} --local`" in line, line
    assert done.stdout == ""
    assert not processes(h2.user_pids(), "vmrun-tensorboard") and not tb_pids(h2)


def test_local_serves_fetched_events_and_refetches_a_file_that_grew(
    bed: NetnsBed, runs: Runs
) -> None:
    """The host's python has no tensorboard: --local fetches its events here and serves
    them; events appended to the same file on the host appear after a refetch."""
    h2 = bed["h2"]
    rid = runs.h2_script
    lines = Lines(
        runs.client.popen("tensorboard", rid, "-H", "h2", "--local", "--every", "1", "--port", "0")
    )
    url = lines.url(120)
    port = port_of(url)
    local = runs.client.cwd / "results" / rid / "runs" / "exp2"
    (events,) = local.glob("events.out.tfevents.*")
    wait_for(lambda: tags(port).get("runs/exp2"), 60, "the fetched events in TensorBoard")
    assert len(scalars(port, "runs/exp2", "check/local_loss")) == 5
    remote = h2.home / remote_workdir(runs.client.cwd) / "runs" / "exp2" / events.name
    write_events(h2, runs.python_tb, remote.parent, "check/local_loss", 5, 7, append_to=remote)
    wait_for(
        lambda: len(scalars(port, "runs/exp2", "check/local_loss")) == 12,
        60,
        "the grown file's new events, fetched and reloaded",
    )
    mine = lambda: processes(all_pids(), str(runs.client.cwd / "results" / rid))  # noqa: E731
    assert mine(), "TensorBoard runs here"
    code, err = lines.finish(signal.SIGINT)
    assert code == 0, err
    assert err.strip().splitlines()[-1] == "vmrun: stopped TensorBoard here", err
    assert not mine(), "no TensorBoard left here"
    assert re.search(r"fetched \d+ new file", err), err
    # vmrun killed outright (no Ctrl-C, no cleanup of its own): its TensorBoard goes too
    again = Lines(runs.client.popen("tensorboard", rid, "-H", "h2", "--local", "--port", "0"))
    again.url(120)
    wait_for(mine, 30, "TensorBoard here again")
    code, _ = again.finish(signal.SIGKILL)
    assert code == -signal.SIGKILL
    wait_for(lambda: not mine(), 30, "no TensorBoard here after vmrun was killed")


def test_bad_input_is_one_line_before_any_connection(bed_client: Client) -> None:
    for args, needle in (
        (["tensorboard", "--logdir", " "], "--logdir"),
        (["tensorboard", "--logdir", "~bob/x"], "~user paths are not supported"),
        (["tensorboard", "-C", "x", "-H", "h1"], "both say where to work"),
        (["forward", "8080", "-H", "h1", "-H", "h2"], "forward goes through one host; 2"),
        (["forward", "0", "-H", "h1"], "PORT"),
    ):
        done = bed_client.vmrun(*args, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert needle in line, (args, line)


def test_on_a_cluster_tensorboard_runs_on_the_login_node(
    slurm_cluster: SlurmCluster, slurm_client: Client, host_python_tb: Path
) -> None:
    """The run's files are on the shared filesystem: TensorBoard runs on the login node with
    the cluster's python, and Ctrl-C stops it there."""
    login = slurm_cluster.login
    (slurm_client.cwd / "vmrun.toml").write_text(cluster_toml(host_python_tb))
    (slurm_client.cwd / "quiet.py").write_text(RUN_SCRIPT)
    done = slurm_client.vmrun("train", "-C", "bed", "quiet.py", "--launcher", "python", timeout=300)
    assert done.returncode == 0, done.stderr
    code_dir = login.home / remote_workdir(slurm_client.cwd)
    write_events(login, host_python_tb, code_dir / "runs" / "exp3", "check/cluster_loss", 0, 5)
    lines = Lines(slurm_client.popen("tensorboard", "-C", "bed", "--port", "0"))
    port = port_of(lines.url(120))
    wait_for(lambda: tags(port), 60, "TensorBoard to load the run's events")
    assert list(tags(port).values()) == [["check/cluster_loss"]], tags(port)
    assert tb_pids(login)
    code, err = lines.finish(signal.SIGINT)
    assert code == 0, err
    assert err.strip().splitlines()[-1] == "vmrun: stopped TensorBoard on bed", err
    assert not tb_pids(login)
