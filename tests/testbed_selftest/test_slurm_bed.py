"""Self-test of the Slurm test cluster (tests/testbed/slurm.py): it is a real Slurm.

Jobs go in through the login host, over real SSH or as its user; every wait is a
condition with a deadline.  Needs root, `ip netns` and slurm-wlm + munge; skips otherwise.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from conftest import Client, wait_for  # noqa: E402
from slurm_fixtures import clean_cluster  # noqa: E402
from testbed import ClientKeys, NetnsBed, SlurmCluster, skip_reason_no_slurm  # noqa: E402
from testbed.layout import ETC_NETNS  # noqa: E402
from testbed.procs import pid_alive  # noqa: E402


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster; afterwards no job, no job process, no file in `shared`."""
    yield slurm_cluster
    clean_cluster(slurm_cluster)


def sbatch(cluster: SlurmCluster, *args: str) -> str:
    done = cluster.run_on_login(["sbatch", "--parsable", *args])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def finished(cluster: SlurmCluster, job: str, timeout: float = 30) -> None:
    wait_for(lambda: job not in cluster.squeue_ids(), timeout, f"job {job} to end")


def state_and_reason(cluster: SlurmCluster, job: str) -> str:
    return cluster.run_on_login(["squeue", "-h", "-j", job, "-o", "%T|%r"]).stdout.strip()


def ssh(client: Client, command: str) -> subprocess.CompletedProcess[str]:
    """The system ssh client, as the test user: ssh config alias `login`, strict keys."""
    return subprocess.run(
        [
            "ssh",
            "-F",
            str(client.ssh_dir / "config"),
            "-o",
            f"UserKnownHostsFile={client.ssh_dir / 'known_hosts'}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "login",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def test_sbatch_over_ssh_runs_srun_on_both_compute_nodes(
    cluster: SlurmCluster, slurm_client: Client
) -> None:
    """An SSH session on the login host finds /etc/slurm/slurm.conf (no SLURM_CONF); a
    2-node job's `srun hostname` prints both compute hosts' names."""
    conf = ssh(slurm_client, 'echo "${SLURM_CONF:-unset}"; scontrol show config')
    assert conf.returncode == 0, conf.stderr
    assert conf.stdout.startswith("unset\n")
    assert re.search(r"^SLURM_CONF\s+= /etc/slurm/slurm.conf$", conf.stdout, re.M)
    out = cluster.shared / "hostname.out"
    started = time.monotonic()
    done = ssh(slurm_client, f"sbatch --parsable -N 2 -o {out} --wrap 'srun hostname'")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: out.exists() and out.read_text(), 30, "the job's first line")
    first_line_s = time.monotonic() - started
    finished(cluster, done.stdout.strip())
    assert sorted(out.read_text().split()) == cluster.node_names
    assert first_line_s < 10, first_line_s


def test_srun_ranks_two_tasks_per_node(cluster: SlurmCluster) -> None:
    out = cluster.shared / "ranks.out"
    job = sbatch(
        cluster,
        "-N",
        "2",
        "--ntasks-per-node=2",
        "-o",
        str(out),
        "--wrap",
        "srun bash -c 'echo $SLURM_PROCID $SLURM_LOCALID $(hostname)'",
    )
    finished(cluster, job)
    c1, c2 = cluster.node_names
    assert sorted(out.read_text().splitlines()) == [
        f"0 0 {c1}",
        f"1 1 {c1}",
        f"2 0 {c2}",
        f"3 1 {c2}",
    ]


def test_jobs_run_as_the_login_user_with_its_home_names_and_interpreter(
    cluster: SlurmCluster, host_python: Path
) -> None:
    """On the compute nodes: the login user, its login home, the shared dir writable, every
    node name resolving (MASTER_ADDR), and the hosts' interpreter with torch."""
    out, script = cluster.shared / "env.out", cluster.shared / "env.sh"
    script.write_text(
        textwrap.dedent(r"""
        #!/bin/bash
        first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); export first
        echo "first $first"
        srun bash -c 'echo $(hostname) $(id -un) $HOME $(getent hosts $first | awk "{print \$1}")
                      touch SHARED/wrote-$(hostname)'
        srun -N1 -n1 PYTHON -c 'import torch; print("torch", torch.__version__)'
        """)
        .lstrip()
        .replace("SHARED", str(cluster.shared))
        .replace("PYTHON", str(host_python))
    )
    job = sbatch(cluster, "-N", "2", "-o", str(out), str(script))
    finished(cluster, job, timeout=60)
    lines = out.read_text().splitlines()
    c1, c2 = cluster.node_names
    user, home, c1_addr = cluster.login.user, cluster.login.home, cluster.computes[0].addr
    assert lines[0] == f"first {c1}"
    assert sorted(lines[1:3]) == [f"{n} {user} {home} {c1_addr}" for n in (c1, c2)]
    assert lines[-1].startswith("torch 2."), lines  # after torch's warnings, if any
    for node in (c1, c2):
        assert (cluster.shared / f"wrote-{node}").stat().st_uid == cluster.login.uid


