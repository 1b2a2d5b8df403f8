"""A run's record (vmrun.results.record): every older form of run.json reads into the same
typed values, the current schema round-trips, nothing a newer vmrun wrote is lost, and what
the scripts on a run's host read from run.json stays where they look."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from results_fixtures import T0, epochs, hosts_run, local_run, slurm_run

from vmrun.results.layout import layout_of
from vmrun.results.record import (
    CLUSTER,
    HOSTS,
    LOCAL,
    SCHEMA,
    Image,
    Job,
    Launch,
    LocalEnd,
    Policy,
    Prices,
    RunRecord,
    schema,
)


def _read(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "run.json").read_text())


def _forms(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """run.json as each place wrote it before the schema (the writers' own fields)."""
    results = tmp_path / "results"
    return {
        HOSTS: _read(hosts_run(results, "h-1", epochs(3), ["n1", "n2"]) / "n1"),
        CLUSTER: _read(slurm_run(results, "s-1", epochs(4), nodes=2, per_node=2)),
        LOCAL: _read(local_run(results, "l-1", epochs(3), nproc="2", epochs_asked=3)),
    }


def test_each_older_form_reads_into_the_same_typed_shape(tmp_path: Path) -> None:
    forms = _forms(tmp_path)
    hosts, cluster, local = (RunRecord.from_json(forms[w]) for w in (HOSTS, CLUSTER, LOCAL))
    assert {r.schema for r in (hosts, cluster, local)} == {1}  # none said its schema
    assert (hosts.where, hosts.run_id, hosts.hosts, hosts.master, hosts.host) == (
        HOSTS,
        "h-1",
        ("n1", "n2"),
        "n1",
        "n1",
    )
    assert (cluster.where, cluster.run_id, cluster.cluster) == (CLUSTER, "s-1", "bed")
    assert cluster.job is not None and cluster.job.submitted == T0 - 30
    assert (local.where, local.run_id, local.local) == (
        LOCAL,
        "l-1",
        LocalEnd(
            status="finished",
            cwd=str(tmp_path),
            run_dir=str(tmp_path / "results" / "l-1"),
            pid=1,
            start_time="2023-11-14T22:13:20+00:00",
            end_time="2023-11-14T22:14:05+00:00",
            exit_code=0,
        ),
    )
    shapes = {w: layout_of(r) for w, r in ((HOSTS, hosts), (CLUSTER, cluster), (LOCAL, local))}
    assert [
        (s.where, s.hosts, s.cluster, s.nodes, s.procs_per_node, s.world_size, s.epochs_asked)
        for s in shapes.values()
    ] == [
        (HOSTS, ("n1", "n2"), None, 2, 2, 4, 3),
        (CLUSTER, (), "bed", 2, 2, 4, 4),
        (LOCAL, (), None, 1, 2, 2, 3),
    ]
    assert {s.launcher for s in shapes.values()} == {"torchrun"}
    assert hosts.launch.template and cluster.launch.template and local.launch.template
    assert hosts.started == T0 and local.started is None


def test_older_variants_the_readers_tolerated(tmp_path: Path) -> None:
    """A single-host record without `nodes`; a --local record without `args` (its epochs
    in argv); a Slurm record without `where` or `cluster` (its job's fields say it)."""
    single = RunRecord.from_json({"id": "o-1", "host": "h1", "nnodes": "1", "nproc": "4"})
    assert (single.where, single.hosts, layout_of(single).world_size) == (HOSTS, ("h1",), 4)
    older = RunRecord.from_json(
        {
            "template": True,
            "script": "/t/template.py",
            "argv": ["python", "/t/template.py", "7", "5"],
            "start_time": "2023-11-14T22:13:20+00:00",
        }
    )
    assert (older.where, older.launch.args, older.epochs_asked) == (LOCAL, None, 7)
    job = RunRecord.from_json({"record_dir": "r", "job_id": "7", "submitted": 0})
    assert job.where == CLUSTER and job.job == Job(record_dir="r", job_id="7", submitted=0.0)
    script = RunRecord.from_json({"template": False})
    assert script.template is False and script.epochs_asked is None
    assert RunRecord.from_json({}).template  # a record that does not say: the template's


def test_a_field_of_the_wrong_type_is_unknown_not_an_error() -> None:
    record = RunRecord.from_json(
        {
            "nodes": ["a"],
            "args": "3",
            "nproc": ["2"],
            "max_restarts": "x",
            "price_per_hour": "cheap",
            "code": [1],
            "variables": 3,
            "started": True,
        }
    )
    assert record.launch.args is None and record.launch.nproc is None
    assert record.launch.max_restarts is None and record.prices is None
    assert record.code is None and record.launch.variables is None and record.started is None
    for nothing in (None, [], "x", {}):
        assert not RunRecord.from_json(nothing) and RunRecord.from_json(nothing).where == ""


def test_code_prices_policies_and_image_read_as_written() -> None:
    code = {"commit": "c0ffee", "dirty": True, "files": 3}
    record = RunRecord.from_json(
        {
            "nodes": ["n1", "n2"],
            "host": "n2",
            "code": code,
            "code_earlier": [{**code, "attempt": 1}, "junk"],
            "prices": {"n1": 0.5, "n2": 0.25},
            "price_per_hour": 0.75,
            "currency": "DKK",
            "ran_before_s": 120.5,
            "recover": True,
            "hang_timeout": 300,
            "on_hang": "stop",
            "max_cost": 8,
            "store": "s3://b/runs/r",
            "store_node": "n1",
            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "mounts": ["/data:/data"],
            "container_runtime": "docker",
            "container_ulimits": ["memlock=-1"],
            "pull": "missing",
            "image_digest": "sha256:ab",
            "image_id": None,
        }
    )
    assert record.code == code and record.code_earlier == ({**code, "attempt": 1},)
    assert record.prices == Prices({"n1": 0.5, "n2": 0.25}, 0.75, "DKK")
    assert (record.price_per_hour, record.currency, record.ran_before_s) == (0.75, "DKK", 120.5)
    assert record.policy == Policy(recover=True, hang_timeout=300, on_hang="stop", max_cost=8.0)
    assert (record.store, record.store_node) == ("s3://b/runs/r", "n1")
    assert record.launch.image == Image(
        "nvcr.io/nvidia/pytorch:24.05-py3",
        ("/data:/data",),
        "docker",
        ("memlock=-1",),
        "missing",
        "sha256:ab",
        None,
        resolved=True,
    )
    assert record.image == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert str(record.launch.image.request().mounts[0]) == "/data:/data"


def test_writing_keeps_every_key_each_older_form_had(tmp_path: Path) -> None:
    """The current schema is each place's keys, as it named them, with `schema` and
    `where` beside them: readers of any vmrun (and the host's scripts) find what they did."""
    for where, raw in _forms(tmp_path).items():
        written = RunRecord.from_json(raw).to_json()
        assert (written["schema"], written["where"]) == (SCHEMA, where)
        kept = {k: written.get(k, "<missing>") for k in raw}
        assert kept == raw, where


def test_round_trip_and_unknown_keys_kept(tmp_path: Path) -> None:
    for raw in _forms(tmp_path).values():
        record = RunRecord.from_json({**raw, "from_the_future": {"x": [1, 2]}})
        assert record.extra == {"from_the_future": {"x": [1, 2]}}
        written = record.to_json()
        assert written["from_the_future"] == {"x": [1, 2]}
        again = RunRecord.from_json(json.loads(json.dumps(written)))
        assert again == replace(record, schema=SCHEMA)
        assert again.to_json() == written


def test_the_writers_records_round_trip() -> None:
    """Records as the three writers build them (every group filled) read back equal."""
    made = [
        RunRecord(
            run_id="h-1",
            where=HOSTS,
            hosts=("n1", "n2"),
            master="n1",
            host="n2",
            launch=Launch(
                name="t",
                template=True,
                launcher="env",
                script="template.py",
                args=("3",),
                argv=("python3", "template.py", "3"),
                python="/usr/bin/python3",
                workdir="vmrun/p-1",
                out_dir="vmrun/p-1/results/h-1",
                nproc_requested="gpu",
                nproc="gpu",
                nnodes="1:2",
                rdzv="10.0.0.1:29400",
                ifname="eth0",
                env_keys=("TOKEN",),
                variables={"TOKEN": None, "NCCL_DEBUG": "WARN"},
                max_restarts=2,
                image=Image("a/b:1", runtime="podman", resolved=True, digest="sha256:1"),
                data=({"to": "data", "files": 2},),
            ),
            code={"commit": "c"},
            code_earlier=({"commit": "b", "attempt": 1},),
            store="s3://b/r",
            store_node="n1",
            policy=Policy(recover=True, hang_timeout=60, on_hang="wait", max_cost=3.0),
            prices=Prices({"n1": 1.0, "n2": 1.0}, 2.0),
            ran_before_s=33.3,
            started=T0,
        ),
        RunRecord(
            run_id="s-1",
            where=CLUSTER,
            cluster="bed",
            launch=Launch(launcher="sbatch", script="job.sh", args=(), out_dir="/w"),
            policy=Policy(recover=True, max_recoveries=3),
            job=Job(
                batch_script=True,
                sbatch=("--nodes=2", "./job.sh"),
                job_name="job",
                array="0-3",
                nodes=2,
                output="o-%j",
                work_dir="/w",
                submitted=T0,
                record_dir="/r",
                code_dir="/c",
            ),
        ),
        RunRecord(
            run_id="l-1",
            where=LOCAL,
            launch=Launch(launcher="python", script="/p/x.py", args=(), python="py", env_keys=()),
            local=LocalEnd(status="error", pid=3, error="OSError: no"),
        ),
    ]
    for record in made:
        assert RunRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


@pytest.mark.parametrize(
    "key", ["python", "out_dir", "ran_before_s", "price_per_hour", "currency", "metrics"]
)
def test_what_the_hosts_scripts_read_stays_at_the_top(key: str) -> None:
    """These keep their names at the top of run.json: the host scripts of older vmruns
    (run.json outlives them) read them by name (their slurm_runs.sh the metrics path)."""
    record = RunRecord(
        run_id="r",
        where=HOSTS,
        launch=Launch(python="/p/python", out_dir="/o"),
        prices=Prices({"n": 1.5}, 1.5, "EUR"),
        ran_before_s=60.0,
    )
    cluster = RunRecord(run_id="s", where=CLUSTER, job=Job(metrics="/o/metrics.jsonl"))
    written = {**record.to_json(), **cluster.to_json()}
    assert (
        written[key]
        == {
            "python": "/p/python",
            "out_dir": "/o",
            "ran_before_s": 60.0,
            "price_per_hour": 1.5,
            "currency": "EUR",
            "metrics": "/o/metrics.jsonl",
        }[key]
    )


# -- one reader of run.json ----------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
# a run.json read by key: `meta.get("nodes")`, `rec["args"]`, `ref.meta["record_dir"]`
DICT_READ = re.compile(r'\b(meta|record|rec|run_meta|info)(\.get\(|\[)"[a-z_]+"|\.meta(\.get\(|\[)')
# the reads of that shape that are not of run.json, each with what it reads
NOT_RUN_JSON = {
    "vmrun/backends/hosts/node_launch.py": "the host's setup record (HostEnv.record)",
    "vmrun/backends/hosts/preflight.py": "the host's setup record (HostEnv.record)",
    "vmrun/cli/options.py": "click's Context.meta",
    "vmrun/cli/submit_cmd.py": "click's Context.meta",
    "vmrun/cli/train_cmd.py": "click's Context.meta",
}


def _reads(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not DICT_READ.search(line):
            continue
        if rel in NOT_RUN_JSON and ("ctx.meta" in line or "record" in line):
            continue
        found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_run_json_is_read_by_key_only_in_the_record_module() -> None:
    """Every reader outside vmrun.results.record reads the record's typed fields: a new
    key, or an older form, is handled in one place. (hostside/ reads its own few keys:
    the host's Python may be old, and it has no vmrun to import.)"""
    own = ROOT / "vmrun" / "results" / "record.py"
    found = [
        read
        for path in sorted((ROOT / "vmrun").rglob("*.py"))
        if path != own and "hostside" not in path.parts
        for read in _reads(path)
    ]
    assert found == [], "\n".join(found)


# the host's scripts that read nothing of run.json: what they need comes with the launch
# spec (run_agent.py writes run.json from it, reads none), notify.json or their arguments
RECORD_BLIND = (
    "notify_send.py",
    "hang_watch.py",
    "run_agent.py",
    "budget_watch.py",
    "spot_watch.py",
    "store_copier.py",
    "stacks.py",
    "run_failure.py",
)
OPENS_RUN_JSON = re.compile(r"""["']run\.json["']""")


def test_the_hosts_watchers_and_sender_read_no_run_json() -> None:
    """notify_send.py, hang_watch.py and the agent's other parts name run.json only where
    the agent writes it: a read of it by key would be a second reader of the record."""
    found = []
    for name in RECORD_BLIND:
        path = ROOT / "vmrun" / "hostside" / name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if OPENS_RUN_JSON.search(code) and "write_file(" not in code:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_the_run_json_check_finds_a_read() -> None:
    read = 'with open(os.path.join(rec, "run.json")) as fh:'
    assert OPENS_RUN_JSON.search(read) and not OPENS_RUN_JSON.search("rec/run.json's keys")


def test_the_check_finds_a_dict_read() -> None:
    assert DICT_READ.search('x = meta.get("nodes")') and DICT_READ.search("ref.meta['a']")
    assert DICT_READ.search('rec["args"]') and not DICT_READ.search("ref.record.hosts")


def test_the_documented_schema_is_the_records() -> None:
    """docs/reports.md's table of the record's fields is the dataclasses' own, in order."""
    text = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
    section = text.split("## The run record", 1)[1]
    rows = [
        tuple(cell.strip().strip("`") for cell in line.strip().strip("|").split("|")[:2])
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    assert rows == schema()
