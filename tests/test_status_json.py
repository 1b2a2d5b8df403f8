"""`vmrun status --json`'s objects, from the records status gathers (vmrun.backends.hosts.records'
RunRecord per host, vmrun.backends.slurm.records' SlurmRun per cluster run)."""

from __future__ import annotations

import json

from vmrun.backends.hosts.records import RunRecord
from vmrun.backends.slurm.records import SlurmRun
from vmrun.cli.status_json import render, run_objects

T0 = 1_700_000_000.0
KEYS = [
    "run", "hosts", "cluster", "state", "reason", "attempts", "launcher", "nodes",
    "procs_per_node", "world_size", "epochs_done", "epochs_asked", "start", "duration_s", "exit",
]  # fmt: skip


def _host(rid: str, host: str, code: int | None, progress: str = "") -> RunRecord:
    meta = {"id": rid, "started": T0, "template": True, "args": ["10", "5"],
            "launcher": "torchrun", "nproc": "2", "nodes": ["n1", "n2"], "host": host}  # fmt: skip
    return RunRecord(rid, host, meta=meta, exit_code=code, progress=progress,
                     began=T0, ended=T0 + (90 if host == "n1" else 91))  # fmt: skip


def test_a_run_on_two_hosts_is_one_object() -> None:
    (obj,) = run_objects([_host("r1", "n1", 0, "epoch 10/10"), _host("r1", "n2", 1, "")])
    assert list(obj) == KEYS
    assert obj["hosts"] == ["n1", "n2"] and obj["cluster"] is None
    assert (obj["state"], obj["exit"]) == ("failed", 1)  # one node failed: the run did
    assert (obj["nodes"], obj["procs_per_node"], obj["world_size"]) == (2, 2, 4)
    assert (obj["epochs_done"], obj["epochs_asked"]) == (10, 10)
    assert obj["start"] == "2023-11-14T22:13:20+00:00" and obj["duration_s"] == 91.0
    assert obj["launcher"] == "torchrun" and obj["attempts"] == 1


def test_a_slurm_run_and_json_text() -> None:
    meta = {"run_id": "s1", "cluster": "bed", "launcher": "env", "template": False,
            "epochs": None, "nodes": 2, "nproc_per_node": 2, "world_size": 4,
            "submitted": T0}  # fmt: skip
    run = SlurmRun("s1", "bed", meta, starts=[["1", str(int(T0))], ["2", str(int(T0) + 60)]],
                   exits=[["1", "requeue", str(int(T0) + 50)], ["2", "0", str(int(T0) + 120)]],
                   last_metrics={"epoch": 3})  # fmt: skip
    data = json.loads(render([run]))
    assert [list(d) for d in data] == [KEYS]
    obj = data[0]
    assert obj["hosts"] is None and obj["cluster"] == "bed"
    assert (obj["state"], obj["exit"], obj["attempts"]) == ("done", 0, 2)
    assert (obj["nodes"], obj["procs_per_node"], obj["world_size"]) == (2, 2, 4)
    assert (obj["epochs_done"], obj["epochs_asked"]) == (3, None)
    assert obj["duration_s"] == 120.0 and obj["reason"] is None
    assert render([]) == "[]"