def test_scancel_signal_reaches_the_step(cluster: SlurmCluster) -> None:
    got = cluster.shared / "usr2"
    out = cluster.shared / "signal.out"
    step = f'trap "echo got USR2 > {got}; exit 0" USR2; echo ready; while :; do sleep 0.1; done'
    job = sbatch(cluster, "-o", str(out), "--wrap", f"srun bash -c '{step}'")
    wait_for(lambda: out.exists() and "ready" in out.read_text(), 30, "the step to trap")
    signalled = cluster.run_on_login(["scancel", "--signal=USR2", job])
    assert signalled.returncode == 0, signalled.stderr
    wait_for(lambda: got.exists() and got.read_text() == "got USR2\n", 10, "the trap to run")
    finished(cluster, job)


def test_requeue_reruns_the_batch_script_with_restart_count_1(cluster: SlurmCluster) -> None:
    """scontrol requeue: the job is PENDING (BeginTime) for cred_expire + 1 = 6 s, then
    runs again with SLURM_RESTART_COUNT=1 (the output file is appended to)."""
    out = cluster.shared / "requeue.out"
    job = sbatch(
        cluster,
        "--requeue",
        "--open-mode=append",
        "-o",
        str(out),
        "--wrap",
        'echo "restart ${SLURM_RESTART_COUNT:-unset}"; sleep 300',
    )
    wait_for(lambda: out.exists() and out.read_text(), 30, "the first run")
    requeued = cluster.run_on_login(["scontrol", "requeue", job])
    assert requeued.returncode == 0, requeued.stderr
    wait_for(lambda: "restart 1" in out.read_text(), 30, "the second run")
    runs = [ln for ln in out.read_text().splitlines() if ln.startswith("restart")]
    assert runs == ["restart unset", "restart 1"]


def test_pending_reasons_when_the_partition_is_full_or_too_small(
    cluster: SlurmCluster,
) -> None:
    hold = sbatch(cluster, "-N", "2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300")
    wait_for(lambda: state_and_reason(cluster, hold) == "RUNNING|None", 30, "the holder")
    waits = sbatch(cluster, "-o", "/dev/null", "--wrap", "true")
    wait_for(
        lambda: state_and_reason(cluster, waits) in ("PENDING|Resources", "PENDING|Priority"),
        10,
        "PENDING (Resources)",
    )
    # more nodes than the partition has: never refused (EnforcePartLimits=NO), pending
    # forever; PartitionConfig at first, PartitionNodeLimit after a scheduler pass
    never = sbatch(cluster, "-p", "one", "-N", "2", "-o", "/dev/null", "--wrap", "true")
    wait_for(
        lambda: state_and_reason(cluster, never) == "PENDING|PartitionNodeLimit",
        10,
        "PENDING (PartitionNodeLimit)",
    )


def test_refusals_gpus_and_no_accounting(cluster: SlurmCluster) -> None:
    nosuch = cluster.run_on_login(["sbatch", "-p", "nosuch", "--wrap", "true"])
    assert nosuch.returncode == 1
    assert nosuch.stderr == (
        "sbatch: error: invalid partition specified: nosuch\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    )
    too_many = cluster.run_on_login(["sbatch", "--gpus-per-node=3", "--wrap", "true"])
    assert too_many.returncode == 1
    assert "Requested node configuration is not available" in too_many.stderr
    out = cluster.shared / "gpus.out"
    job = sbatch(
        cluster,
        "-N",
        "2",
        "--gpus-per-node=2",
        "-o",
        str(out),
        "--wrap",
        "srun bash -c 'echo $(hostname) $CUDA_VISIBLE_DEVICES'",
    )
    by_gres = sbatch(cluster, "--gres=gpu:2", "-o", "/dev/null", "--wrap", "true")
    finished(cluster, job)
    finished(cluster, by_gres)
    assert sorted(out.read_text().splitlines()) == [f"{n} 0,1" for n in cluster.node_names]
    sacct = cluster.run_on_login(["sacct", "-j", job])  # no slurmdbd: nothing to ask
    assert (sacct.returncode, sacct.stderr) == (1, "Slurm accounting storage is disabled\n")


@pytest.mark.netns
@pytest.mark.skipif(skip_reason_no_slurm() is not None, reason=skip_reason_no_slurm() or "")
def test_close_leaves_no_process_and_no_file(tmp_path: Path, client_keys: ClientKeys) -> None:
    """A cluster of its own, closed with a job running: every daemon and step gone (by
    pid), its files too; close() again does nothing."""
    with NetnsBed(tmp_path / "bed", client_keys) as bed:
        cluster = SlurmCluster(bed, computes=1)
        out = cluster.shared / "running.out"
        job = sbatch(cluster, "-o", str(out), "--wrap", "echo up; srun sleep 300")
        wait_for(lambda: out.exists() and out.read_text(), 30, "the job to run")
        assert cluster.leftover_pids(), "slurmstepd and the job's processes are there"
        pids = cluster.daemon_pids()
        assert set(pids) == {"munged", "slurmctld", f"slurmd-{cluster.node_names[0]}"}
        files = [cluster.paths.root, cluster.shared, ETC_NETNS / cluster.login.netns / "slurm"]
        started = time.monotonic()
        cluster.close()
        assert time.monotonic() - started < 5
        assert not [what for what, pid in pids.items() if pid_alive(pid)], job
        assert not cluster.leftover_pids()
        assert not [f for f in files if f.exists()]
        cluster.close()
