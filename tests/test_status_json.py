"""`vmrun status --json`'s objects, from the records status gathers (vmrun.backends.hosts.records'
RunRecord per host, vmrun.backends.slurm.records' SlurmRun per cluster run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vmrun.backends.hosts.records import RunRecord
from vmrun.backends.slurm.records import SlurmRun
from vmrun.operations.status_runs import run_objects
from vmrun.results.record import RunRecord as Record

T0 = 1_700_000_000.0
KEYS = [
    "run",
    "hosts",
    "cluster",
    "bucket",
    "state",
    "reason",
    "attempts",
    "launcher",
    "image",
    "nodes",
    "procs_per_node",
    "world_size",
    "epochs_done",
    "epochs_asked",
    "start",
    "duration_s",
    "exit",
    "error",
    "failure",
    "tasks",
    "commit",
    "dirty",
    "versions",
    "store",
    "recoveries",
    "cost",
    "hung",
    "slow_ranks",
    "record",
]


def render(records: list[Any], failures: list[dict[str, Any]] | None = None) -> str:
    """As `vmrun status --json` writes them."""
    return json.dumps([*run_objects(records), *(failures or [])])


def _with(record: Record, **keys: Any) -> Record:
    """The record as if its run.json had these keys too."""
    return Record.from_json({**record.to_json(), **keys})


def _host(rid: str, host: str, code: int | None, progress: str = "") -> RunRecord:
    meta = {
        "id": rid,
        "started": T0,
        "template": True,
        "args": ["10", "5"],
        "launcher": "torchrun",
        "nproc": "2",
        "nodes": ["n1", "n2"],
        "host": host,
    }
    return RunRecord(
        rid,
        host,
        record=Record.from_json(meta),
        exit_code=code,
        progress=progress,
        began=T0,
        ended=T0 + (90 if host == "n1" else 91),
    )


def test_a_run_on_two_hosts_is_one_object() -> None:
    (obj,) = run_objects([_host("r1", "n1", 0, "epoch 10/10"), _host("r1", "n2", 1, "")])
    assert list(obj) == KEYS
    record = obj["record"]  # run.json's typed fields (vmrun.results.record), the first node's
    assert (record["where"], record["hosts"], record["host"]) == ("hosts", ["n1", "n2"], "n1")
    assert record["launch"]["nproc"] == "2" and record["launch"]["args"] == ["10", "5"]
    assert obj["hosts"] == ["n1", "n2"] and obj["cluster"] is None
    assert (obj["state"], obj["exit"]) == ("failed", 1)  # one node failed: the run did
    assert (obj["nodes"], obj["procs_per_node"], obj["world_size"]) == (2, 2, 4)
    assert (obj["epochs_done"], obj["epochs_asked"]) == (10, 10)
    assert obj["start"] == "2023-11-14T22:13:20+00:00" and obj["duration_s"] == 91.0
    assert obj["launcher"] == "torchrun" and obj["attempts"] == 1
    assert obj["error"] == {
        "code": "run-failed",
        "message": "run r1 exited with 1",
        "exit_status": 1,
    }


def test_a_slurm_run_and_json_text() -> None:
    meta = {
        "run_id": "s1",
        "cluster": "bed",
        "launcher": "env",
        "template": False,
        "epochs": None,
        "nodes": 2,
        "nproc_per_node": 2,
        "world_size": 4,
        "submitted": T0,
    }
    run = SlurmRun(
        "s1",
        "bed",
        Record.from_json(meta),
        starts=[["1", str(int(T0))], ["2", str(int(T0) + 60)]],
        exits=[["1", "requeue", str(int(T0) + 50)], ["2", "0", str(int(T0) + 120)]],
        last_metrics={"epoch": 3},
    )
    data = json.loads(render([run]))
    assert [list(d) for d in data] == [KEYS]
    obj = data[0]
    assert obj["hosts"] is None and obj["cluster"] == "bed"
    assert (obj["state"], obj["exit"], obj["attempts"]) == ("done", 0, 2)
    assert (obj["nodes"], obj["procs_per_node"], obj["world_size"]) == (2, 2, 4)
    assert (obj["epochs_done"], obj["epochs_asked"]) == (3, None)
    assert obj["duration_s"] == 120.0 and obj["reason"] is None and obj["error"] is None
    assert render([]) == "[]"


def test_a_stopped_or_lost_run_has_its_code() -> None:
    stopped = run_objects([RunRecord("r2", "n1", Record.from_json({"id": "r2"}), stopped=True)])
    lost = run_objects(
        [RunRecord("r3", "n1", Record.from_json({"id": "r3"}), began=T0, ended=None)]
    )
    assert [stopped[0]["state"], stopped[0]["error"]["code"]] == ["stopped", "run-stopped"]
    assert stopped[0]["error"]["exit_status"] == 143
    assert [lost[0]["state"], lost[0]["error"]["code"]] == ["lost", "run-failed"]


def test_a_run_its_supervisor_is_bringing_back_says_so_not_stopped() -> None:
    """Between a failure and the next attempt the nodes' records say `recovering`
    (run_note.sh): the table's state and --json's recoveries.under_way tell it."""
    from vmrun.cli.status_cmd import _state

    under_way = "1 of 5: h2 stopped answering, then answered again: again on the same nodes"
    halted = RunRecord(
        "r4",
        "n1",
        Record.from_json({"id": "r4"}),
        exit_code=143,
        stopped=True,
        stopped_by="failure",
        recovering=under_way,
    )
    assert _state(halted) == "recovering, 1 of 5"
    (obj,) = run_objects([halted])
    assert obj["recoveries"] == {"count": 0, "last": None, "gave_up": False, "under_way": under_way}
    halted.alive = True  # the next attempt runs: no longer said
    halted.exit_code = None
    assert _state(halted) == "running"
    done = RunRecord(
        "r5",
        "n1",
        Record.from_json({"id": "r5"}),
        exit_code=0,
        recoveries=1,
        recovery="recovery 1 of 5: ...",
    )
    assert _state(done) == "done, recovered 1x"
    assert run_objects([done])[0]["recoveries"]["under_way"] is None


def test_a_place_that_did_not_answer_is_an_object_with_its_error() -> None:
    from vmrun.errors import UnreachableError
    from vmrun.operations.status_runs import KEYS as KEPT
    from vmrun.operations.status_runs import place_object

    obj = place_object(UnreachableError("connection refused", host="h9"), host="h9")
    assert list(obj) == KEYS == list(KEPT)
    assert (obj["run"], obj["hosts"], obj["cluster"]) == (None, ["h9"], None)
    assert obj["error"]["code"] == "host-unreachable" and obj["error"]["exit_status"] == 12
    assert "h9" in obj["error"]["message"]
    data = json.loads(render([_host("r1", "n1", 0)], [obj]))
    assert [d["run"] for d in data] == ["r1", None]


def test_status_json_names_an_unreachable_host_by_its_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on port 1 here: the host is refused at once, and stdout's JSON says
    so (with the code stderr prints), so a script needs no stderr to see the failure."""
    from conftest import error_in

    from vmrun.cli.main import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert run(["status", "--json", "-H", "u@127.0.0.1:1"]) == 12
    out, err = capsys.readouterr()
    (obj,) = json.loads(out)
    assert obj["run"] is None and obj["hosts"] == ["u@127.0.0.1:1"]
    assert obj["error"]["code"] == error_in(err)[0] == "host-unreachable"
    assert obj["error"]["exit_status"] == 12


