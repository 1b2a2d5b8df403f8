"""vmrun.queue.conf and the decisions of vmrun.queue.making, driven with facts as
hostside/slurm_node.sh prints them (quick tier: no host; tests/test_queue.py makes a real
cluster of test hosts)."""

from __future__ import annotations

import pytest

from vmrun.errors import RemoteError, UsageError
from vmrun.queue.conf import (
    cgroup_conf,
    check_name,
    gpu_type,
    gres_conf,
    hosts_lines,
    parse_facts,
    plan,
    slurm_conf,
    slurmdbd_conf,
)
from vmrun.queue.making import fitness

FACTS = """\
hostname={name}
addr={addr}
systemd=1
has_munged=1
has_slurmd=1
has_slurmctld=1
has_sinfo=1
apt=1
versions=slurmd 22.05.8-4,slurmctld 22.05.8-4,munge 0.5.15-2,
cpus=2
mem_mb=24105
slurmd_c=NodeName={name} CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 \
ThreadsPerCore=2 RealMemory=64000
gpu_names={gpus}
cgroup={cgroup}
slurm_user=1
conf=none
root=sudo
"""


def facts(name: str, addr: str, gpus: str = "", cgroup: str = "v2", **edits: str) -> object:
    text = FACTS.format(name=name, addr=addr, gpus=gpus, cgroup=cgroup)
    for key, value in edits.items():
        text = "\n".join(
            f"{key}={value}" if ln.startswith(f"{key}=") else ln for ln in text.splitlines()
        )
    return parse_facts(text, name.replace("gpu", "h"))


def test_facts_are_read_as_the_script_prints_them() -> None:
    f = facts("gpu1", "10.0.0.5", "NVIDIA A100-SXM4-80GB,NVIDIA A100-SXM4-80GB,")
    assert (f.hostname, f.addr, f.systemd, f.root) == ("gpu1", "10.0.0.5", True, "sudo")
    assert f.topology == {
        "CPUs": 8,
        "Boards": 1,
        "SocketsPerBoard": 1,
        "CoresPerSocket": 4,
        "ThreadsPerCore": 2,
        "RealMemory": 64000,
    }
    assert (f.gpus, f.gpu_type, f.needs(controller=True, accounting=False)) == (2, "a100", [])
    assert f.versions["slurmd"] == "22.05.8-4"
    bare = facts("n1", "10.0.0.6", slurmd_c="", has_slurmd="0")
    assert bare.topology == {"CPUs": 2, "RealMemory": 24105}  # nproc and MemTotal
    assert bare.needs(controller=False, accounting=False) == ["slurmd"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA RTX A6000", "rtxa6000"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA L40S", "l40s"),
    ],
)
def test_gpu_models_become_gres_types(name: str, kind: str) -> None:
    assert gpu_type(name) == kind


def test_slurm_conf_names_every_node_at_its_address_with_its_gpus() -> None:
    nodes = [
        facts("gpu1", "10.0.0.5", "Tesla T4,Tesla T4,Tesla T4,Tesla T4"),
        facts("gpu2", "10.0.0.6", "NVIDIA A100-SXM4-80GB"),
        facts("cpu1", "10.0.0.7"),
    ]
    p = plan("lab", nodes[0], nodes)  # type: ignore[arg-type]
    conf = slurm_conf(p)
    assert conf.startswith("# vmrun-cluster: lab\n")
    assert "SlurmctldHost=gpu1(10.0.0.5)" in conf and "SlurmUser=slurm" in conf
    assert (
        "NodeName=gpu1 NodeAddr=10.0.0.5 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=4"
        " ThreadsPerCore=2 RealMemory=62720 Gres=gpu:t4:4 State=UNKNOWN"
    ) in conf
    assert "NodeName=cpu1 NodeAddr=10.0.0.7 CPUs=8" in conf and "Gres=gpu:a100:1" in conf
    # one partition of all (default), one per GPU type where types differ
    assert "PartitionName=main Nodes=gpu1,gpu2,cpu1 Default=YES" in conf
    assert "PartitionName=t4 Nodes=gpu1 Default=NO" in conf
    assert "PartitionName=a100 Nodes=gpu2 Default=NO" in conf
    assert "StateSaveLocation=/var/lib/slurm/vmrun-lab/ctld" in conf
    assert "ProctrackType=proctrack/cgroup" in conf
    gres = gres_conf(p)
    assert "NodeName=gpu1 Name=gpu Type=t4 File=/dev/nvidia[0-3]" in gres
    assert "NodeName=gpu2 Name=gpu Type=a100 File=/dev/nvidia0" in gres
    assert "cpu1" not in gres
    assert hosts_lines(p).splitlines() == ["10.0.0.5\tgpu1", "10.0.0.6\tgpu2", "10.0.0.7\tcpu1"]
    assert slurm_conf(p) == conf  # the same facts, the same bytes: nothing to rewrite


