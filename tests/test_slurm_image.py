"""`train -C CLUSTER --image`: the batch script as a value for each runtime (pyxis' srun
options, Apptainer's and shifter's words before the task, docker/podman's runner and the
pull on each node), what run.json keeps, and each refusal before anything is sent. The
login node is a fake that answers the probe and the runtime detection; the real cluster
with a real Docker Engine on its compute hosts: test_cli_slurm_image.py."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from vmrun.backends.slurm.backend import SlurmBackend, Submission
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.job import JobSpec
from vmrun.containers.request import Asked
from vmrun.errors import VmrunError, exit_code_for
from vmrun.results.record import RunRecord
from vmrun.runs.plan import Plan, make_plan
from vmrun.ssh.result import CommandResult

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
WORK = "/home/u"


class _Login:
    """The login node: the probe's facts and `found`, the runtimes container_detect.sh
    names; records every command, and refuses a submission (none may happen here)."""

    def __init__(self, found: Sequence[str]) -> None:
        self.found = list(found)
        self.ran: list[str] = []

    def run(self, argv: Sequence[str], **_: object) -> CommandResult:
        name = Path(str(argv[1])).name if len(argv) > 1 else ""
        self.ran.append(name)
        if name == "slurm_probe.sh":
            out = f"user=u\nhome={WORK}\nworkdir={WORK}\nuid=1001\ngid=1002\n"
            out += "version=slurm 22.05.8\n"
        elif name == "container_detect.sh":
            out = "".join(f"{n}\n" for n in self.found)
        else:
            raise AssertionError(f"unexpected command {argv}")
        return CommandResult("bed", tuple(map(str, argv)), 0, out, "", 0.0)

    def capture(self, *_: object, **__: object) -> Any:
        raise AssertionError("nothing may be submitted")


def _plan(image: str = NGC, mounts: Sequence[str] = ("/data:/data",), **kw: Any) -> Plan:
    return make_plan(
        script=None,
        user_args=None,
        epochs=2,
        save_every=1,
        nproc_per_node=None,
        max_restarts=0,
        env=["NCCL_DEBUG=INFO"],
        name=None,
        batch_size=None,
        lr=None,
        launcher=kw.pop("launcher", "torchrun"),
        containers=Asked(image, tuple(mounts), kw),
    )


def _prepare(
    found: Sequence[str],
    table: dict[str, Any] | None = None,
    plan: Plan | None = None,
    spec: JobSpec | None = None,
) -> tuple[Submission, _Login]:
    login = _Login(found)
    cluster = Cluster("bed", "login", containers=table or {}, env={"HF_HOME": "/scratch/hf"})
    backend = SlurmBackend(login, cluster, spec or JobSpec(nodes=2, gpus_per_node=4))  # type: ignore[arg-type]
    return backend.prepare(plan or _plan()), login


def _array(script: str, name: str) -> list[str]:
    """A variable of the script's header (`NAME=(...)` or `NAME=...`), as the words bash
    reads: the header run by bash, nothing else."""
    header = script.split("\n# shellcheck shell=bash", 1)[0]
    shown = f'{header}\nprintf "%s\\0" "${{{name}[@]}}"'
    done = subprocess.run(["bash", "-c", shown], capture_output=True, text=True, check=True)
    return done.stdout.split("\0")[:-1] if done.stdout != "\0" else []


def test_pyxis_is_srun_options_and_the_task_runs_inside(tmp_path: Path) -> None:
    sub, login = _prepare(["pyxis", "docker"])  # detected: the site's own first
    assert login.ran == ["slurm_probe.sh", "container_detect.sh"]
    srun = _array(sub.script, "VMRUN_SRUN")
    record, code = sub.paths.record, sub.paths.code
    assert srun[0] == "--container-image=nvcr.io#nvidia/pytorch:24.05-py3"
    assert srun[1] == f"--container-mounts={code}:{code},{record}:{record},/data:/data"
    assert f"--container-workdir={code}" in srun
    assert _array(sub.script, "VMRUN_PREFIX") == [] and _array(sub.script, "VMRUN_PULL") == []
    assert _array(sub.script, "VMRUN_PYTHON") == ["python3"]  # the image's, not the cluster's
    meta = sub.record.to_json()  # what run.json holds
    assert meta["image"] == NGC and meta["container_runtime"] == "pyxis"
    assert meta["mounts"] == ["/data:/data"]
    image = RunRecord.from_json(meta).launch.image
    assert image is not None and str(image.request().image) == NGC
    (tmp_path / "job.sh").write_text(sub.script)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)


def test_apptainer_execs_the_task_with_nv_and_binds() -> None:
    sub, _ = _prepare(["apptainer", "docker"], {"container_runtime": "apptainer"})
    prefix = _array(sub.script, "VMRUN_PREFIX")
    code, record = sub.paths.code, sub.paths.record
    assert prefix[:3] == ["apptainer", "exec", "--nv"]
    assert prefix[3:5] == ["--bind", f"{code}:{code},{record}:{record},/data:/data"]
    assert prefix[-1] == f"docker://{NGC}"
    sif, _ = _prepare(["apptainer"], plan=_plan("/images/pt.sif", ()), spec=JobSpec(nodes=1))
    prefix = _array(sif.script, "VMRUN_PREFIX")
    assert prefix[-1] == "/images/pt.sif" and "--nv" not in prefix  # no GPUs asked


def test_shifter_is_an_sbatch_image_and_volumes_before_the_task() -> None:
    nersc = "nersc/pytorch:ngc-23.07-v0"
    table = {"image": nersc, "mounts": ["/data:/data"], "container_runtime": "shifter"}
    sub, _ = _prepare(["shifter"], table, plan=_plan("", ()))  # the cluster's own image
    assert f"#SBATCH --image=docker:{nersc}" in sub.script.splitlines()
    prefix = _array(sub.script, "VMRUN_PREFIX")
    assert prefix[:2] == ["shifter", "--module=gpu"]
    assert "--volume=/data:/data" in prefix and prefix[-1].startswith("--volume=")
    assert sub.record.to_json()["image"] == nersc


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_docker_and_podman_run_the_task_through_the_runner(engine: str) -> None:
    sub, _ = _prepare(
        ["pyxis", engine], {"container_runtime": engine, "container_ulimits": ["stack=67108864"]}
    )
    prefix = _array(sub.script, "VMRUN_PREFIX")
    code, record = sub.paths.code, sub.paths.record
    assert prefix[:2] == [engine, f"vmrun-{sub.run_id}"]  # + -$SLURM_PROCID on each node
    assert "--net=host" in prefix and "--ipc=host" in prefix and "--init" in prefix
    assert f"{code}:{code}" in prefix and f"{record}:{record}" in prefix
    assert prefix[prefix.index("-w") + 1] == code
    user = prefix[prefix.index("--user") + 1] if engine == "docker" else None
    assert user in ("1001:1002", None) and ("--userns=keep-id" in prefix) == (engine == "podman")
    passed = {prefix[i + 1] for i, word in enumerate(prefix) if word == "-e"}
    assert {"VMRUN_RUN_ID", "MASTER_ADDR", "VMRUN_REQUEUE_FILE", "VMRUN_WARNED_FILE"} <= passed
    assert {"NCCL_DEBUG", "HF_HOME", "CUDA_VISIBLE_DEVICES"} <= passed  # --env, the cluster's
    assert not [w for w in prefix if "=" in w and w.split("=")[0] in passed]  # names only
    assert prefix[-1] == NGC  # the task follows the image
    assert "vmrun.node=0" not in prefix  # added where the task starts
    assert _array(sub.script, "VMRUN_PULL") == [engine, NGC, "newer"]  # the pull policy last
    assert "pull" in _array(sub.script, "VMRUN_PULL_SCRIPT")[0]
    assert "rm -f" in _array(sub.script, "VMRUN_RUNNER")[0]
    home = _array(sub.script, "VMRUN_CONTAINER_HOME")[0]
    assert home == f"{WORK}/.vmrun/container-home" and f"HOME={home}" in prefix
    gpus = ["--gpus", "all"] if engine == "docker" else ["--device", "nvidia.com/gpu=all"]
    assert any(prefix[i : i + 2] == gpus for i in range(len(prefix)))


def test_the_step_wrapper_names_each_tasks_container_and_passes_slurms_variables(
    tmp_path: Path,
) -> None:
    """The job script's docker/podman branch run with a stand-in srun (one task, as Slurm's
    PROCID 3) and docker (records its argv): the container's name and node, SLURM_*."""
    sub, _ = _prepare(
        ["docker"], {"container_runtime": "docker"}, plan=_plan(mounts=()), spec=JobSpec(nodes=1)
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "docker.log"
    fakes = {
        # srun OPTIONS... COMMAND: run COMMAND as task 3 (a pull step: as task 0)
        "srun": 'while [ "${1#-}" != "$1" ]; do shift; done\n'
        'SLURM_PROCID=3 SLURM_NODEID=0 SLURM_LOCALID=3 exec "$@"',
        "docker": f'printf "%s\\n" "$*" >> {log}\ncase $1 in inspect) echo "0 ";; esac',
        "scontrol": 'case $2 in hostnames) echo vmt-c1;; config) echo "KillWait = 8 sec";; esac',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "rec"
    record.mkdir()
    script = sub.script.replace(
        f"VMRUN_RECORD_DIR={sub.paths.record}", f"VMRUN_RECORD_DIR={record}"
    )
    script = script.replace(f"VMRUN_RUN_DIR={sub.paths.out}", f"VMRUN_RUN_DIR={tmp_path / 'out'}")
    script = script.replace(f"VMRUN_CONTAINER_HOME={WORK}", f"VMRUN_CONTAINER_HOME={tmp_path}")
    (tmp_path / "job.sh").write_text(script)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "c1",
        "SLURM_NNODES": "1",
    }
    done = subprocess.run(
        ["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    pulls = [i for i, c in enumerate(calls) if c.startswith("pull ")]
    assert [calls[i] for i in pulls] == [f"pull {NGC}"]  # once per node, before the run
    assert pulls[0] < next(i for i, c in enumerate(calls) if c.startswith("run "))
    run = next(c.split() for c in calls if c.startswith("run "))
    assert run[1:4] == ["--rm", "--name", f"vmrun-{sub.run_id}-3"]
    assert run[4:6] == ["--label", "vmrun.node=3"]
    passed = {run[i + 1] for i, word in enumerate(run) if word == "-e"}
    assert {"SLURM_PROCID", "SLURM_JOB_ID", "SLURM_NNODES"} <= passed
    assert "stop" not in " ".join(calls) and calls[-1] == f"rm -f vmrun-{sub.run_id}-3"
    tail = run[run.index(NGC) + 1 :]
    assert tail[:2] == ["sh", "-c"]  # the task script, inside the image


def test_a_cluster_without_the_runtime_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(VmrunError) as caught:
        _prepare(["docker"], {"container_runtime": "pyxis"})
    assert caught.value.code == "container-runtime-missing" and "pyxis" in str(caught.value)
    assert exit_code_for(caught.value) == 2
    with pytest.raises(VmrunError) as caught:
        _prepare([])  # auto, and nothing found
    assert caught.value.code == "container-runtime-missing"


@pytest.mark.parametrize(
    ("runtime", "image", "mount", "fact"),
    [
        ("docker", "/images/pt.sif", None, ".sif"),
        ("pyxis", "/images/pt.sif", None, ".sif"),
        ("shifter", NGC, "/data:/data:ro", "read-write"),
    ],
)
def test_what_the_runtime_cannot_do_is_refused(runtime, image, mount, fact) -> None:
    plan = _plan(image, (mount,) if mount else ())
    with pytest.raises(VmrunError) as caught:
        _prepare([runtime], {"container_runtime": runtime}, plan=plan)
    assert caught.value.code == "container-option-unsupported" and fact in str(caught.value)
    assert exit_code_for(caught.value) == 2


@pytest.mark.parametrize(
    ("image", "mount", "code"),
    [("nvcr.io/Bad Image", None, "bad-image"), (NGC, "data:/data", "bad-mount")],
)
def test_a_bad_image_or_mount_is_refused_by_the_plan(image, mount, code) -> None:
    with pytest.raises(VmrunError) as caught:
        _plan(image, (mount,) if mount else ())
    assert caught.value.code == code


def test_a_run_without_an_image_is_unchanged() -> None:
    sub, login = _prepare([], plan=_plan("", ()))
    assert login.ran == ["slurm_probe.sh"]  # no detection
    assert _array(sub.script, "VMRUN_PREFIX") == [] and _array(sub.script, "VMRUN_SRUN") == []
    assert "image" not in sub.record.to_json()


def test_a_clusters_table_takes_the_container_keys(tmp_path: Path) -> None:
    from vmrun.backends.slurm.cluster import project_clusters
    from vmrun.config import load_settings

    (tmp_path / "vmrun.toml").write_text(
        '[[clusters]]\nname = "perlmutter"\nlogin = "u@login"\n'
        'image = "nersc/pytorch:ngc-23.07-v0"\ncontainer_runtime = "shifter"\n'
        'mounts = ["/global/cfs:/cfs"]\n'
    )
    settings = load_settings({}, cwd=tmp_path)
    (cluster,) = project_clusters(settings)
    assert cluster.containers["container_runtime"] == "shifter"
    (tmp_path / "vmrun.toml").write_text(
        '[[clusters]]\nname = "c"\nlogin = "u@login"\ncontainer_runtime = "singularity"\n'
    )
    with pytest.raises(VmrunError) as caught:
        load_settings({}, cwd=tmp_path)
    assert caught.value.code == "bad-config"