def test_the_commit_and_main_versions_come_from_the_record_and_versions_json() -> None:
    """What a script groups runs by: run.json's code facts and the node's versions.json
    line (the second node's, where the first has none yet)."""
    a, b = _host("r1", "n1", 0), _host("r1", "n2", 0)
    a.record = _with(a.record, code={"commit": "c0ffee" * 6 + "beef", "dirty": True})
    b.versions = {"python": "3.11.2", "torch": "2.13.0", "cuda": None}
    (obj,) = run_objects([a, b])
    assert obj["commit"] == "c0ffee" * 6 + "beef" and obj["dirty"] is True
    assert obj["versions"]["torch"] == "2.13.0"
    (old,) = run_objects([_host("r0", "n1", 0)])  # an older run: unknown, not wrong
    assert old["commit"] is None and old["versions"] is None


def test_gather_refuses_a_negative_last_and_two_places_before_any_connection(
    tmp_path: Path,
) -> None:
    from vmrun.config import load_settings
    from vmrun.errors import UsageError
    from vmrun.operations.status import gather

    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    with pytest.raises(UsageError, match="--last must be >= 0"):
        gather(settings, hosts=["nowhere"], last=-1)
    with pytest.raises(UsageError, match="use one"):
        gather(settings, hosts=["nowhere"], cluster="hpc")


def test_a_runs_cost_so_far_is_its_time_at_the_prices_it_started_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """run.json's prices (recorded as the run started): the whole run's time, on the
    master's row of the table; a run whose prices are unknown costs null, never 0."""
    from vmrun.cli.status_cmd import _render, _rows

    a, b = _host("r1", "n1", 0), _host("r1", "n2", 0)
    for rec in (a, b):
        rec.record = _with(
            rec.record,
            master="n1",
            prices={"n1": 30.0, "n2": 30.0},
            price_per_hour=60.0,
            currency="DKK",
        )
    (obj,) = run_objects([a, b])
    assert obj["cost"] == {"amount": 1.52, "currency": "DKK", "per_hour": 60.0}  # 91 s
    assert run_objects([_host("r0", "n1", 0)])[0]["cost"] is None
    _render(_rows([a, b], {}, costs=True), costs=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "COST"
    assert lines[1].endswith("1.50 DKK") and lines[2].endswith("-"), lines  # 90 s on n1
    for rec in (a, b):  # a resumed attempt: the earlier ones' 3600 s count, not the gap
        rec.record = _with(rec.record, ran_before_s=3600)
    (obj,) = run_objects([a, b])
    assert obj["cost"]["amount"] == 61.52 and obj["duration_s"] == 91.0  # this attempt's


def test_a_hung_run_and_its_slow_ranks_are_in_its_object() -> None:
    """What the table says in STATE (hung) and PROGRESS (slow ranks), the JSON says too:
    on hosts from REC/hang and metrics.jsonl, on a cluster from its last metrics line."""
    from vmrun.backends.hosts.records import _read_metrics

    run = _host("r1", "n1", None, "epoch 3/10")
    run.alive = True
    run.hung = {"since": T0, "host": "n1", "action": "wait"}
    _read_metrics(
        run, json.dumps({"epoch": 3, "rank_step_s": [0.1, 0.1, 0.3], "rank_node": [0, 0, 1]})
    )
    (obj,) = run_objects([run])
    assert obj["hung"] == {"since": T0, "host": "n1", "action": "wait"}
    assert obj["slow_ranks"] == [
        {"rank": 2, "node": 1, "step_s": 0.3, "typical_s": 0.1, "ratio": 3.0}
    ]
    assert run.slow == "rank 2 (node 1) slow: 3.0x"  # the table's words, from the same rule
    meta = {"run_id": "s1", "cluster": "bed", "nodes": 1, "submitted": T0}
    slurm = SlurmRun(
        "s1",
        "bed",
        Record.from_json(meta),
        last_metrics={"epoch": 1, "rank_step_s": [0.5, 0.1, 0.1]},
    )
    (sobj,) = run_objects([slurm])
    assert [s["rank"] for s in sobj["slow_ranks"]] == [0] and sobj["hung"] is None
    assert slurm.slow == "rank 0 slow: 5.0x"
    (calm,) = run_objects([_host("r2", "n1", 0, "epoch 10/10")])
    assert calm["hung"] is None and calm["slow_ranks"] is None


def test_a_cluster_runs_hang_is_read_from_its_listing() -> None:
    """slurm_runs.sh lists REC/hang as it lists REC/budget: the run's `hung`, and the
    table's STATE says it as for a run on hosts."""
    from vmrun.backends.slurm.records import parse_listing
    from vmrun.cli.status_cmd import _state

    meta = {"run_id": "h1", "cluster": "bed", "nodes": 1, "submitted": T0}
    hang = {"since": T0, "host": "c1", "ranks": [0], "action": "stop"}
    listing = "\n".join(
        [
            "==> squeue <==",
            "==> h1/run.json <==",
            json.dumps(meta),
            "==> h1/hang <==",
            json.dumps(hang),
            "==> sacct <==",
        ]
    )
    (run,) = parse_listing(listing, "bed")
    assert run.hung == hang
    (obj,) = run_objects([run])
    assert obj["hung"] == hang
    assert _state(run).endswith(", hung (stopped)")
