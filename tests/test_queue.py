"""`vmrun setup --slurm NAME`: test hosts made a real Slurm cluster by vmrun itself.

The hosts are service hosts (tests/testbed/services.py): reached as root, each with its own
/etc/slurm, /etc/munge, /var/lib/{slurm,munge}, /var/log/{slurm,munge} and /run, so vmrun
writes their files and starts their daemons as on VMs. STAND-IN: systemctl (no init system
runs in a network namespace; the stand-in runs the Debian units' argv). Real: Debian's
slurmctld, slurmd and munged, the munge key and every file vmrun sends, the jobs (torchrun
over gloo, as root, the hosts' user). The shared folder is one folder of the machine that
every host sees, as an NFS mount would be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, _client, error_in, slow_fixture, wait_for
from testbed import ClientKeys, NetnsBed
from testbed.services import (
    add_service_host,
    private_dir,
    skip_reason_no_accounting,
    skip_reason_no_service_hosts,
)

from vmrun.config import tomllib

NAME = "lab"
# a script all ranks run: who and where they are, then an all_reduce over gloo
TRAIN = """import os, socket, getpass
import torch.distributed as dist
dist.init_process_group("gloo")
print("RANK", dist.get_rank(), dist.get_world_size(), socket.gethostname(), flush=True)
print("USER", getpass.getuser(), os.getcwd(), flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # gloo's threads can abort a normal interpreter exit (torch 2.13)
"""


class Lab:
    """The bed, its hosts and the shared folder."""

    def __init__(self, bed: NetnsBed) -> None:
        self.bed = bed
        self.shared = bed.home_root / bed.prefix / "lab-shared"

    def host(self, name: str) -> Any:
        return self.bed.host(name)

    def sinfo(self, on: str = "q1") -> dict[str, str]:
        proc = self.host(on).run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, text=True)
        return dict(ln.split(maxsplit=1) for ln in proc.stdout.splitlines() if " " in ln)

    def daemons(self, name: str) -> dict[str, int]:
        """munged, slurmctld, slurmd (slurmdbd, mariadbd) running in host `name`:
        executable name -> pid."""
        found = {}
        for pid in self.host(name).pids():
            try:
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe")).removesuffix("-wlm")
            except OSError:
                continue
            if exe in ("munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd"):
                found[exe] = pid
        return found

    def etc(self, name: str, path: str) -> Path:
        """A file of host `name` under one of its own folders (/etc/slurm/slurm.conf...)."""
        for target in ("/etc/slurm", "/etc/munge", "/var/lib/slurm", "/run"):
            if path.startswith(target + "/"):
                return private_dir(self.bed, name, target) / path[len(target) + 1 :]
        raise ValueError(path)


@pytest.fixture(scope="module")
@slow_fixture
def lab(tmp_path_factory: pytest.TempPathFactory, client_keys: ClientKeys) -> Iterator[Lab]:
    reason = skip_reason_no_service_hosts()
    if reason:
        pytest.skip(f"service hosts unavailable: {reason}")
    with NetnsBed(tmp_path_factory.mktemp("queue-bed"), client_keys) as bed:
        for name in ("q1", "q2", "q3"):
            add_service_host(bed, name)
        the_lab = Lab(bed)
        the_lab.shared.mkdir(mode=0o755)
        yield the_lab


def _knows(lab: Lab, client: Client) -> Client:
    (client.ssh_dir / "config").write_text(lab.bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(lab.bed.known_hosts_text())
    return client


def _make(client: Client, lab: Lab, host_python: Path, *hosts: str, timeout: float = 180) -> Any:
    args = [a for h in hosts for a in ("-H", h)]
    return client.vmrun(
        "setup",
        *args,
        "--slurm",
        NAME,
        "--shared",
        str(lab.shared),
        "--env-manager",
        "python",
        "--python",
        str(host_python),
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def made(lab: Lab, tmp_path_factory: pytest.TempPathFactory, host_python: Path) -> tuple[Any, str]:
    """The cluster, made once by `vmrun setup --slurm` (its output and the vmrun.toml)."""
    client = _knows(lab, _client(tmp_path_factory.mktemp("queue-maker")))
    done = _make(client, lab, host_python, "q1", "q2", "q3")
    assert done.returncode == 0, done.stdout + done.stderr
    return done, (client.cwd / "vmrun.toml").read_text()


@pytest.fixture
def lab_client(lab: Lab, made: tuple[Any, str], client: Client) -> Iterator[Client]:
    """A client that knows the hosts and whose vmrun.toml names the cluster."""
    _knows(lab, client)
    (client.cwd / "vmrun.toml").write_text(made[1])
    (client.cwd / "train.py").write_text(TRAIN)
    yield client
    jobs = lab.host("q1").run(["squeue", "-h", "-o", "%i"], check=False, text=True).stdout
    if jobs.split():
        lab.host("q1").run(["scancel", *jobs.split()], check=False)
    for entry in lab.shared.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _recorded(client: Client) -> dict[str, Any]:
    data = tomllib.loads((client.cwd / "vmrun.toml").read_text())
    return next(c for c in data.get("clusters", []) if c["name"] == NAME)


def test_three_hosts_become_a_cluster_once(
    lab: Lab, made: tuple[Any, str], lab_client: Client, host_python: Path
) -> None:
    """3 hosts made one cluster: all idle in sinfo, the controller's slurmctld on q1, a
    slurmd on each, one munge key everywhere (0400, munge's), the cluster recorded; a second
    run changes nothing (no file written, no daemon restarted)."""
    done = made[0]
    assert lab.sinfo() == {"vmt-q1": "idle", "vmt-q2": "idle", "vmt-q3": "idle"}
    assert set(lab.daemons("q1")) == {"munged", "slurmctld", "slurmd"}
    assert set(lab.daemons("q2")) == set(lab.daemons("q3")) == {"munged", "slurmd"}
    keys = {lab.etc(h, "/etc/munge/munge.key").read_bytes() for h in ("q1", "q2", "q3")}
    assert len(keys) == 1 and len(keys.pop()) == 1024
    key = lab.etc("q2", "/etc/munge/munge.key")
    assert oct(key.stat().st_mode & 0o777) == "0o400" and key.stat().st_uid != 0
    recorded = _recorded(lab_client)
    assert recorded["login"] == "q1" and recorded["nodes"] == ["q1", "q2", "q3"]
    assert recorded["workdir"] == str(lab.shared) and recorded["python"] == str(host_python)
    assert f"cluster {NAME}: 3 node(s) in service" in done.stdout
    conf = lab.etc("q3", "/etc/slurm/slurm.conf")
    before = (conf.stat().st_mtime_ns, {h: lab.daemons(h) for h in ("q1", "q2", "q3")})
    again = _make(lab_client, lab, host_python, "q1", "q2", "q3")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing changed" in again.stdout, again.stdout
    assert (conf.stat().st_mtime_ns, {h: lab.daemons(h) for h in ("q1", "q2", "q3")}) == before


def test_train_on_the_made_cluster_runs_two_nodes_of_two_ranks(
    lab: Lab, lab_client: Client
) -> None:
    """`train -C lab` on the cluster vmrun made: torchrun over 2 nodes x 2 ranks, in the
    shared folder, as the hosts' user."""
    done = lab_client.vmrun(
        "train", "-C", NAME, "train.py", "--nodes", "2", "--nproc-per-node", "2", timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = set(re.findall(r"\] RANK (\d) (\d) (\S+)", done.stdout))
    hosts = {h for _, _, h in seen}
    assert {(r, w) for r, w, _ in seen} == {("0", "4"), ("1", "4"), ("2", "4"), ("3", "4")}
    assert len(hosts) == 2 and hosts <= {"vmt-q1", "vmt-q2", "vmt-q3"}, seen
    assert f"USER root {lab.shared}/" in done.stdout, done.stdout
    status = lab_client.vmrun("status", "-C", NAME)
    assert status.returncode == 0 and " done " in status.stdout, status.stdout + status.stderr


def test_logs_and_stop_of_a_detached_run_on_the_made_cluster(lab: Lab, lab_client: Client) -> None:
    """A detached run on the made cluster: `logs` reads it, `stop` cancels its job and
    leaves no step, as on any cluster."""
    (lab_client.cwd / "tick.py").write_text(
        "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
    )
    done = lab_client.vmrun("train", "-C", NAME, "tick.py", "--detach", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"run (\S+) submitted to lab as job (\d+)", done.stderr)
    assert found, done.stderr
    rid, job = found.groups()
    wait_for(
        lambda: "tick 3" in lab_client.vmrun("logs", rid, "-C", NAME).stdout,
        60,
        "the run's first lines in `vmrun logs`",
    )
    stopped = lab_client.vmrun("stop", rid, "-C", NAME)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"job {job} cancelled; no step left" in stopped.stdout, stopped.stdout
    assert _job_state(lab.host("q1"), job) == ""


def test_submit_runs_a_batch_script_of_one_s_own_on_the_made_cluster(
    lab: Lab, lab_client: Client
) -> None:
    """`vmrun submit` of the user's own batch script (2 nodes, srun), followed to its end
    from the files Slurm writes in the shared folder, as on any cluster."""
    (lab_client.cwd / "job.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
        "srun bash -c 'echo NODE $(hostname -s)'\n"
    )
    done = lab_client.vmrun("submit", "job.sh", "-C", NAME, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(set(re.findall(r"NODE (vmt-q\d)", done.stdout))) == 2, done.stdout


def test_a_six_point_sweep_is_queued_at_once_and_runs_three_at_a_time(
    lab: Lab, lab_client: Client
) -> None:
    """6 points on 3 nodes, each asking a whole node (2 CPUs): `--detach` puts all 6 in the
    queue and returns; Slurm runs 3 at once and starts the rest as nodes free up; `--resume`
    then follows them, fetches each and writes the report of all 6."""
    grid = ["--lr", "0.1,0.05,0.02", "--batch-size", "8,16", "--epochs", "1"]
    q1 = lab.host("q1")
    before = set(_jobs(q1))  # ended jobs of earlier tests stay listed (MinJobAge)
    done = lab_client.vmrun(
        "sweep", "-C", NAME, *grid, "--cpus-per-task", "2", "--detach", timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sweep_id = re.search(r"sweep (\S+): 6 size\(s\) in the queue of lab", done.stderr)
    assert sweep_id, done.stderr
    most, pending = 0, False

    def all_ended() -> bool:
        nonlocal most, pending
        rows = [state for job, state in _jobs(q1).items() if job not in before]
        assert len(rows) == 6, rows  # every point queued at once
        most = max(most, rows.count("RUNNING"))
        pending = pending or "PENDING" in rows
        return all(r in ("COMPLETED", "FAILED", "CANCELLED") for r in rows)

    wait_for(all_ended, 240, "the sweep's 6 jobs to end", interval=0.2)
    assert most == 3 and pending, (most, pending)
    states = [state for job, state in _jobs(q1).items() if job not in before]
    assert states == ["COMPLETED"] * 6, states
    follow = lab_client.vmrun("sweep", "--resume", sweep_id.group(1), timeout=300)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    report = list((lab_client.cwd / "results").glob("sweep-*/report.json"))
    assert len(report) == 1 and len(json.loads(report[0].read_text())) == 6


def test_a_host_of_another_cluster_is_refused_and_nothing_changes(
    lab: Lab, made: tuple[Any, str], lab_client: Client, host_python: Path
) -> None:
    """q3 is cluster lab's node: making it a node of another cluster is refused in one line
    before anything is written (the hosts' setup included), naming the host and why."""
    conf = lab.etc("q3", "/etc/slurm/slurm.conf")
    before = (conf.read_bytes(), lab.daemons("q3"))
    done = lab_client.vmrun(
        "setup",
        "-H",
        "q3",
        "--slurm",
        "other",
        "--shared",
        str(lab.shared),
        "--env-manager",
        "python",
        "--python",
        str(host_python),
    )
    assert done.returncode != 0
    assert error_in(done.stderr)[0] == "slurm-host-unfit", done.stderr
    assert "q3: /etc/slurm/slurm.conf is vmrun's cluster lab" in done.stderr, done.stderr
    assert (conf.read_bytes(), lab.daemons("q3")) == before
    assert (lab_client.cwd / "vmrun.toml").read_text() == made[1]  # no host, no cluster added
    # a folder each host has its own of (here: under its own /var/lib/slurm) is not shared
    apart = lab_client.vmrun(
        "setup",
        "-H",
        "q1",
        "-H",
        "q2",
        "-H",
        "q3",
        "--slurm",
        NAME,
        "--shared",
        "/var/lib/slurm/apart",
        "--env-manager",
        "python",
        "--python",
        str(host_python),
    )
    assert error_in(apart.stderr)[0] == "slurm-not-shared", apart.stderr
    assert "q2, q3 see another folder" in apart.stderr, apart.stderr
    assert (conf.read_bytes(), lab.daemons("q3")) == before
    assert (lab_client.cwd / "vmrun.toml").read_text() == made[1]
    # the controller stays where its queue is; a removal is of the whole cluster
    moved = lab_client.vmrun("setup", "--slurm", NAME, "--controller", "q2")
    assert error_in(moved.stderr)[0] == "flags-conflict" and "controller is q1" in moved.stderr
    part = lab_client.vmrun("setup", "-H", "q2", "--slurm", NAME, "--slurm-remove")
    assert error_in(part.stderr)[0] == "flags-conflict" and "all of cluster lab" in part.stderr
    assert lab.sinfo() == {"vmt-q1": "idle", "vmt-q2": "idle", "vmt-q3": "idle"}


def test_a_node_added_while_a_job_runs_then_the_cluster_removed(
    lab: Lab, lab_client: Client, host_python: Path
) -> None:
    """A fourth host joins while a job runs: the job goes on (same id, still running), the
    new node is idle; left out again, it is taken out, the job still running. Then
    `--slurm-remove` while the queue is empty: no Slurm or munge daemon is left in any
    host, vmrun's files are gone, the cluster is forgotten, and `train -H` runs on the
    hosts again."""
    q1 = lab.host("q1")
    job = q1.run(
        ["sbatch", "--parsable", "-N", "1", "-w", "vmt-q2", "--wrap", "sleep 300"], text=True
    ).stdout.strip()
    wait_for(lambda: _job_state(q1, job) == "RUNNING", 30, "the job to run")
    add_service_host(lab.bed, "q4")
    _knows(lab, lab_client)
    added = _make(lab_client, lab, host_python, "q1", "q2", "q3", "q4")
    assert added.returncode == 0, added.stdout + added.stderr
    assert "q4: node vmt-q4 idle" in added.stdout, added.stdout
    assert _job_state(q1, job) == "RUNNING"
    assert lab.sinfo()["vmt-q4"] == "idle" and lab.sinfo()["vmt-q2"] in ("mixed", "allocated")
    assert _recorded(lab_client)["nodes"] == ["q1", "q2", "q3", "q4"]
    # left out of the list again: taken out, the job still going on
    dropped = _make(lab_client, lab, host_python, "q1", "q2", "q3")
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert "q4: taken out of the cluster" in dropped.stdout, dropped.stdout
    assert set(lab.sinfo()) == {"vmt-q1", "vmt-q2", "vmt-q3"} and lab.daemons("q4") == {}
    assert _job_state(q1, job) == "RUNNING"
    busy = lab_client.vmrun("setup", "--slurm", NAME, "--slurm-remove")
    assert busy.returncode != 0 and error_in(busy.stderr)[0] == "slurm-busy", busy.stderr
    q1.run(["scancel", job])
    wait_for(lambda: not q1.run(["squeue", "-h"], text=True).stdout.strip(), 60, "an empty queue")
    gone = lab_client.vmrun("setup", "--slurm", NAME, "--slurm-remove")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    kept = re.findall(r"packages kept: (.*)", gone.stdout)
    assert len(kept) == 3 and set(kept[0].split()) >= {"slurmd", "slurmctld", "munge"}, gone.stdout
    for name in ("q1", "q2", "q3", "q4"):
        assert lab.daemons(name) == {}, name
        assert not lab.etc(name, "/etc/slurm/slurm.conf").exists()
        assert not lab.etc(name, "/etc/munge/munge.key").exists()
        assert not lab.etc(name, f"/var/lib/slurm/vmrun-{NAME}/name").exists()
        assert "vmrun-cluster" not in lab.host(name).run(["cat", "/etc/hosts"], text=True).stdout
    assert "clusters" not in tomllib.loads((lab_client.cwd / "vmrun.toml").read_text())
    done = lab_client.vmrun("train", "-H", "q1", "train.py", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "] RANK 0 2 vmt-q1" in done.stdout, done.stdout + done.stderr


def _job_state(host: Any, job: str) -> str:
    return host.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False, text=True).stdout.strip()


def _jobs(host: Any) -> dict[str, str]:
    """Every job the controller still lists (ended ones too): id -> state."""
    out = host.run(["squeue", "-h", "-t", "all", "-o", "%i %T"], text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


SOLO = "solo"


@pytest.fixture(scope="module")
def solo(lab: Lab, tmp_path_factory: pytest.TempPathFactory, host_python: Path) -> Iterator[Any]:
    """Cluster solo of two more hosts, q5 (its controller, with accounting: slurmdbd and
    MariaDB) and q6, made without --shared: each has its own home, nothing else is shared."""
    if reason := skip_reason_no_accounting():
        pytest.skip(reason)
    add_service_host(lab.bed, "q5", database=True)
    add_service_host(lab.bed, "q6")
    client = _knows(lab, _client(tmp_path_factory.mktemp("solo-maker")))
    done = client.vmrun(
        "setup",
        "-H",
        "q5",
        "-H",
        "q6",
        "--slurm",
        SOLO,
        "--slurmdbd",
        "--env-manager",
        "python",
        "--python",
        str(host_python),
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield done, (client.cwd / "vmrun.toml").read_text()
    q5 = lab.host("q5")
    jobs = q5.run(["squeue", "-h", "-o", "%i"], check=False, text=True).stdout.split()
    if jobs:
        q5.run(["scancel", *jobs], check=False)


def test_without_a_shared_folder_each_node_gets_the_project_and_a_run_is_read_where_it_ran(
    lab: Lab, solo: Any, client: Client
) -> None:
    """No shared folder: `train -C` syncs the project to both nodes (2 nodes x 2 ranks, each
    in its own home); a run placed on q6 (q5 kept busy) is followed there, and `status`,
    `logs` and `fetch` read it on q6; a 2-point sweep; sacct (slurmdbd on q5) keeps every
    job; a second run changes nothing; then the cluster is removed, MariaDB stopped again."""
    made, toml = solo
    assert "no shared folder" in made.stdout and "accounting: slurmdbd on q5" in made.stdout
    assert {"slurmdbd", "mariadbd"} <= set(lab.daemons("q5")), lab.daemons("q5")
    _knows(lab, client)
    (client.cwd / "vmrun.toml").write_text(toml)
    recorded = _recorded_as(client, SOLO)
    assert recorded["shared"] is False and recorded["workdir"] == "~", recorded
    assert recorded["accounting"] is True
    (client.cwd / "train.py").write_text(TRAIN)
    done = client.vmrun(
        "train", "-C", SOLO, "train.py", "--nodes", "2", "--nproc-per-node", "2", timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = set(re.findall(r"\] RANK (\d) 4 (\S+)", done.stdout))
    assert seen == {("0", "vmt-q5"), ("1", "vmt-q5"), ("2", "vmt-q6"), ("3", "vmt-q6")}, seen
    assert "USER root /root/" in done.stdout, done.stdout
    # q5 busy: the next run goes to q6, and everything about it is read there
    q5 = lab.host("q5")
    blocker = q5.run(
        ["sbatch", "--parsable", "-w", "vmt-q5", "--exclusive", "--wrap", "sleep 300"], text=True
    ).stdout.strip()
    wait_for(lambda: _job_state(q5, blocker) == "RUNNING", 30, "q5 to be taken")
    run = client.vmrun(
        "train",
        "-C",
        SOLO,
        "--nproc-per-node",
        "1",
        "--epochs",
        "2",
        "--save-every",
        "1",
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "running on vmt-q6" in run.stderr and "epoch 2/2" in run.stdout, run.stdout + run.stderr
    rid = re.search(r"run (\S+) submitted to solo", run.stderr).group(1)  # type: ignore[union-attr]
    q5.run(["scancel", blocker])
    status = client.vmrun("status", "-C", SOLO)
    row = next(line for line in status.stdout.splitlines() if rid in line)
    assert " done " in row and "epoch 2/2" in row, status.stdout
    logs = client.vmrun("logs", rid, "-C", SOLO)
    assert logs.returncode == 0 and "epoch 2/2" in logs.stdout, logs.stdout + logs.stderr
    fetched = client.vmrun("fetch", "results", "-C", SOLO, "--run", rid)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    local = client.cwd / "results" / rid
    assert (local / "finalmodel.pt").is_file() and (local / "metrics.jsonl").is_file()
    log = f"/root/.vmrun/runs/{rid}/job.log"  # each host's own /root
    assert [lab.host(h).run(["test", "-e", log], check=False).returncode for h in ("q5", "q6")] == [
        1,
        0,
    ]


def test_without_a_shared_folder_a_sweep_runs_on_both_and_accounting_keeps_every_job(
    lab: Lab, solo: Any, client: Client, host_python: Path
) -> None:
    """A 2-point sweep, a whole node each: one point on each node, each fetched from its
    own; sacct (slurmdbd on q5) keeps every job; a second `setup --slurm` changes nothing;
    `--slurm-remove` drops the database and stops the MariaDB it started."""
    _knows(lab, client)
    (client.cwd / "vmrun.toml").write_text(solo[1])
    q5 = lab.host("q5")
    swept = client.vmrun(
        "sweep",
        "-C",
        SOLO,
        "--lr",
        "0.1,0.05",
        "--epochs",
        "1",
        "--cpus-per-task",
        "2",
        timeout=300,
    )
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert {"running on vmt-q5", "running on vmt-q6"} <= set(
        re.findall(r"running on vmt-q\d", swept.stderr)
    ), swept.stderr
    (report,) = (client.cwd / "results").glob("sweep-*/report.json")
    rows = json.loads(report.read_text())
    assert len(rows) == 2 and all(
        (client.cwd / "results" / r["run"] / "finalmodel.pt").is_file() for r in rows
    ), rows
    # a detached run: `logs` reads it where it runs, `stop` cancels it there
    (client.cwd / "tick.py").write_text(
        "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
    )
    detached = client.vmrun("train", "-C", SOLO, "tick.py", "--detach", timeout=120)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    rid, job = re.search(r"run (\S+) submitted to solo as job (\d+)", detached.stderr).groups()  # type: ignore[union-attr]
    wait_for(
        lambda: "tick 3" in client.vmrun("logs", rid, "-C", SOLO).stdout,
        60,
        "the detached run's lines in `vmrun logs`",
    )
    stopped = client.vmrun("stop", rid, "-C", SOLO)
    assert f"job {job} cancelled; no step left" in stopped.stdout, stopped.stdout + stopped.stderr
    # accounting kept every job (sacct answers from slurmdbd's database)
    accounted = q5.run(["sacct", "-n", "-X", "-P", "-a", "-o", "JobID,State"], text=True).stdout
    states = dict(line.split("|", 1) for line in accounted.splitlines() if "|" in line)
    assert list(states.values()).count("COMPLETED") >= 2, accounted  # the sweep's 2 points
    assert states[job].startswith("CANCELLED"), accounted
    pids = (lab.daemons("q5"), lab.daemons("q6"))
    again = client.vmrun(
        "setup",
        "-H",
        "q5",
        "-H",
        "q6",
        "--slurm",
        SOLO,
        "--env-manager",
        "python",
        "--python",
        str(host_python),
        timeout=180,
    )
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout + again.stderr
    assert (lab.daemons("q5"), lab.daemons("q6")) == pids
    gone = client.vmrun("setup", "--slurm", SOLO, "--slurm-remove")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "removed database slurm_acct_solo" in gone.stdout, gone.stdout
    assert lab.daemons("q5") == lab.daemons("q6") == {}


def _recorded_as(client: Client, name: str) -> dict[str, Any]:
    data = tomllib.loads((client.cwd / "vmrun.toml").read_text())
    return next(c for c in data.get("clusters", []) if c["name"] == name)


def test_up_slurm_makes_the_vms_a_queue_on_their_private_addresses_and_down_forgets_it(
    lab: Lab, tmp_path: Path, host_python: Path
) -> None:
    """`vmrun up vq -n 2 --slurm` against moto's EC2 (STAND-IN at the cloud's boundary: each
    instance a service host of this bed, booted from vmrun's user data): the VMs, their
    setup ([setup] in vmrun.toml) and cluster vq of them, without a shared folder, its nodes
    on their private addresses; `train -C vq` on both; `down vq` forgets the cluster too."""
    pytest.importorskip("moto")
    pytest.importorskip("flask")
    from conftest import TORCH_SPEC
    from testbed import CloudBed

    keys = lab.bed.client_keys
    with CloudBed(
        lab.bed,
        tmp_path / "cloud",
        instances=["vm1", "vm2"],
        service_hosts=True,
        enforce_security_groups=True,
    ) as cloud:
        home, cwd = tmp_path / "home", tmp_path / "project"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        cwd.mkdir()
        shutil.copy(keys.private, home / ".ssh" / "id_ed25519")
        (home / ".ssh" / "id_ed25519").chmod(0o600)
        (home / ".ssh" / "id_ed25519.pub").write_text(keys.public_line + "\n")
        env = {
            **cloud.env(),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        }

        def vmrun(*args: str, timeout: float = 300) -> Any:
            argv = cloud.argv([sys.executable, "-m", "vmrun", *args], env=env)
            return subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )

        (cwd / "vmrun.toml").write_text(
            f'[setup]\nenv = "python"\npython = "{host_python}"\ntorch = "{TORCH_SPEC}"\n'
        )
        (cwd / "train.py").write_text(TRAIN)
        up = vmrun(
            "up",
            "vq",
            "--type",
            "g4dn.2xlarge",
            "-n",
            "2",
            "--user",
            "root",
            "--ssh-from",
            cloud.ssh_cidr,
            "--slurm",
        )
        assert up.returncode == 0, up.stdout + up.stderr
        assert "cluster vq: 2 node(s) in service" in up.stdout, up.stdout
        recorded = tomllib.loads((cwd / "vmrun.toml").read_text())
        (table,) = recorded["clusters"]
        assert (table["login"], table["nodes"], table["shared"]) == (
            "vq-0",
            ["vq-0", "vq-1"],
            False,
        )
        vm1, vm2 = cloud.hosts
        nodes = vm1.run(["scontrol", "show", "node", "-o"], text=True).stdout
        addrs = set(re.findall(r"NodeAddr=(\S+)", nodes))
        assert addrs == {vm1.addr_on("vpc"), vm2.addr_on("vpc")}, nodes
        done = vmrun("train", "-C", "vq", "train.py", "--nodes", "2", "--nproc-per-node", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        seen = set(re.findall(r"\] RANK (\d) 2 (\S+)", done.stdout))
        assert seen == {("0", vm1.hostname), ("1", vm2.hostname)}, done.stdout
        down = vmrun("down", "vq", timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        left = tomllib.loads((cwd / "vmrun.toml").read_text())
        assert "clusters" not in left and "hosts" not in left, left