def test_one_gpu_type_is_one_partition_and_a_host_without_cgroups_sets_the_rule() -> None:
    nodes = [facts("a", "10.0.0.1", "Tesla T4"), facts("b", "10.0.0.2", "Tesla T4", cgroup="none")]
    p = plan("lab", nodes[0], nodes)  # type: ignore[arg-type]
    assert list(p.partitions) == ["main"]
    conf = slurm_conf(p)
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert cgroup_conf(p, nodes[0]).endswith("CgroupPlugin=cgroup/v1\n")  # type: ignore[arg-type]
    both = [facts("a", "10.0.0.1"), facts("b", "10.0.0.2")]
    p2 = plan("lab", both[0], both)  # type: ignore[arg-type]
    assert "ConstrainDevices=yes" in cgroup_conf(p2, both[0])  # type: ignore[arg-type]
    assert "TaskPlugin=task/cgroup,task/affinity" in slurm_conf(p2)


def test_two_hosts_with_one_hostname_or_address_are_refused() -> None:
    twins = [facts("n1", "10.0.0.1"), facts("n1", "10.0.0.2")]
    with pytest.raises(RemoteError, match="same hostname n1") as caught:
        plan("lab", twins[0], twins)  # type: ignore[arg-type]
    assert caught.value.code == "slurm-host-unfit"
    same = [facts("n1", "10.0.0.1"), facts("n2", "10.0.0.1")]
    with pytest.raises(RemoteError, match=r"same address 10\.0\.0\.1"):
        plan("lab", same[0], same)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["Lab", "1lab", "lab name", "", "x" * 41])
def test_cluster_names_slurm_cannot_take_are_refused(name: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_name(name)
    assert caught.value.code == "bad-cluster-name"


@pytest.mark.parametrize(
    ("edits", "controller", "why"),
    [
        ({}, True, ""),
        ({"root": "none"}, False, "needs root"),
        ({"systemd": "0"}, False, "systemd does not run"),
        ({"conf": "other"}, False, "a Slurm vmrun did not write"),
        ({"conf": "other lab2"}, False, "vmrun's cluster lab2"),
        ({"has_slurmctld": "0", "apt": "0"}, True, "packages slurmctld are missing"),
        ({"has_slurmctld": "0", "apt": "0"}, False, ""),  # a node needs no slurmctld
        ({"has_slurmd": "0"}, False, ""),  # apt-get installs it
    ],
)
def test_what_keeps_a_host_from_being_a_node(
    edits: dict[str, str], controller: bool, why: str
) -> None:
    said = fitness(facts("n1", "10.0.0.1", **edits), "lab", controller)  # type: ignore[arg-type]
    assert (why in said) if why else said == "", said


def test_a_slurmd_newer_than_the_controller_is_refused() -> None:
    """Slurm's daemons talk to older releases only: hosts of two distribution releases."""
    from vmrun.queue.making import skew

    old = facts("ctl", "10.0.0.1", versions="slurmd 22.05.8-4,slurmctld 22.05.8-4,")
    same = facts("n1", "10.0.0.2", versions="slurmd 22.05.11-1,")
    newer = facts("n2", "10.0.0.3", versions="slurmd 23.11.4-1,")
    found = skew({"ctl": old, "n1": same, "n2": newer}, "ctl")  # type: ignore[dict-item]
    assert len(found) == 1 and found[0].startswith("n2: slurmd 23.11.4-1 is newer"), found
    assert skew({"ctl": newer, "n1": old}, "ctl") == []  # type: ignore[dict-item]


def test_an_old_distributions_slurm_folder_is_refused() -> None:
    said = fitness(facts("n1", "10.0.0.1", conf="none"), "lab", False)  # type: ignore[arg-type]
    assert said == ""
    text = FACTS.format(name="n1", addr="10.0.0.1", gpus="", cgroup="v2")
    text += "conf_dir=/etc/slurm-llnl\n"
    said = fitness(parse_facts(text, "n1"), "lab", False)
    assert "/etc/slurm-llnl" in said, said


def test_accounting_is_slurmdbd_on_the_controller_with_no_password_from_here() -> None:
    """--slurmdbd: slurm.conf sends accounting to slurmdbd on the controller and gathers
    jobs' use; slurmdbd.conf names the cluster's database and user and leaves the password
    to the controller (it never travels); the controller, and only it, needs the packages."""
    nodes = [facts("gpu1", "10.0.0.5"), facts("gpu2", "10.0.0.6")]
    p = plan("lab-2", nodes[0], nodes, accounting=True)  # type: ignore[arg-type]
    conf = slurm_conf(p)
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "AccountingStorageHost=gpu1" in conf and "JobAcctGatherType=jobacct_gather/linux" in conf
    dbd = slurmdbd_conf(p)
    assert dbd.startswith("# vmrun-cluster: lab-2\n") and "DbdHost=gpu1" in dbd
    assert "StorageLoc=slurm_acct_lab_2" in dbd and "StorageUser=slurm_lab_2" in dbd
    assert "StoragePass" not in dbd and "SlurmUser=slurm" in dbd
    assert "accounting_storage/none" in slurm_conf(plan("lab", nodes[0], nodes))  # type: ignore[arg-type]
    bare = facts("n1", "10.0.0.1", apt="0")
    assert "packages slurmdbd mariadb-server are missing" in fitness(
        bare, "lab", True, accounting=True
    )  # type: ignore[arg-type]
    assert fitness(bare, "lab", False, accounting=True) == ""  # type: ignore[arg-type]
