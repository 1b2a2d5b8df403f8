"""Launcher argv, env wiring and script-arg conventions: pure, no torch, no processes."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from conftest import ROOT

from vmrun.backends.hosts import node_launch, preflight, training
from vmrun.backends.hosts.netfacts import Layout, NodeFacts
from vmrun.backends.hosts.node_launch import HostEnv, Node
from vmrun.backends.hosts.records import RunRecord
from vmrun.config import load_settings
from vmrun.errors import UsageError
from vmrun.results.record import RunRecord as Record
from vmrun.runs import launch
from vmrun.runs.plan import Plan
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry

PY, SCRIPT = "/venv/bin/python", "train.py"


def test_standalone_single_node() -> None:
    argv = launch.torchrun_argv(
        PY, SCRIPT, ["50", "10"], nproc_per_node="2", max_restarts=0, standalone=True
    )
    assert argv == [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--max-restarts=0",
        SCRIPT,
        "50",
        "10",
    ]


def test_single_node_c10d_on_a_free_port_keeps_our_run_id() -> None:
    argv = launch.torchrun_argv(
        PY,
        SCRIPT,
        ["5", "2"],
        nproc_per_node="gpu",
        max_restarts=3,
        rdzv_endpoint="localhost:0",
        rdzv_id="template-20250101-120000-ab12",
    )
    assert argv[3:9] == [
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=localhost:0",
        "--rdzv-id=template-20250101-120000-ab12",
        "--nnodes=1",
        "--nproc-per-node=gpu",
        "--max-restarts=3",
    ]
    assert argv[-3:] == [SCRIPT, "5", "2"]


def test_multi_node_c10d_and_elastic_range() -> None:
    argv = launch.torchrun_argv(
        PY,
        SCRIPT,
        [],
        nproc_per_node=4,
        max_restarts=1,
        nnodes="1:4",
        rdzv_endpoint="10.0.0.5:29400",
        rdzv_id="job",
    )
    assert "--nnodes=1:4" in argv and "--rdzv-endpoint=10.0.0.5:29400" in argv
    assert "--nproc-per-node=4" in argv and argv[-1] == SCRIPT


def test_static_multi_node() -> None:
    argv = launch.torchrun_argv(
        PY,
        SCRIPT,
        ["50", "10"],
        nproc_per_node="gpu",
        max_restarts=0,
        nnodes="2",
        node_rank=1,
        master_addr="10.0.0.5",
        master_port=29500,
    )
    assert argv[3:9] == [
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.5",
        "--master-port=29500",
        "--nproc-per-node=gpu",
        "--max-restarts=0",
    ]


def test_script_words_are_kept_verbatim() -> None:
    words = ["--name", "a b;c", "$HOME", "--"]
    argv = launch.torchrun_argv(PY, SCRIPT, words, nproc_per_node="1", max_restarts=0)
    assert argv[-5:] == [SCRIPT, *words]


@pytest.mark.parametrize("value", ["gpu", "cpu", "auto", "1", "8", " GPU ", 3])
def test_nproc_per_node_accepts(value: object) -> None:
    assert launch.check_nproc_per_node(value) == str(value).strip().lower()  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "", "xpu!", 0])
def test_nproc_per_node_rejects(value: object) -> None:
    with pytest.raises(UsageError) as info:
        launch.check_nproc_per_node(value)  # type: ignore[arg-type]
    assert info.value.code == "usage" and f"--nproc-per-node {value!r}" in info.value.message


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_restarts": -1}, "--max-restarts"),
        ({"nnodes": "0"}, "'0'"),
        ({"nnodes": "4:2", "rdzv_endpoint": "h:1", "rdzv_id": "j"}, "'4:2'"),
        ({"nnodes": "2", "standalone": True}, "--standalone"),
        ({"standalone": True, "rdzv_endpoint": "h:1"}, "--standalone"),
        ({"nnodes": "2", "rdzv_endpoint": "h:29400"}, "rdzv id"),
        ({"rdzv_endpoint": "h:1", "node_rank": 0}, "node rank"),
        ({"rdzv_endpoint": "bad host"}, "'bad host'"),
        ({"nnodes": "1:2"}, "1:2"),
        ({"nnodes": "2"}, "node rank"),
        ({"nnodes": "2", "node_rank": 2, "master_addr": "m"}, "0..1"),
        ({"master_port": 70000}, "70000"),
    ],
)
def test_torchrun_argv_rejects(kwargs: dict, needle: str) -> None:
    """Each rule refuses with the usage code, naming the flag or value it refuses."""
    args = {"nproc_per_node": "2", "max_restarts": 0, **kwargs}
    with pytest.raises(UsageError) as info:
        launch.torchrun_argv(PY, SCRIPT, [], **args)
    assert info.value.code == "usage" and needle in info.value.message
    assert "\n" not in str(info.value)


def test_python_argv() -> None:
    assert launch.python_argv(PY, SCRIPT, ["5", "2"]) == [PY, SCRIPT, "5", "2"]


def test_env_wiring_one_process_per_node() -> None:
    assert launch.env_wiring(node_rank=1, nnodes=2, master_addr="10.0.0.5") == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
    }
    assert (
        launch.env_wiring(node_rank=0, nnodes=1, master_addr="h", master_port=1234)["MASTER_PORT"]
        == "1234"
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"node_rank": 2, "nnodes": 2, "master_addr": "m"}, "0..1"),
        ({"node_rank": 0, "nnodes": 0, "master_addr": "m"}, "nnodes"),
        ({"node_rank": 0, "nnodes": 1, "master_addr": ""}, "master address"),
        ({"node_rank": 0, "nnodes": 1, "master_addr": "m", "master_port": 0}, "port 0"),
    ],
)
def test_env_wiring_rejects(kwargs: dict, needle: str) -> None:
    with pytest.raises(UsageError) as info:
        launch.env_wiring(**kwargs)
    assert info.value.code == "usage" and needle in info.value.message


def test_script_args_convention() -> None:
    assert launch.script_args(50, 10, None) == ["50", "10"]
    assert launch.script_args(50, 10, []) == ["50", "10"]
    assert launch.script_args(50, 10, ["--cfg", "x.yaml"]) == ["--cfg", "x.yaml"]
    # user args win even when the epoch values would be invalid: they are not used
    assert launch.script_args(0, 0, ["a"]) == ["a"]


@pytest.mark.parametrize(
    ("epochs", "save_every", "needle"),
    [
        (0, 1, ("--epochs", "0")),
        (-3, 1, ("--epochs", "-3")),
        (5, 0, ("--save-every", "0")),
    ],
)
def test_script_args_rejects(epochs: int, save_every: int, needle: tuple[str, str]) -> None:
    with pytest.raises(UsageError) as info:
        launch.script_args(epochs, save_every, None)
    flag, value = needle
    assert info.value.code == "usage" and info.value.exit_code == 2
    assert flag in info.value.message and info.value.message.endswith(value)


def test_torchrun_env_only_with_restarts() -> None:
    assert launch.torchrun_env(0) == {}
    assert launch.torchrun_env(2) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def test_launcher_names() -> None:
    for name in ("torchrun", "python", "env"):
        assert launch.check_launcher(name) == name
    with pytest.raises(UsageError) as info:
        launch.check_launcher("mpi")
    assert info.value.code == "usage" and "'mpi'" in info.value.message


def test_run_id_and_names() -> None:
    when = datetime(2025, 1, 2, 3, 4, 5)
    assert launch.run_id("template", now=when, token="ab12") == "template-20250102-030405-ab12"
    generated = launch.run_id("x")
    assert len(generated.rsplit("-", 1)[1]) == 4
    assert launch.name_from_script("my train (v2)") == "my-train-v2"
    assert launch.name_from_script("...") == "run"
    assert launch.check_run_name("exp_1.a-b") == "exp_1.a-b"
    for bad in ("a b", "-x", "", "x" * 65):
        with pytest.raises(UsageError):
            launch.check_run_name(bad)


def test_launch_module_imports_no_torch() -> None:
    code = "import sys, vmrun.runs.launch, vmrun.trainer; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "False"


def test_multinode_c10d_flags() -> None:
    argv = launch.torchrun_argv(
        "/py",
        "train.py",
        ["5", "1"],
        nproc_per_node="gpu",
        max_restarts=2,
        nnodes="2:4",
        rdzv_endpoint="10.0.0.5:29400",
        rdzv_id="r1",
        rdzv_conf={"is_host": "true"},
        local_addr="10.0.0.5",
        log_dir="/home/u/.vmrun/runs/r1/workers",
    )
    assert argv == [
        "/py",
        "-m",
        "torch.distributed.run",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29400",
        "--rdzv-id=r1",
        "--rdzv-conf=is_host=true",
        "--local-addr=10.0.0.5",
        "--nnodes=2:4",
        "--nproc-per-node=gpu",
        "--max-restarts=2",
        "--log-dir=/home/u/.vmrun/runs/r1/workers",
        "--tee=3",
        "train.py",
        "5",
        "1",
    ]
    assert launch.RANK_PREFIX.match(b"[rank12]:x").group(1) == b"12"
    assert launch.RANK_PREFIX_TEMPLATE == "\x1e[rank${rank}]:"


def test_node_env_wiring_ranks_the_nodes_master_first() -> None:
    """`--launcher env` on several hosts: one world of one process per host, not N worlds."""
    order = ["n1", "n2", "n3"]
    got = {
        n: launch.node_env_wiring(order, n, master_addr="10.0.1.5", master_port=29401)
        for n in order
    }
    assert [got[n]["RANK"] for n in order] == ["0", "1", "2"]
    for wiring in got.values():
        assert wiring["WORLD_SIZE"] == "3" and wiring["LOCAL_RANK"] == "0"
        assert wiring["MASTER_ADDR"] == "10.0.1.5" and wiring["MASTER_PORT"] == "29401"
    with pytest.raises(UsageError) as stranger:
        launch.node_env_wiring(order, "n9", master_addr="10.0.1.5", master_port=29401)
    assert stranger.value.code == "usage" and "'n9'" in stranger.value.message
    with pytest.raises(UsageError) as twice:
        launch.node_env_wiring(["a", "a"], "a", master_addr="10.0.1.5", master_port=29401)
    assert twice.value.code == "usage" and "a, a" in twice.value.message


def _plan(launcher: str, *, template: bool = False) -> Plan:
    return Plan(
        script=Path("/p/show.py"),
        is_template=template,
        name="show",
        args=["x"],
        launcher=launcher,
        nproc=None,
        max_restarts=0,
        env={"FOO": "bar"},
        project=Path("/p"),
    )


def _node(label: str) -> Node:
    entry = HostEntry(parse_host(label), name=label)
    return Node(entry, None, HostEnv("/home/u", "/venv/bin/python", {}), script="show.py")  # type: ignore[arg-type]


def test_env_launcher_on_several_hosts_wires_one_world() -> None:
    """node_launch for each node: RANK by node order (the master, given last here,
    first), WORLD_SIZE the number of hosts, MASTER_* the checked rendezvous address."""
    layout = Layout("n2", "10.0.1.5", 29402, {"n1": "eth1", "n2": "eth1"})
    envs = {}
    for label in ("n1", "n2"):
        argv, env = node_launch.node_launch(
            _plan("env"), _node(label), "r1", "1", layout, node_launch.Wiring(), 0, ["n1", "n2"]
        )
        assert argv == ["/venv/bin/python", "show.py", "x"]
        envs[label] = env
    assert envs["n2"]["RANK"] == "0" and envs["n1"]["RANK"] == "1"  # order: master first
    for env in envs.values():
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "0"
        assert env["MASTER_ADDR"] == "10.0.1.5" and env["MASTER_PORT"] == "29402"
        assert env["GLOO_SOCKET_IFNAME"] == "eth1" and env["FOO"] == "bar"
    _, single = node_launch.node_launch(
        _plan("env"), _node("n1"), "r1", "1", None, node_launch.Wiring(), 40123
    )
    assert single["RANK"] == "0" and single["WORLD_SIZE"] == "1"
    assert single["MASTER_ADDR"] == "127.0.0.1" and single["MASTER_PORT"] == "40123"


def test_python_launcher_on_several_hosts_is_refused_before_any_connection() -> None:
    """mp.spawn scripts form a single-node world each: refused with exit 2, and before any
    SSH connection (the hosts here do not even resolve, which would be exit 12)."""
    with pytest.raises(UsageError) as info:
        training.run_remote(
            _plan("python"),
            [HostEntry(parse_host(h)) for h in ("a.invalid", "b.invalid")],
            load_settings({}, cwd=Path("/"), environ={"HOME": "/nonexistent"}),
            detach=True,
        )
    assert info.value.code == "usage" and "--launcher torchrun" in info.value.message
    preflight.check_launcher_hosts(_plan("python"), 1, node_launch.Wiring())  # one host: fine
    preflight.check_launcher_hosts(_plan("env"), 2, node_launch.Wiring(nnodes="2"))
    with pytest.raises(UsageError) as elastic:
        preflight.check_launcher_hosts(_plan("env"), 2, node_launch.Wiring(nnodes="1:2"))
    assert elastic.value.code == "usage" and "--launcher torchrun" in elastic.value.message


def test_concurrent_user_script_in_the_same_workdir_is_warned_about() -> None:
    def run(rid: str, workdir: str, template: bool) -> RunRecord:
        return RunRecord(rid, "h1", Record.from_json({"workdir": workdir, "template": template}))

    busy = [
        run("a-1", "vmrun/p-abc123", False),
        run("t-1", "vmrun/p-abc123", True),
        run("o-1", "vmrun/other-def456", False),
    ]
    text = preflight.shared_workdir_warning(_plan("torchrun"), busy, "vmrun/p-abc123")
    assert text is not None and "\n" not in text
    assert "a-1 also runs in ~/vmrun/p-abc123" in text and "t-1" not in text and "o-1" not in text
    template = _plan("torchrun", template=True)
    assert preflight.shared_workdir_warning(template, busy, "vmrun/p-abc123") is None
    assert preflight.shared_workdir_warning(_plan("torchrun"), busy[1:], "vmrun/p-abc123") is None


def test_nccls_debug_lines_go_to_the_record_unless_the_user_asks_for_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every run: torch's flight recorder dumps into the record's nccl/ folder; NCCL's INIT
    and NET lines into files there (the log stays the script's), unless NCCL_DEBUG is
    asked for (--nccl-debug, this shell, --env), which then has them in the log."""
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    rec = "/home/u/.vmrun/runs/r1/nccl"
    _, env = node_launch.node_launch(
        _plan("torchrun"), _node("n1"), "r1", "1", None, node_launch.Wiring()
    )
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_FR_DUMP_TEMP_FILE"] == (
        f"{rec}/fr_rank_"
    )
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == f"{rec}/%h.%p.log"
    _, asked = node_launch.node_launch(
        _plan("torchrun"), _node("n1"), "r1", "1", None, node_launch.Wiring(nccl_debug="WARN")
    )
    assert asked["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" not in asked
    plan = _plan("torchrun")
    plan.env["NCCL_DEBUG"] = "TRACE"
    _, given = node_launch.node_launch(plan, _node("n1"), "r1", "1", None, node_launch.Wiring())
    assert given["NCCL_DEBUG"] == "TRACE" and "NCCL_DEBUG_FILE" not in given


# What torch 2.8+ still reads but warns about on every rank when set (c10d's getCvar*):
# each has a TORCH_FR_* name now.
DEPRECATED = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_TRACE_CPP_STACK",
}


