"""The control logic of hangs, stacks and slow ranks, driven with made-up inputs: where a
rank is read from py-spy's JSON, ranks in one place grouped, the slow-rank rule (the same in
vmrun and in the template), and the hang watcher's sense of progress."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from vmrun.results.stragglers import SLOW_GAP_S, SLOW_RATIO, from_metrics, slow_ranks, summary
from vmrun.runs.stacks import group, lines, parse, spans
from vmrun.trainer import template

HERE = Path(__file__).resolve().parent
LIB = "/venv/lib/python3.12/site-packages"


def frame(name: str, path: str, line: int) -> dict[str, object]:
    return {"name": name, "filename": path, "short_filename": Path(path).name, "line": line}


def rank_line(rank: int, frames: list[dict[str, object]], **extra: object) -> str:
    threads = [
        {"thread_name": "MainThread", "frames": frames},
        {"thread_name": "Thread-1", "frames": [frame("run", f"{LIB}/x/w.py", 5)]},
    ]
    return json.dumps({"rank": rank, "pid": 100 + rank, "threads": threads, **extra})


IN_ALL_REDUCE = [
    frame("all_reduce", f"{LIB}/torch/distributed/distributed_c10d.py", 2950),
    frame("wrapper", f"{LIB}/torch/distributed/c10d_logger.py", 81),
    frame("train_step", "/home/u/vmrun/p/train.py", 88),
    frame("<module>", "/home/u/vmrun/p/train.py", 120),
]
IN_OWN_CODE = [
    frame("load", "/home/u/vmrun/p/data.py", 41),
    frame("<module>", "/home/u/vmrun/p/train.py", 120),
]


def test_ranks_in_one_place_print_once_and_the_odd_rank_stands_out() -> None:
    text = "\n".join(
        [
            *(rank_line(r, IN_ALL_REDUCE) for r in (0, 1)),
            '{"done": 2, "tool": "/x/py-spy"}',
        ]
    )
    other = "\n".join([rank_line(2, IN_ALL_REDUCE), rank_line(3, IN_OWN_CODE)])
    stacks = parse(text, "n1") + parse(other, "n2")
    assert [(g.ranks, g.place) for g in group(stacks)] == [
        ([0, 1, 2], "all_reduce at train.py:88"),
        ([3], "in load at data.py:41"),
    ]
    said = lines(stacks)
    assert said == [
        "ranks 0-2 (n1, n2): all_reduce at train.py:88",
        "rank 3 (n2): in load at data.py:41",
        "ranks 0-2 wait in all_reduce for rank 3",
    ]
    full = lines(stacks, full=True)
    assert "    all_reduce (distributed_c10d.py:2950)" in full
    assert any(line.startswith("  thread Thread-1: run") for line in full)


def test_a_rank_without_a_stack_says_why_and_library_only_stacks_name_the_innermost() -> None:
    stacks = parse(
        "\n".join(
            [
                json.dumps({"rank": 0, "pid": 7, "error": "Operation not permitted"}),
                rank_line(1, [frame("wait", f"{LIB}/threading.py", 320)]),
                "not json",
                json.dumps({"done": 2}),
            ]
        ),
        "h",
    )
    assert [s.place for s in stacks] == [
        "no stack: Operation not permitted",
        "in wait at threading.py:320",
    ]


def test_spans() -> None:
    assert spans([5, 0, 1, 2, 2]) == "0-2,5"
    assert spans([3]) == "3"


def test_the_slow_rank_rule_and_the_template_agree() -> None:
    assert (SLOW_RATIO, SLOW_GAP_S) == (template.SLOW_RATIO, template.SLOW_GAP_S)
    cases = [
        [0.1, 0.1, 0.1, 0.21],
        [0.1, 0.11, 0.1, 0.1],
        [0.001, 0.001, 0.0011, 0.0025],
        [0.2, 0.1],
        [0.5],
        [0.1, 0.1, 0.3, 0.3],
    ]
    for times in cases:
        ours = [(s.rank, s.seconds, s.typical) for s in slow_ranks(times)]
        assert ours == template.slow_ranks(times), times
    assert [s.rank for s in slow_ranks(cases[0])] == [3]
    assert slow_ranks(cases[1]) == []  # 10% is within the margin
    assert slow_ranks(cases[2]) == [] or [s.rank for s in slow_ranks(cases[2])] == [3]
    assert [s.rank for s in slow_ranks(cases[3])] == [0]


def test_metrics_name_the_slow_rank_and_its_node() -> None:
    line = {"epoch": 3, "rank_step_s": [0.1, 0.1, 0.1, 0.25], "rank_node": [0, 0, 1, 1]}
    assert summary(from_metrics(line)) == "rank 3 (node 1) slow: 2.5x"
    assert from_metrics({"epoch": 3}) == []
    assert summary(from_metrics({"rank_step_s": [0.1, 0.3], "rank_node": [0]})) == (
        "rank 1 slow: 3.0x"
    )


def _watch_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "hang_watch", HERE.parent / "vmrun" / "hostside" / "hang_watch.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_progress_is_a_ranks_line_or_a_heartbeat_never_torchruns_banner(tmp_path: Path) -> None:
    watch = _watch_module()
    rec = tmp_path
    (rec / "log").write_bytes(b"an earlier attempt's line\n")
    progress = watch.Progress(str(rec), ranked=True)
    assert progress.seen() is None
    with open(rec / "log", "ab") as log:
        log.write(b"W1129 torchrun's banner\n")
    assert progress.seen() is None  # no rank's line yet: silence is no news
    with open(rec / "log", "ab") as log:
        log.write(b"\x1e[rank2]:step 1\n[rank3]:half a li")
    first = progress.seen()
    assert first is not None
    (rec / "beat").mkdir()
    (rec / "beat" / "rank-0").write_text("{}")
    later = time.time() + 100
    os.utime(rec / "beat" / "rank-0", (later, later))
    assert progress.seen() == later
    plain = watch.Progress(str(rec), ranked=False)
    with open(rec / "log", "ab") as log:
        log.write(b"ne\nany line\n")
    assert plain.seen() is not None


def test_the_watchers_spans_match_vmruns() -> None:
    assert _watch_module().spans([0, 1, 3, 4, 5, 9]) == spans([0, 1, 3, 4, 5, 9]) == "0-1,3-5,9"


def test_nccl_on_sockets_beside_rdma_devices_is_said_and_ib_is_not(tmp_path: Path) -> None:
    """NCCL's lines as real runs printed them (tests/fixtures/nccl, STAND-IN: no GPU here),
    with an RDMA device folder made here in place of /sys/class/infiniband."""
    watch = _watch_module()
    fixtures = HERE / "fixtures" / "nccl"
    rdma = tmp_path / "infiniband"
    rdma.mkdir()
    (rdma / "mlx5_0").mkdir()
    expected = {
        "socket_libibverbs_missing.log": "Socket",
        "socket_accelerate.log": "Socket",
        "ib.log": "IB",
        "old_nccl_ib_sideband_then_socket.log": "Socket",
    }
    for name, network in expected.items():
        rec = tmp_path / name
        (rec / "nccl").mkdir(parents=True)
        transport = watch.Transport(str(rec), str(rdma))
        assert transport.seen() == ""
        (rec / "nccl" / "host.123.log").write_bytes((fixtures / name).read_bytes())
        assert transport.seen() == network, name
        said = transport.warning()
        assert ("mlx5_0" in said and "NET/Socket" in said) == (network == "Socket"), said
    no_rdma = watch.Transport(str(tmp_path / "socket_accelerate.log"), str(tmp_path / "none"))
    assert no_rdma.seen() == "Socket" and no_rdma.warning() == ""


def test_report_names_the_slow_rank_from_each_ranks_median_step_time(tmp_path: Path) -> None:
    from vmrun.results.history import load_run
    from vmrun.results.report import report_rows, table

    run = tmp_path / "results" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"id": "r1", "nodes": ["a", "b"], "nproc": "2"}))
    lines = [
        {
            "epoch": e,
            "loss": 1.0 / e,
            "samples_per_s": 100.0,
            "epoch_time_s": 1.0,
            "world_size": 4,
            "rank_step_s": [0.10, 0.11, 0.10, 0.30 if e > 1 else 0.1],
            "rank_node": [0, 0, 1, 1],
        }
        for e in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    history = load_run(run)
    assert history.rank_step_s == (0.10, 0.11, 0.10, 0.30) and history.rank_node == (0, 0, 1, 1)
    (row,) = report_rows([history])
    assert row.slow_ranks == [
        {"rank": 3, "node": 1, "step_s": 0.3, "others_step_s": 0.1, "ratio": 3.0}
    ]
    heads, _, cells = table([row])
    assert heads[-1] == "SLOW RANKS" and cells[0][-1] == "r3 (node 1) 3.0x"


def test_flight_recorder_dumps_say_which_ranks_did_not_reach_the_collective(
    tmp_path: Path,
) -> None:
    """Each rank's dump (the shape torch writes: pg_status, entries) read by the host
    script into a line; the lines together say who stopped short."""
    import pickle
    import subprocess
    import sys

    from vmrun.runs.stacks import flight_verdict, parse_flights

    rec = tmp_path / "rec"
    (rec / "nccl").mkdir(parents=True)
    for rank, last in ((0, 30), (1, 30), (2, 30), (3, 29)):
        entries = [
            {"pg_id": 0, "collective_seq_id": n, "profiling_name": "nccl:all_reduce"}
            for n in range(1, last + 1)
        ]
        dump = {
            "version": "2.10",
            "pg_status": {
                "0": {
                    "last_enqueued_collective": last,
                    "last_started_collective": last,
                    "last_completed_collective": last - 1,
                }
            },
            "entries": entries,
        }
        (rec / "nccl" / f"fr_rank_{rank}").write_bytes(pickle.dumps(dump))
    (rec / "nccl" / "fr_rank_4").write_bytes(b"cut short")
    said = subprocess.run(
        [
            sys.executable,
            str(HERE.parent / "vmrun" / "hostside" / "stacks.py"),
            "--saved",
            str(rec),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    flights = parse_flights(said, "n1")
    assert [(f.rank, f.enqueued, f.op) for f in flights[:4]] == [
        (0, 30, "nccl:all_reduce"),
        (1, 30, "nccl:all_reduce"),
        (2, 30, "nccl:all_reduce"),
        (3, 29, "nccl:all_reduce"),
    ]
    assert flights[4].rank == 4 and flights[4].error
    assert flight_verdict(flights) == (
        "flight recorder: ranks 0-2 reached collective #30"
        " (nccl:all_reduce); rank 3 did not (last: #29)"
    )
    assert flight_verdict(flights[:3]).endswith("every rank with a dump")
    assert flight_verdict([]) == ""


def test_the_wheels_sent_on_are_those_of_this_version_from_the_given_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a supervisor gets (recovery.deploy): this machine's py-spy wheels of vmrun's
    version, every machine's, from VMRUN_TOOL_WHEELS when given, else the cache."""
    from vmrun.runs import stack_tool

    names = [
        f"py_spy-{stack_tool.VERSION}-py2.py3-none-manylinux1_x86_64.whl",
        f"py_spy-{stack_tool.VERSION}-py2.py3-none-manylinux2014_aarch64.whl",
        "py_spy-0.3.14-py2.py3-none-manylinux1_x86_64.whl",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(stack_tool.WHEELS_ENV, str(tmp_path))
    assert [p.name for p in stack_tool.wheels()] == sorted(names[:2])
    monkeypatch.delenv(stack_tool.WHEELS_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "none"))
    assert stack_tool.wheels() == []
