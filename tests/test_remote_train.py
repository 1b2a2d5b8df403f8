"""The pure parts of a multi-node start: the same-environment rule and each node's torchrun
argv, built from the real Node/Layout/Wiring values (no host is contacted: a Connection only
connects when used)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmrun.backends.hosts.netfacts import Layout, NodeFacts
from vmrun.backends.hosts.node_launch import HostEnv, Node, Wiring
from vmrun.backends.hosts.node_launch import node_launch as _launch
from vmrun.backends.hosts.preflight import check_same_env as _check_same_env
from vmrun.config import load_settings
from vmrun.errors import UsageError
from vmrun.runs.plan import Plan
from vmrun.ssh.connection import Connection
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.inventory import HostEntry

PYTHON = "/opt/env/bin/python"


def node(label: str, tmp_path: Path, *, python: str = "3.11.7", torch: str = "2.13.0") -> Node:
    """A node as preflight leaves it: its entry, a (never opened) connection, its facts."""
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    facts = {
        "hostname": label,
        "fqdn": f"{label}.example",
        "addrs": [{"ifname": "eth1", "addr": f"10.0.0.{len(label)}", "prefixlen": 24}],
        "python": python,
        "torch": torch,
    }
    return Node(
        entry=HostEntry(HostSpec(label)),
        conn=Connection(HostSpec(label), settings),
        env=HostEnv(home=f"/home/{label}", python=PYTHON, record={}),
        facts=NodeFacts.parse(label, json.dumps(facts)),
        workdir="vmrun/proj-123",
        script="train.py",
    )


def test_python_minor_versions_must_agree_and_the_refusal_names_both_hosts(
    tmp_path: Path,
) -> None:
    nodes = {
        "gpu1": node("gpu1", tmp_path, python="3.10.12"),
        "gpu2": node("gpu2", tmp_path, python="3.11.7"),
    }
    with pytest.raises(UsageError) as refused:
        _check_same_env(nodes)
    message = refused.value.message
    assert refused.value.code == "hosts-differ" and "Python" in message
    assert "3.10 on gpu1" in message and "3.11 on gpu2" in message


def test_a_python_patch_level_difference_is_accepted(tmp_path: Path) -> None:
    nodes = {
        "gpu1": node("gpu1", tmp_path, python="3.11.2"),
        "gpu2": node("gpu2", tmp_path, python="3.11.7"),
    }
    # the facts it compares do differ (patch level only), and it lets them through
    assert [n.facts.data["python"] for n in nodes.values() if n.facts] == ["3.11.2", "3.11.7"]
    assert _check_same_env(nodes) is None  # no UsageError: nothing is refused


def test_different_torch_builds_are_refused_naming_each(tmp_path: Path) -> None:
    nodes = {
        "gpu1": node("gpu1", tmp_path, torch="2.13.0+cu128"),
        "gpu2": node("gpu2", tmp_path, torch="2.13.0+cpu"),
    }
    with pytest.raises(UsageError) as refused:
        _check_same_env(nodes)
    assert refused.value.code == "hosts-differ"
    said = refused.value.message
    assert "2.13.0+cu128 on gpu1" in said and "2.13.0+cpu on gpu2" in said


def plan(max_restarts: int) -> Plan:
    return Plan(
        script=Path("/project/train.py"),
        is_template=False,
        name="train",
        args=["10", "2"],
        launcher="torchrun",
        nproc=None,
        max_restarts=max_restarts,
        env={},
        project=Path("/project"),
    )


def flags(argv: list[str]) -> dict[str, str]:
    """torchrun's own --key=value flags (those before the script)."""
    before = argv[: argv.index("train.py")]
    return dict(a[2:].split("=", 1) for a in before if a.startswith("--") and "=" in a)


def test_each_nodes_torchrun_gets_the_elastic_size_restarts_and_host_role(tmp_path: Path) -> None:
    nodes = {label: node(label, tmp_path) for label in ("gpu1", "gpu2", "gpu3")}
    layout = Layout(
        master="gpu1", addr="10.0.0.4", port=29400, ifnames=dict.fromkeys(nodes, "eth1")
    )
    wiring = Wiring(master="gpu1", nnodes="2:3")
    argvs = {}
    for label, n in nodes.items():
        argv, env = _launch(plan(3), n, "train-42", "2", layout, wiring)
        assert argv[:3] == [PYTHON, "-m", "torch.distributed.run"]
        assert argv[-3:] == ["train.py", "10", "2"]
        assert env["GLOO_SOCKET_IFNAME"] == "eth1" and env["NCCL_SOCKET_IFNAME"] == "=eth1"
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # restarts need a fresh store
        argvs[label] = flags(argv)
    for label, got in argvs.items():
        assert got["nnodes"] == "2:3" and got["max-restarts"] == "3", got
        assert got["rdzv-backend"] == "c10d" and got["rdzv-endpoint"] == "10.0.0.4:29400"
        assert got["rdzv-id"] == "train-42" and got["nproc-per-node"] == "2"
        assert got["rdzv-conf"] == f"is_host={'true' if label == 'gpu1' else 'false'}", got
        assert got["log-dir"] == f"/home/{label}/.vmrun/runs/train-42/workers"
    assert argvs["gpu1"]["local-addr"] == "10.0.0.4"  # the master advertises the rdzv address
    assert "local-addr" not in argvs["gpu2"]  # "gpu2.example" sorts after it: torch's default


def test_without_nnodes_every_host_is_a_node_and_no_restarts_share_the_store(
    tmp_path: Path,
) -> None:
    nodes = {label: node(label, tmp_path) for label in ("a", "b")}
    layout = Layout(master="b", addr="10.0.0.1", port=29500, ifnames={"a": "eth1", "b": "eth1"})
    argv, env = _launch(plan(0), nodes["b"], "r1", "1", layout, Wiring(master="b"))
    got = flags(argv)
    assert got["nnodes"] == "2" and got["max-restarts"] == "0"
    assert got["rdzv-conf"] == "is_host=true"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env


def test_a_resumed_run_starts_on_its_own_nodes_only_not_every_listed_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vmrun.toml lists accA and accB; the run used accA alone: the start reaches accA only
    (mapping it over accB too was a KeyError that stopped the attempt just started)."""
    from fake_group import FakeGroup

    from vmrun.backends.hosts import backend as remote
    from vmrun.backends.hosts.records import Started

    started: list[str] = []

    def fake_start(conn: Connection, rid: str, *args: object, **kwargs: object) -> Started:
        started.append(conn.label)
        return Started(4242, 7)

    monkeypatch.setattr(remote.records, "start", fake_start)
    group = FakeGroup(["accA", "accB"], tmp_path)
    nodes = {"accA": node("accA", tmp_path)}
    pids = remote._start_all(group, plan(0), nodes, "r-1", "1", None, Wiring(), resume="r-1")
    assert pids == {"accA": 4242}
    assert started == ["accA"]
    assert group.calls == [("accA",)]  # no stop of the attempt just started