def _rank_env(torch: str | None, *, recorded: bool = False, given: dict | None = None) -> dict:
    node = _node("n1")
    if recorded:  # setup's record for the Python the run uses
        node.env = HostEnv(
            "/home/u", "/venv/bin/python", {"python": "/venv/bin/python", "torch": torch}
        )
    elif torch is not None:  # the multi-node probe's answer
        node.facts = NodeFacts("n1", data={"torch": torch})
    plan = _plan("torchrun")
    plan.env.update(given or {})
    return node_launch.node_launch(plan, node, "r1", "1", None, node_launch.Wiring())[1]


def test_a_ranks_flight_recorder_names_suit_the_nodes_torch() -> None:
    """torch 2.8 renamed the flight recorder's settings (TORCH_FR_*; the old names warn on
    every rank of torch 2.8+): a new torch gets only the new names, one known to be older
    the old names as well (it reads only those), an unknown one the new names alone."""
    rec = "/home/u/.vmrun/runs/r1/nccl/fr_rank_"
    for torch in ("2.13.0+cu130", "2.8.0", "3.0.1"):
        env = _rank_env(torch)
        assert not DEPRECATED & env.keys(), torch
        assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_FR_DUMP_TEMP_FILE"] == rec
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert not DEPRECATED & _rank_env("2.13.0", recorded=True).keys()
    assert not DEPRECATED & _rank_env(None).keys()
    for old in (_rank_env("2.7.1+cu126"), _rank_env("2.5.1", recorded=True)):
        assert old["TORCH_NCCL_TRACE_BUFFER_SIZE"] == old["TORCH_FR_BUFFER_SIZE"] == "2000"
        assert old["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == old["TORCH_FR_DUMP_TEMP_FILE"] == rec
    # a buffer size of the run's own, under the old name, is not overridden by the new one
    own = _rank_env("2.13.0", given={"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    assert own["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0" and "TORCH_FR_BUFFER_SIZE" not in own
    assert own["TORCH_FR_DUMP_TEMP_FILE"] == rec


def _fake_torch(site: Path, cuda: str) -> Path:
    """A torch package whose version.py says `cuda`; importing it leaves a file `imported`
    beside `site`; it sees 3 GPUs."""
    torch = site / "torch"
    (torch / "cuda").mkdir(parents=True)
    (torch / "version.py").write_text(
        f"from typing import Optional\n__version__ = '9.9.0'\ncuda: Optional[str] = {cuda}\n"
        "hip: Optional[str] = None\n"
    )
    imported = site.parent / "imported"
    (torch / "__init__.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n__version__ = '9.9.0'\nfrom . import cuda\n"
    )
    (torch / "cuda" / "__init__.py").write_text(
        "def device_count():\n    return 3\ndef is_available():\n    return True\n"
        "def get_device_name(i):\n    return 'T4'\nclass nccl:\n    version = lambda: (2, 21, 5)\n"
    )
    return imported


@pytest.mark.parametrize(("cuda", "expected"), [("None", (0, False)), ("'12.4'", (3, True))])
def test_a_local_runs_torch_probe_imports_only_a_build_that_may_see_gpus(
    tmp_path: Path, cuda: str, expected: tuple[int, bool]
) -> None:
    """A CPU build's version.py says it sees no GPU (torch is not imported: 2-3 s of CPU
    before each local run); a CUDA build is imported and asked."""
    import os

    from vmrun.runs.plan import probe_torch

    imported = _fake_torch(tmp_path / "site", cuda)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    assert (probe_torch(sys.executable, env), imported.exists()) == expected


@pytest.mark.parametrize(
    ("cuda", "expected"),
    [("None", ("9.9.0", None, 0, None, False)), ("'12.4'", ("9.9.0", "12.4", 3, "2.21.5", True))],
)
def test_a_hosts_versions_probe_imports_only_a_build_that_may_see_gpus(
    tmp_path: Path, cuda: str, expected: tuple[object, ...]
) -> None:
    """netprobe's `facts --versions` (each node of a multi-node run): the same rule."""
    import json
    import os

    imported = _fake_torch(tmp_path / "site", cuda)
    init = tmp_path / "site" / "torch" / "__init__.py"
    init.write_text(init.read_text() + "from . import version\n")  # torch.version.cuda
    done = subprocess.run(
        [sys.executable, str(ROOT / "vmrun" / "hostside" / "netprobe.py"), "facts", "--versions"],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    facts = json.loads(done.stdout)
    got = (facts["torch"], facts["cuda"], facts["gpus"], facts["nccl"], imported.exists())
    assert got == expected, facts
