"""`vmrun submit` on the bed's real Slurm: the seed tutorials' own batch scripts, in CPU copies
that keep their structure (tests/own_sbatch/), submitted unchanged; their output followed
live from the files Slurm writes, status per task, stop and fetch."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, error_in, wait_for
from test_cli_slurm import job_pids, status_rows

SCRIPTS = Path(__file__).parent / "own_sbatch"


def use_cluster(cluster: Any, client: Client, python: Path) -> None:
    """The seeds' scripts in the project; vmrun.toml names the bed's cluster, whose env
    gives MODULEPATH: a module `torchenv/1.0` puts the interpreter with torch on PATH, as a
    cluster's `module load pytorch` does."""
    if not Path("/usr/share/modules/init/bash").exists():
        pytest.skip("Environment Modules is not installed (apt-get install environment-modules)")
    modules = cluster.shared / "modulefiles"
    (modules / "torchenv").mkdir(parents=True, exist_ok=True)
    (modules / "torchenv" / "1.0").write_text(f"#%Module1.0\nprepend-path PATH {python.parent}\n")
    (client.cwd / "vmrun.toml").write_text(
        '[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'env = {{ MODULEPATH = "{modules}", OMP_NUM_THREADS = "1" }}\n'
    )
    for script in SCRIPTS.iterdir():
        shutil.copy(script, client.cwd / script.name)
    (client.cwd / "logs").mkdir()
    (client.cwd / "logs" / ".keep").write_text("")


def submitted(text: str) -> tuple[str, str]:
    match = re.search(r"run (\S+) submitted to bed as job (\d+)", text)
    assert match, text
    return match.group(1), match.group(2)


def code_dir(cluster: Any, client: Client) -> Path:
    from vmrun.remote_paths import remote_workdir

    return Path(cluster.login.home) / remote_workdir(client.cwd)


