"""`train` and `sweep` options as values: the refusal table (each rule reachable, each with
its code), the Slurm option group (declared once; `[[clusters]]` under the flags), and the
operations called as a library user would, with a Recorder."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import error_in
from results_fixtures import epochs, local_run

from vmrun.backends.slurm.options import FLAGS, SlurmOptions
from vmrun.errors import UsageError
from vmrun.operations import refusals
from vmrun.reporting import Recorder


def _value(flag: str) -> Any:
    return {"-C": "hpc", "-H": ["a@h1"], "--resume": "r-20260101-000000-abcd"}.get(flag, True)


@pytest.mark.parametrize("rule", refusals.RULES, ids=lambda r: f"{r.code}:{r.refuse[0]}")
def test_every_rule_is_the_first_to_refuse_its_own_flags(rule: refusals.Rule) -> None:
    """No rule is shadowed by one above it, and each has a registered code."""
    from vmrun.errors import CODES

    assert rule.code in CODES and CODES[rule.code].exit_code == 2
    flags = {rule.refuse[0]: _value(rule.refuse[0])}
    if rule.when:
        flags[rule.when] = _value(rule.when)
    for command in rule.commands:
        assert refusals.first_broken(command, flags) == (rule, [rule.refuse[0]]), command


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["train", "-p", "p", "--time", "1:00"], "needs-cluster", "--time and --partition"),
        (["train", "--max-requeues", "2"], "needs-cluster", "--max-requeues: Slurm options"),
        (
            ["train", "-C", "hpc", "--recover", "--spare", "s1"],
            "flags-conflict",
            "(capability: spares, which a Slurm cluster (-C) lacks)",
        ),
        (["train", "-C", "hpc", "-H", "a@h", "--fresh"], "flags-conflict", "-H and --fresh are"),
        (["train", "-C", "hpc", "--local"], "flags-conflict", "Slurm runs the job on -C hpc"),
        (["train", "--local", "-H", "a@h"], "flags-conflict", "drop -H or --local"),
        (["train", "--local", "--fresh"], "flags-conflict", "drop it with --local"),
        (["train", "--resume", "r-20260101-000000-abcd", "--fresh"], "flags-conflict", "use one"),
        (
            ["train", "--resume", "r-20260101-000000-abcd", "--epochs", "2", "--", "x"],
            "resume-conflict",
            "drop --epochs and -- SCRIPT_ARGS",
        ),
        (
            ["train", "--resume", "r-20260101-000000-abcd", "--launcher", "env"],
            "resume-conflict",
            "drop --launcher",
        ),
        (["train", "--fetch-every", "5", "--detach"], "flags-conflict", "--fetch-every needs"),
        (["train", "--local", "--nnodes", "2"], "flags-conflict", "--nnodes is for several hosts"),
        (["train", "--down-after-run", "--detach"], "flags-conflict", "needs --fetch-every"),
        (["sweep", "--gpus-per-node", "1,2"], "needs-cluster", "--gpus-per-node: Slurm"),
        (["sweep", "-C", "hpc", "-H", "a@h"], "flags-conflict", "-H is for runs on hosts"),
        (["sweep", "--local", "-H", "a@h"], "flags-conflict", "--local sweeps on this machine"),
        (
            ["sweep", "--resume", "sweep-1-a", "--nodes", "1,2", "-C", "hpc"],
            "resume-conflict",
            "drop --nodes and -C",
        ),
    ],
)
def test_the_cli_refuses_by_the_table_before_anything_starts(
    args: list[str], code: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from vmrun.cli.main import run

    assert run(args) == 2
    said = error_in(capsys.readouterr().err)
    assert said[0] == code and needle in said[1], said


def test_the_slurm_group_is_declared_once_for_both_commands() -> None:
    """The CLI's flags are SlurmOptions' fields, spelled as the refusal rules spell them."""
    from vmrun.cli.options import SLURM_GROUP

    assert list(SLURM_GROUP) == [f.name for f in dataclasses.fields(SlurmOptions)]
    for name, alias in SLURM_GROUP.items():
        assert alias.__metadata__[0].default == FLAGS[name]
    assert set(FLAGS.values()) <= {*refusals.SLURM_ONLY}


def _called(monkeypatch: pytest.MonkeyPatch, module: str, name: str) -> dict[str, Any]:
    import importlib

    seen: dict[str, Any] = {}

    def fake(*args: Any, **kwargs: Any) -> Any:
        seen.update(args=args, **kwargs)
        return 0 if name == "train" else type("Done", (), {"rows": [], "code": 0})()

    monkeypatch.setattr(importlib.import_module(module), name, fake)
    return seen


def test_the_flags_become_one_slurm_options_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    seen = _called(monkeypatch, "vmrun.operations.train", "train")
    flags = [
        "-C",
        "hpc",
        "--time",
        "1:00",
        "-p",
        "big",
        "--sbatch-arg",
        "--a",
        "--sbatch-arg",
        "--b",
        "--nodes",
        "2",
        "--max-requeues",
        "0",
    ]
    assert run(["train", *flags]) == 0
    assert seen["slurm"] == SlurmOptions(
        nodes=2, time="1:00", partition="big", sbatch_args=("--a", "--b"), max_requeues=0
    )
    assert seen["cluster"] == "hpc" and seen["dry_run"] is False
    seen = _called(monkeypatch, "vmrun.operations.sweep", "sweep")
    assert run(["sweep", "-C", "hpc", "--cpus-per-task", "1,2", "--mem", "4G"]) == 0
    assert seen["slurm"] == SlurmOptions(mem="4G")  # the grid's lists go to the Grid
    assert seen["args"][1].cpus_per_task == "1,2"


def test_the_cluster_config_is_under_the_flags(tmp_path: Path) -> None:
    from vmrun.backends.slurm.cluster import find_cluster
    from vmrun.config import load_settings

    (tmp_path / "vmrun.toml").write_text(
        '[[clusters]]\nname = "hpc"\nlogin = "me@login"\npartition = "gpu"\naccount = "lab"\n'
        'qos = "normal"\nsbatch_args = ["--exclusive"]\n'
    )
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    hpc = find_cluster(settings, "hpc")
    spec = SlurmOptions(partition="big", sbatch_args=("--requeue",)).job_spec(hpc, "2")
    assert (spec.partition, spec.account, spec.qos) == ("big", "lab", "normal")
    assert spec.sbatch_args == ("--exclusive", "--requeue")  # the flag's after: sbatch's last wins
    assert (spec.nodes, spec.nproc_per_node, spec.max_requeues) == (1, 2, 3)
    with pytest.raises(UsageError, match="on a cluster give a number"):
        SlurmOptions().job_spec(hpc, "gpu")


def test_a_recorded_sweeps_slurm_options_read_back() -> None:
    opts = SlurmOptions(time="1:00", sbatch_args=("--a",), cpus_per_task=2)
    assert SlurmOptions.from_record(opts.given()) == opts
    older = {"time": "1:00", "sbatch_arg": ["--a"], "dry_run": False}  # before the group
    assert SlurmOptions.from_record(older) == SlurmOptions(time="1:00", sbatch_args=("--a",))


def test_a_sweep_called_as_a_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A sweep of two sizes on this machine, each size's run stood in for: what it says goes
    to the Recorder, and it returns the report's rows and the files it wrote."""
    from vmrun.operations import sweep_run
    from vmrun.operations.sweep import Grid, sweep
    from vmrun.operations.train import RunOptions

    monkeypatch.chdir(tmp_path)

    def runner(job: Any) -> Any:
        def one(size: Any) -> None:
            size.run = f"template-{size.label}-20260101-000000-abcd"
            local_run(
                tmp_path / "results",
                size.run,
                epochs(2, world=size.nproc),
                nproc=str(size.nproc),
                epochs_asked=2,
            )

        return one

    monkeypatch.setattr(sweep_run, "_runner", runner)
    said = Recorder()
    done = sweep(RunOptions(epochs=2), Grid(nproc_per_node="2,1"), local=True, out=said)
    assert done.code == 0 and [s.label for s in done.sweep.sizes] == ["1x1", "1x2"]
    assert len(done.rows) == 2 and (tmp_path / done.sweep.folder / "report.md") in done.written
    assert any("size 2/2: 1 node x 2 processes" in line for line in said.lines), said.lines
    with pytest.raises(UsageError) as refused:
        sweep(RunOptions(), Grid(nodes="2"), local=True, out=said)
    assert "--nodes must be 1" in refused.value.message


def test_train_called_as_a_library_refuses_as_the_cli_does() -> None:
    from vmrun.operations.train import HostOptions, RunOptions, train

    with pytest.raises(UsageError) as refused:
        train(RunOptions(), local=True, hosts=HostOptions(hosts=["a@h"]), out=Recorder())
    assert refused.value.code == "flags-conflict"
