"""`vmrun sweep`: real runs at each size (this machine, and two test hosts), the record, the
report and plot it leaves, Ctrl-C in the middle and `--resume`."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, error_in, wait_for
from results_fixtures import line_colours
from train_helpers import Gate, pids_with_env

from vmrun.results.plotting import COLOURS
from vmrun.runs.launch_spec import Budget, LaunchSpec

TWO_CORES = {"OMP_NUM_THREADS": "1"}


def _sweep_dir(client: Client) -> Path:
    found = sorted((client.cwd / "results").glob("sweep-*"))
    assert len(found) == 1, found
    return found[0]


def _record(client: Client) -> dict:
    return json.loads((_sweep_dir(client) / "sweep.json").read_text())


def _record_so_far(client: Client) -> dict:
    """The sweep's record once written (its folder comes first): {} before."""
    found = sorted((client.cwd / "results").glob("sweep-*/sweep.json"))
    return json.loads(found[0].read_text()) if found else {}


def _world_sizes(client: Client, run: str) -> set[int]:
    metrics = list((client.cwd / "results" / run).rglob("metrics.jsonl"))
    assert len(metrics) == 1, metrics
    return {json.loads(line)["world_size"] for line in metrics[0].read_text().splitlines()}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nodes", "0"], "--nodes '0': give whole numbers >= 1"),
        (["--local", "--nodes", "1,2"], "--local runs on this machine alone"),
        (["--resume", "sweep-19990101-000000-abcd"], "no sweep sweep-19990101-000000-abcd here"),
        (["--resume", "x"], "give a sweep id"),
        (["--partition", "p"], "--partition: Slurm options; name the cluster with -C NAME"),
        (["--nodes", "3", "-H", "a@h1", "-H", "b@h2"], "up to 3 nodes but 2 host(s) are given"),
        (["--local", "-H", "a@h1"], "--local sweeps on this machine; drop -H or --local"),
        (["-H", "a@h1", "--detach"], "--detach queues a sweep on a cluster (-C NAME)"),
    ],
)
def test_bad_input_is_one_line_and_starts_nothing(
    client: Client, args: list[str], needle: str
) -> None:
    done = client.vmrun("sweep", *args)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (client.cwd / "results").exists()


def test_a_local_sweep_runs_each_size_and_records_it(client: Client) -> None:
    done = client.vmrun(
        "sweep", "--local", "--nproc-per-node", "2,1", "--epochs", "2", env=TWO_CORES, timeout=300
    )
    assert done.returncode == 0, done.stderr
    record = _record(client)
    assert [(s["nodes"], s["nproc"], s["state"]) for s in record["sizes"]] == [
        (1, 1, "done"),
        (1, 2, "done"),
    ]
    runs = [s["run"] for s in record["sizes"]]
    assert runs[0].startswith("template-1x1-") and runs[1].startswith("template-1x2-")
    assert [_world_sizes(client, run) for run in runs] == [{1}, {2}]
    assert record["options"]["epochs"] == 2
    # the scaling report and the plot of those runs, beside the record
    folder = _sweep_dir(client)
    rows = json.loads((folder / "report.json").read_text())
    assert (rows[0]["run"], rows[0]["world_size"], rows[0]["speedup"]) == (runs[0], 1, 1.0)
    assert [r["world_size"] for r in rows] == [1, 2]
    assert f"| {runs[1]} |" in (folder / "report.md").read_text()
    assert line_colours(folder / "loss.png", COLOURS) == list(COLOURS[:2])
    assert runs[1] in done.stdout  # the table is printed too


def test_a_list_of_batch_sizes_is_an_axis_named_in_runs_report_and_plot(client: Client) -> None:
    """--batch-size 8,16 on this machine (--cpus-per-task is Slurm's: -C only): a run per
    value, each named by it; the report has a BATCH column, the plot's legend says it; the
    sweep's end is told once, with its table (its sizes' runs are not told one by one)."""
    from test_notify import Receiver

    receiver = Receiver()
    try:
        done = client.vmrun(
            "sweep",
            "--local",
            "--batch-size",
            "16,8",
            "--epochs",
            "1",
            "--notify",
            receiver.url("127.0.0.1"),
            env=TWO_CORES,
            timeout=300,
        )
        messages = receiver.messages()
    finally:
        receiver.close()
    assert done.returncode == 0, done.stderr
    sizes = _record(client)["sizes"]
    assert [(s["values"], s["state"]) for s in sizes] == [
        ({"batch_size": 8}, "done"),
        ({"batch_size": 16}, "done"),
    ]
    runs = [s["run"] for s in sizes]
    assert runs[0].startswith("template-1x1-batch8-")
    assert runs[1].startswith("template-1x1-batch16-")
    for run, batch in zip(runs, ("8", "16"), strict=True):  # the run really trained with it
        record = json.loads((client.cwd / "results" / run / "run.json").read_text())
        assert record["args"][record["args"].index("--batch-size") + 1] == batch
    folder = _sweep_dir(client)
    rows = json.loads((folder / "report.json").read_text())
    assert [r["varied"] for r in rows] == [{"batch": "8"}, {"batch": "16"}]
    table = (folder / "report.md").read_text().splitlines()
    assert table[0].startswith("| RUN | BATCH | NODES |") and f"| {runs[1]} | 16 |" in table[3]
    assert line_colours(folder / "loss.png", COLOURS) == list(COLOURS[:2])
    assert "1 node x 1 process, batch=16" in done.stderr
    (message,) = messages
    assert message["title"] == f"vmrun: sweep {folder.name} done"
    assert f"| {runs[1]} | 16 |" in message["message"]


def test_ctrl_c_stops_the_size_in_progress_and_resume_runs_what_is_left(
    client: Client, gate: Gate
) -> None:
    """The second size (2 ranks) holds after its first epoch (a trainer hook) until Ctrl-C;
    the first runs through."""
    proc = client.popen(
        "sweep",
        "--local",
        "--nproc-per-node",
        "1,2",
        "--epochs",
        "4",
        *gate.options(1, GATE_WORLD="2"),
        env=TWO_CORES,
    )
    try:
        record = wait_for(
            lambda: (
                any(
                    s.get("run") and s["nproc"] == 2
                    for s in _record_so_far(client).get("sizes", [])
                )
                and _record(client)
            ),
            240,
            "the sweep's second size to start",
        )
        first, second = (s["run"] for s in record["sizes"])  # type: ignore[index]
        metrics = client.cwd / "results" / second / "metrics.jsonl"
        wait_for(metrics.exists, 120, "the second size's first epoch")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    sweep_id = _sweep_dir(client).name
    assert f"continue with `vmrun sweep --resume {sweep_id}`" in err
    assert not pids_with_env(f"VMRUN_RUN_ID={second}"), "a process of the stopped size is left"
    states = [s["state"] for s in _record(client)["sizes"]]
    assert states == ["done", "stopped"]

    refused = client.vmrun("sweep", "--resume", sweep_id)
    assert refused.returncode == 2
    code, said = error_in(refused.stderr)
    assert code == "env-value-missing" and "VMRUN_TEST_HOOK_GATE_WORLD" in said, refused.stderr
    gate.open()
    again = client.vmrun(
        "sweep", "--resume", sweep_id, *gate.options(1, GATE_WORLD="2"), env=TWO_CORES, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert "size 1/2" not in again.stderr and "size 2/2" in again.stderr
    sizes = _record(client)["sizes"]
    assert [s["state"] for s in sizes] == ["done", "done"]
    assert sizes[0]["run"] == first and sizes[1]["run"] != second
    assert _world_sizes(client, sizes[1]["run"]) == {2}


def test_resume_of_a_complete_sweep_and_with_new_options_is_refused(client: Client) -> None:
    done = client.vmrun("sweep", "--local", "--epochs", "1", env=TWO_CORES, timeout=300)
    assert done.returncode == 0, done.stderr
    sweep_id = _sweep_dir(client).name
    again = client.vmrun("sweep", "--resume", sweep_id)
    code, said = error_in(again.stderr)
    assert again.returncode == 2 and code == "sweep-complete" and sweep_id in said
    other = client.vmrun("sweep", "--resume", sweep_id, "--epochs", "3")
    code, said = error_in(other.stderr)
    assert other.returncode == 2 and code == "resume-conflict" and "--epochs" in said, other.stderr


def test_a_sweep_on_two_hosts_fetches_every_run(multi: Client) -> None:
    done = multi.vmrun(
        "sweep", "--nodes", "1,2", "--nproc-per-node", "1", "--epochs", "2", timeout=600
    )
    assert done.returncode == 0, done.stderr
    sizes = _record(multi)["sizes"]
    assert [(s["nodes"], s["state"]) for s in sizes] == [(1, "done"), (2, "done")]
    assert [_world_sizes(multi, s["run"]) for s in sizes] == [{1}, {2}]
    assert _record(multi)["where"] == {"hosts": None}


def test_a_sweep_on_a_slurm_cluster_submits_each_size_and_fetches_it(
    slurm_client: Client, host_python: Path
) -> None:
    (slurm_client.cwd / "vmrun.toml").write_text(
        f'[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'python = "{host_python}"\nenv = {{ OMP_NUM_THREADS = "1" }}\n'
    )
    done = slurm_client.vmrun(
        "sweep",
        "-C",
        "bed",
        "--nodes",
        "1,2",
        "--nproc-per-node",
        "1",
        "--epochs",
        "2",
        "--time",
        "0:05:00",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    record = _record(slurm_client)
    assert record["where"] == {"cluster": "bed"}
    assert record["options"]["slurm"] == {"time": "0:05:00"}  # what --resume asks Slurm again
    sizes = record["sizes"]
    assert [(s["nodes"], s["state"]) for s in sizes] == [(1, "done"), (2, "done")]
    assert [_world_sizes(slurm_client, s["run"]) for s in sizes] == [{1}, {2}]


def test_a_sweeps_cap_on_a_slurm_cluster_is_split_between_the_sizes_it_queues(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, trainer_hooks: Path
) -> None:
    """Every size is queued at once on a cluster: `--max-cost 8` at 3600 a node an hour
    gives each of the 2 sizes 4 (seconds, here) as its own cap; each job saves and stops."""
    (slurm_client.cwd / "vmrun.toml").write_text(
        f'[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\nprice = 3600\n'
        f'python = "{host_python}"\nenv = {{ OMP_NUM_THREADS = "1", PYTHONPATH = "{trainer_hooks}",'
        f' VMRUN_TEST_HOOK_EPOCH_DELAY = "0.5" }}\n'
    )
    done = slurm_client.vmrun(
        "sweep",
        "-C",
        "bed",
        "--nproc-per-node",
        "1,2",
        "--epochs",
        "100",
        "--max-cost",
        "8",
        "--time",
        "0:05:00",
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    assert "each of 2 size(s) may cost 4.00 of its --max-cost 8" in done.stderr, done.stderr
    sizes = _record(slurm_client)["sizes"]
    assert [s["state"] for s in sizes] == ["failed", "failed"], sizes
    for size in sizes:
        assert "--max-cost $4.00" in size["detail"], size
        job = slurm_cluster.login.home / ".vmrun" / "runs" / size["run"] / "job.sh"
        assert _launch_spec(job.read_text()).watchers.budget == Budget(4.0, "$4.00")


def _launch_spec(script: str) -> LaunchSpec:
    """A batch script's launch spec, as bash reads its variables."""
    header = script.split("\n# shellcheck shell=bash", 1)[0]
    shown = subprocess.run(
        ["bash", "-c", header + '\nprintf "%s" "$VMRUN_LAUNCH"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return LaunchSpec.from_json(shown.stdout)


def test_a_cpus_per_task_axis_on_a_slurm_cluster_asks_sbatch_for_each(
    slurm_cluster: Any, slurm_client: Client, host_python: Path
) -> None:
    """The tutorial's `--cpus-per-task 1,2`: a job per value, each asking sbatch for it."""
    (slurm_client.cwd / "vmrun.toml").write_text(
        f'[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'python = "{host_python}"\nenv = {{ OMP_NUM_THREADS = "1" }}\n'
    )
    done = slurm_client.vmrun(
        "sweep",
        "-C",
        "bed",
        "--cpus-per-task",
        "1,2",
        "--epochs",
        "1",
        "--time",
        "0:05:00",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    sizes = _record(slurm_client)["sizes"]
    assert [(s["values"], s["state"]) for s in sizes] == [
        ({"cpus_per_task": 1}, "done"),
        ({"cpus_per_task": 2}, "done"),
    ]
    for size, cpus in zip(sizes, (1, 2), strict=True):
        assert size["run"].startswith(f"template-1x1-cpus{cpus}-")
        job = slurm_cluster.login.home / ".vmrun" / "runs" / size["run"] / "job.sh"
        assert f"--cpus-per-task={cpus}" in job.read_text()
    rows = json.loads((_sweep_dir(slurm_client) / "report.json").read_text())
    assert [r["varied"] for r in rows] == [{"cpus": "1"}, {"cpus": "2"}]