def test_princeton_script_runs_unchanged_and_is_fetched(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """Princeton's script (`scontrol show hostnames` for MASTER_ADDR, WORLD_SIZE from
    SLURM_NNODES * SLURM_NTASKS_PER_NODE, `module purge/load`, `srun python`): 2 nodes x 2
    tasks of gloo DDP, its slurm-<job>.out streamed; status, then fetch brings its outputs."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    done = slurm_client.vmrun("submit", "princeton.slurm", "-C", "bed", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    rid, job = submitted(done.stderr)
    assert "WORLD_SIZE=4" in done.stdout and "MASTER_ADDR=vmt-c1" in done.stdout
    hosts = set(re.findall(r"Hello from rank \d of 4 on (\S+)", done.stdout))
    assert hosts == set(slurm_cluster.node_names), done.stdout
    assert done.stdout.count("Group initialized? True") == 4
    assert "Training complete" in done.stdout
    row = status_rows(slurm_client)[rid]
    assert row[1:4] == ["bed", "done", "on vmt-c[1-2]"] and row[-1] == "0", row
    fetched = slurm_client.vmrun("fetch", "results", "-C", "bed", "--run", rid)
    assert fetched.returncode == 0, fetched.stderr
    local = slurm_client.cwd / "results" / rid
    out = local / f"slurm-{job}.out"
    assert "Training complete" in out.read_text()
    remote = code_dir(slurm_cluster, slurm_client) / "princeton-out" / "ckpt.tar"
    assert (local / "princeton-out" / "ckpt.tar").read_bytes() == remote.read_bytes()
    assert not (local / "princeton.slurm").exists()  # synced, not written by the job
    # what made it: the script as the job ran it, the job's allocation, the code's hash
    assert (local / "batch.sh").read_text() == (slurm_client.cwd / "princeton.slurm").read_text()
    allocation = (local / "allocation").read_text()
    assert f"JobId={job} " in allocation and "NodeList=vmt-c[1-2]" in allocation
    assert json.loads((local / "run.json").read_text())["code"]["files"] >= 1


def test_nersc_script_followed_live_with_logs(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """NERSC's submit_batch_modules.sh (`srun -l bash -c 'source export_DDP_vars.sh && python
    ...'`, MASTER_ADDR=$(hostname), `-o %x-%j.out`): submitted detached, then `logs -f`
    follows the job's own file to the end; `logs` reads it again afterwards."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    done = slurm_client.vmrun("submit", "submit_batch_modules.sh", "-C", "bed", "--detach")
    assert done.returncode == 0, done.stderr
    rid, job = submitted(done.stderr)
    followed = slurm_client.vmrun("logs", "-f", rid, "-C", "bed", timeout=300)
    assert followed.returncode == 0, followed.stderr + followed.stdout
    assert "0: running on rank 0 with world size 2" in followed.stdout
    assert "1: running on rank 1 with world size 2" in followed.stdout
    assert "0: Training complete" in followed.stdout
    path = code_dir(slurm_cluster, slurm_client) / f"nersc-ddp-{job}.out"
    assert path.exists()
    again = slurm_client.vmrun("logs", rid, "-C", "bed")
    assert again.returncode == 0 and again.stdout == path.read_text(), again.stderr


def test_servers_script_venv_in_slurm_tmpdir(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """The servers note's pytorch-test.sh: `--output=%N-%j.out` (the node's name in the file
    name, known only once the job runs), `module load`, a venv in $SLURM_TMPDIR. Detached
    and never followed: `status` sees it end and keeps its end in the run's record (squeue
    forgets it MinJobAge later); `logs -f` afterwards shows its whole output and its end."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    done = slurm_client.vmrun("submit", "pytorch-test.sh", "-C", "bed", "--detach")
    assert done.returncode == 0, done.stderr
    rid, job = submitted(done.stderr)
    wait_for(lambda: status_rows(slurm_client)[rid][2] in ("done", "failed"), 120, "the job to end")
    assert status_rows(slurm_client)[rid][2] == "done"
    ended = Path(slurm_cluster.login.home) / ".vmrun" / "runs" / rid / "ended"
    assert ended.read_text().split()[:3] == ["-", "COMPLETED", "0"]
    logs = slurm_client.vmrun("logs", "-f", rid, "-C", "bed", timeout=120)
    assert logs.returncode == 0, logs.stderr
    assert re.search(rf"python is \S+/jobtmp/{job}/env/bin/python", logs.stdout), logs.stdout
    assert "Training complete" in logs.stdout
    files = list(code_dir(slurm_cluster, slurm_client).glob(f"vmt-c*-{job}.out"))
    assert len(files) == 1 and files[0].read_text() == logs.stdout


def test_array_is_one_run_with_a_row_per_task(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """A 2-task array with an argument after `--`: one run; each task's file streamed with
    its index; task 1 exits 1, so the run fails with that code; a row per task in status
    (and in --json); logs reads both files; fetch brings what the tasks wrote."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    done = slurm_client.vmrun("submit", "array.sh", "-C", "bed", "--", "ARG1", timeout=300)
    assert done.returncode == 1, done.stderr + done.stdout
    assert error_in(done.stderr)[0] == "run-failed"
    rid, job = submitted(done.stderr)
    assert f"[0] task 0 of job {job} argument ARG1" in done.stdout
    assert f"[1] task 1 of job {job} argument ARG1" in done.stdout
    rows = status_rows(slurm_client)
    assert rows[rid][2] == "failed" and rows[rid][-1] == "1", rows
    assert rows[f"{rid}[0]"][2] == "done" and rows[f"{rid}[0]"][-1] == "0"
    assert rows[f"{rid}[1]"][2] == "failed" and rows[f"{rid}[1]"][-1] == "1"
    listed = json.loads(slurm_client.vmrun("status", "-C", "bed", "--json").stdout)
    (obj,) = [o for o in listed if o["run"] == rid]
    assert [(t["task"], t["state"], t["exit"]) for t in obj["tasks"]] == [
        ("0", "done", 0),
        ("1", "failed", 1),
    ]
    logs = slurm_client.vmrun("logs", rid, "-C", "bed")
    assert "[0] task 0" in logs.stdout and "[1] task 1" in logs.stdout, logs.stderr
    fetched = slurm_client.vmrun("fetch", "results", "-C", "bed", "--run", rid)
    assert fetched.returncode == 0, fetched.stderr
    local = slurm_client.cwd / "results" / rid
    assert (local / "result-1.txt").read_text() == "task 1 result\n"
    assert (local / f"slurm-{job}_0.out").exists()
    shutil.rmtree(local)
    logs = slurm_client.vmrun("fetch", "logs", "-C", "bed", "--run", rid)
    assert logs.returncode == 0, logs.stderr
    assert sorted(p.name for p in local.iterdir() if p.name.startswith("slurm-")) == [
        f"slurm-{job}_0.out",
        f"slurm-{job}_1.out",
    ]
    assert not (local / "result-1.txt").exists()  # logs only


def test_the_folder_the_script_s_output_names_is_made_and_one_that_cannot_be_is_refused(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """`#SBATCH --output=joblogs/deep/%x-%j.out` with no joblogs/ (an empty folder is not
    synced; sbatch makes none, and the job would fail with its output lost): vmrun makes
    it, says so, and the job's line arrives. A folder under a file cannot be made: one
    line naming it, exit 2, no job and no record."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    (slurm_client.cwd / "outdir.sh").write_text(
        "#!/bin/bash\n#SBATCH --job-name=outdir\n#SBATCH --output=joblogs/deep/%x-%j.out\n"
        "echo written where asked\n"
    )
    done = slurm_client.vmrun("submit", "outdir.sh", "-C", "bed", timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "bed: made joblogs/deep for the job's output" in done.stderr, done.stderr
    assert "written where asked" in done.stdout
    _, job = submitted(done.stderr)
    written = code_dir(slurm_cluster, slurm_client) / "joblogs" / "deep" / f"outdir-{job}.out"
    assert written.read_text() == "written where asked\n"
    runs = Path(slurm_cluster.login.home) / ".vmrun" / "runs"
    before = sorted(runs.iterdir())
    (slurm_client.cwd / "bad.sh").write_text(
        "#!/bin/bash\n#SBATCH --output=outdir.sh/under-a-file/%j.out\necho never\n"
    )
    bad = slurm_client.vmrun("submit", "bad.sh", "-C", "bed", timeout=120)
    assert bad.returncode == 2, bad.stderr
    code, said = error_in(bad.stderr)
    assert code == "output-folder" and "outdir.sh/under-a-file" in said, bad.stderr
    assert sorted(runs.iterdir()) == before and "submitted" not in bad.stderr
    # a folder named by the job's id cannot be made before: the job fails before its first
    # line, and vmrun says why as Slurm tells it, not a bare code
    (slurm_client.cwd / "perjob.sh").write_text(
        "#!/bin/bash\n#SBATCH --output=perjob/%j/out.txt\necho lost\n"
    )
    lost = slurm_client.vmrun("submit", "perjob.sh", "-C", "bed", timeout=300)
    assert lost.returncode != 0, lost.stderr
    code, said = error_in(lost.stderr)
    assert code == "run-failed" and "before its first line" in said, lost.stderr
    assert "perjob/" in said and "does not exist" in said, said


def test_stop_of_a_running_job_and_live_logs(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """`logs -f` shows the job's lines while it runs (before it ends), from the files its
    --output/--error name (logs/%x-%j.out and .err); `stop` cancels it and no process of it
    is left; status says stopped."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    done = slurm_client.vmrun("submit", "waits.sh", "-C", "bed", "--detach")
    assert done.returncode == 0, done.stderr
    rid, _ = submitted(done.stderr)
    follow = slurm_client.popen("logs", "-f", rid, "-C", "bed")
    try:
        assert follow.stdout is not None
        # blocks until the running job's lines come: its .out and .err, in either order
        first = {follow.stdout.readline(), follow.stdout.readline()}
        assert {line.split(" vmt-")[0] for line in first} == {"started on", "to stderr\n"}
        assert follow.poll() is None
        stopped = slurm_client.vmrun("stop", rid, "-C", "bed")
        assert stopped.returncode == 0, stopped.stderr
        _, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode != 0 and "CANCELLED" in err, err
    wait_for(lambda: not job_pids(slurm_cluster), 30, "no process of the job left")
    assert status_rows(slurm_client)[rid][2] == "stopped"
    logs = slurm_client.vmrun("logs", rid, "-C", "bed")
    assert "started on" in logs.stdout and "to stderr" in logs.stdout


def test_dry_run_overrides_and_bad_input(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """--dry-run shows the sbatch command (a flag given to vmrun overrides the script; the
    cluster's partition only where the script is silent); a missing script, one with no #!,
    and sbatch's own refusal each get one line and exit 2, and nothing is submitted."""
    use_cluster(slurm_cluster, slurm_client, host_python)
    dry = slurm_client.vmrun(
        "submit", "waits.sh", "-C", "bed", "--time", "7", "--dry-run", "--", "a b"
    )
    assert dry.returncode == 0, dry.stderr
    assert "sbatch --parsable --time=7 --partition=debug ./waits.sh 'a b'" in dry.stdout
    assert "logs/%x-%j.out" in dry.stdout
    (slurm_client.cwd / "own.sh").write_text("#!/bin/bash\n#SBATCH --partition=one\necho\n")
    dry = slurm_client.vmrun("submit", "own.sh", "-C", "bed", "--dry-run")
    assert "sbatch --parsable ./own.sh" in dry.stdout, dry.stdout
    missing = slurm_client.vmrun("submit", "nosuch.sh", "-C", "bed")
    assert missing.returncode == 2 and error_in(missing.stderr)[0] == "script-not-found"
    (slurm_client.cwd / "plain.sh").write_text("echo hi\n")
    plain = slurm_client.vmrun("submit", "plain.sh", "-C", "bed")
    assert plain.returncode == 2 and error_in(plain.stderr)[0] == "script-no-interpreter"
    refused = slurm_client.vmrun("submit", "waits.sh", "-C", "bed", "--partition", "nosuch")
    assert refused.returncode == 2 and error_in(refused.stderr)[0] == "job-refused"
    assert "invalid partition" in refused.stderr.lower(), refused.stderr
    assert slurm_cluster.squeue_ids() == []
    runs = Path(slurm_cluster.login.home) / ".vmrun" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []
