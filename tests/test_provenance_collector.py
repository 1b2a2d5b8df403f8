"""vmrun/hostside/run_provenance.py, run as a host runs it: this interpreter, a child process,
a bare environment (HOME in tmp, PATH = a folder of stand-ins + /usr/bin:/bin). The GPUs are
the nvidia-smi STAND-IN (tests/standins/nvidia-smi) replaying a recording; Slurm's `scontrol`
and torch are small stand-ins written here, each saying so."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT

import vmrun.hostside

HOSTSIDE = Path(vmrun.hostside.__file__).parent
SCRIPT = HOSTSIDE / "run_provenance.py"
SMI_STANDIN = ROOT / "tests" / "standins" / "nvidia-smi"
SMI_FIXTURES = ROOT / "tests" / "fixtures" / "nvidia_smi"
SECRET = "s3cr3t-value-123"

# Made up for these tests (two H100s as nvidia-smi prints them), in the stand-in's format.
TWO_H100 = """\
# MADE UP for tests/test_provenance_collector.py: two H100s, one driver; UUIDs invented.
# fields: index,name,memory.total,driver_version,uuid
0, NVIDIA H100 80GB HBM3, 81559, 550.54.15, GPU-aaa
1, NVIDIA H100 80GB HBM3, 81559, 550.54.15, GPU-bbb
"""

SCONTROL = """\
#!/bin/sh
# STAND-IN for Slurm's scontrol, for tests/test_provenance_collector.py only: job 42 on n[1-2].
echo "$*" >> "$(dirname "$0")/scontrol.log"
case "$*" in
  "show hostnames n[1-2]") printf 'n1\\nn2\\n' ;;
  "show job -o 42") printf '%s %s\\n' "JobId=42 Partition=debug ReqTRES=cpu=1,node=1" \\
    "AllocTRES=cpu=4,mem=1G,node=2 Nodes=2" ;;
  *) echo "scontrol stand-in: nothing recorded for: $*" >&2; exit 1 ;;
esac
"""

# STAND-IN torch: records who imported it (sys.argv[0]: the collector's path, or "-c" for its
# child) in `imported` beside the package. The CPU build refuses to be imported at all.
TORCH_INIT_CPU = """\
import os, sys
with open(os.path.join(os.path.dirname(__file__), "..", "imported"), "a") as fh:
    fh.write(sys.argv[0] + "\\n")
raise ImportError("torch stand-in: the collector must not import torch")
"""
TORCH_INIT_CUDA = """\
import os, sys, types
with open(os.path.join(os.path.dirname(__file__), "..", "imported"), "a") as fh:
    fh.write(sys.argv[0] + "\\n")
cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 21, 5)))
backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 90100))
"""


def bin_dir(tmp: Path) -> Path:
    """The stand-ins' folder; python3 is this interpreter, for the nvidia-smi stand-in."""
    where = tmp / "bin"
    where.mkdir(exist_ok=True)
    if not (where / "python3").exists():
        (where / "python3").symlink_to(sys.executable)
    return where


def collect(tmp: Path, *flags: str, **env: str) -> tuple[Path, subprocess.CompletedProcess]:
    """Run the collector on a fresh record folder under tmp; its exit is always 0."""
    rec = tmp / "rec"
    rec.mkdir(exist_ok=True)
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    base = {"HOME": str(home), "PATH": f"{bin_dir(tmp)}:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(rec), *flags],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return rec, proc


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def expected_manager() -> str:
    if (Path(sys.prefix) / "conda-meta").is_dir():
        return "conda"
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    lines = cfg.read_text().splitlines() if cfg.is_file() else []
    return "uv" if any(line.replace(" ", "").startswith("uv=") for line in lines) else "pip"


def smi(tmp: Path, recording: str) -> dict[str, str]:
    """The nvidia-smi stand-in on PATH, replaying `recording` (query-gpu.txt's text)."""
    shutil.copy(SMI_STANDIN, bin_dir(tmp) / "nvidia-smi")
    replay = tmp / "replay"
    replay.mkdir()
    (replay / "query-gpu.txt").write_text(recording)
    return {"NVIDIA_SMI_STANDIN_REPLAY": str(replay)}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run with no GPU and no Slurm, a secret in its environment."""
    tmp = tmp_path_factory.mktemp("plain")
    if shutil.which("nvidia-smi", path=f"{bin_dir(tmp)}:/usr/bin:/bin"):
        pytest.skip("this machine has an nvidia-smi in /usr/bin or /bin")
    rec, _ = collect(tmp, TOKEN=SECRET)
    return rec


def test_without_gpu_or_slurm_it_records_python_packages_and_machine(plain: Path) -> None:
    facts = load(plain / "provenance.json")
    assert facts["schema"] == 1
    assert facts["node"] == socket.gethostname()
    env, hw = facts["environment"], facts["hardware"]
    assert env["python"]["executable"] == sys.executable
    assert env["python"]["version"] == platform.python_version()
    assert env["manager"] == expected_manager()
    pytest_version = importlib.metadata.version("pytest")
    assert env["packages"]["pytest"] == pytest_version
    assert hw["gpus"] == [] and hw["driver"] is None and "gpu_error" not in hw
    assert hw["cpu"]["count"] == os.cpu_count()
    assert 0 < hw["cpu"]["usable"] <= hw["cpu"]["count"]
    assert hw["memory_bytes"] > 0
    assert facts["slurm"] is None
    text = (plain / "environment.txt").read_text(encoding="utf-8")
    assert text.startswith("# python ")
    if expected_manager() != "conda":
        assert f"pytest=={pytest_version}" in text.splitlines()
    versions = (plain / "versions.json").read_text(encoding="utf-8")
    assert versions.count("\n") == 1
    assert json.loads(versions)["gpus"] == 0
    assert json.loads(versions)["python"] == platform.python_version()
    assert sorted(p.name for p in plain.iterdir()) == [
        "environment.txt",
        "provenance.json",
        "versions.json",
    ]


def test_no_environment_variable_is_recorded(plain: Path) -> None:
    for path in plain.iterdir():
        assert SECRET not in path.read_text(encoding="utf-8"), path.name


def test_gpus_from_nvidia_smi(tmp_path: Path) -> None:
    rec, _ = collect(tmp_path, **smi(tmp_path, TWO_H100))
    hw = load(rec / "provenance.json")["hardware"]
    assert [gpu["index"] for gpu in hw["gpus"]] == [0, 1]
    assert [gpu["uuid"] for gpu in hw["gpus"]] == ["GPU-aaa", "GPU-bbb"]
    assert {gpu["memory_mib"] for gpu in hw["gpus"]} == {81559}
    assert {gpu["driver"] for gpu in hw["gpus"]} == {"550.54.15"}
    assert hw["driver"] == "550.54.15"
    versions = load(rec / "versions.json")
    assert versions["gpu"] == "NVIDIA H100 80GB HBM3"
    assert (versions["gpus"], versions["driver"]) == (2, "550.54.15")


def test_a_failing_nvidia_smi_is_an_error_not_a_failure(tmp_path: Path) -> None:
    recording = (SMI_FIXTURES / "driver_not_loaded" / "query-gpu.txt").read_text()
    rec, _ = collect(tmp_path, **smi(tmp_path, recording))
    hw = load(rec / "provenance.json")["hardware"]
    assert hw["gpus"] == [] and hw["driver"] is None
    assert "couldn't communicate with the NVIDIA driver" in hw["gpu_error"]
    assert load(rec / "versions.json")["gpus"] == 0
    assert (rec / "environment.txt").read_text(encoding="utf-8").startswith("# python ")


def test_per_node_in_a_slurm_job(tmp_path: Path) -> None:
    scontrol = bin_dir(tmp_path) / "scontrol"
    scontrol.write_text(SCONTROL)
    scontrol.chmod(0o755)
    job = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_PARTITION": "debug"}
    mine = "provenance-" + socket.gethostname().replace("/", "_") + ".json"

    rec, _ = collect(tmp_path, "--per-node", SLURM_NODEID="1", **job)
    assert sorted(p.name for p in rec.iterdir()) == [mine]
    slurm = load(rec / mine)["slurm"]
    assert (slurm["job_id"], slurm["partition"], slurm["node_id"]) == ("42", "debug", "1")
    assert slurm["nodes"] == ["n1", "n2"]
    assert slurm["alloc_tres"] is None and slurm["account"] is None
    assert "error" not in slurm
    assert "show job" not in (tmp_path / "bin" / "scontrol.log").read_text()

    rec, _ = collect(tmp_path, "--per-node", SLURM_NODEID="0", **job)
    assert sorted(p.name for p in rec.iterdir()) == ["environment.txt", mine, "versions.json"]
    slurm = load(rec / mine)["slurm"]
    assert slurm["alloc_tres"] == "cpu=4,mem=1G,node=2"
    assert slurm["node_id"] == "0"


def fake_torch(tmp: Path, init: str, cuda: str) -> Path:
    site = tmp / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(init)
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n\n"
        "__version__ = '2.12.0+cpu'\n"
        f"cuda: Optional[str] = {cuda}\n"
        "git_version = 'abc'\n"
        "hip: Optional[str] = None\n"
    )
    meta = site / "torch-2.12.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    return site


def test_torch_facts_without_importing_torch(tmp_path: Path) -> None:
    site = fake_torch(tmp_path, TORCH_INIT_CPU, "None")
    rec, _ = collect(tmp_path, PYTHONPATH=str(site))
    env = load(rec / "provenance.json")["environment"]
    torch = env["torch"]
    assert (torch["version"], torch["git_version"]) == ("2.12.0+cpu", "abc")
    assert torch["cuda"] is None and torch["hip"] is None and torch["nccl"] is None
    assert env["packages"]["torch"] == "2.12.0"  # the stand-in's, first on sys.path
    assert not (site / "imported").exists()
    assert "# torch 2.12.0+cpu (cuda none)" in (rec / "environment.txt").read_text()
    assert load(rec / "versions.json")["torch"] == "2.12.0+cpu"


def test_a_cuda_build_asks_a_child_for_nccl_and_cudnn(tmp_path: Path) -> None:
    site = fake_torch(tmp_path, TORCH_INIT_CUDA, "'12.4'")
    rec, _ = collect(tmp_path, PYTHONPATH=str(site))
    torch = load(rec / "provenance.json")["environment"]["torch"]
    assert (torch["cuda"], torch["nccl"], torch["cudnn"]) == ("12.4", "2.21.5", 90100)
    assert (site / "imported").read_text().splitlines() == ["-c"]  # the child, only
    versions = load(rec / "versions.json")
    assert (versions["cuda"], versions["nccl"]) == ("12.4", "2.21.5")


def test_a_record_folder_that_is_gone_still_exits_0(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "gone")],
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0
    assert "provenance.json" in proc.stderr


@pytest.fixture(scope="module")
def module() -> ModuleType:
    """The collector's functions, loaded here (it runs nothing unless it is __main__)."""
    spec = importlib.util.spec_from_file_location("run_provenance", SCRIPT)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def test_version_py_and_gpu_rows_are_parsed(module: ModuleType) -> None:
    text = "__version__ = '2.5.1+rocm6.2'\ncuda = None\nhip: Optional[str] = '6.2.41133'\n"
    assert module.version_py(text) == {
        "version": "2.5.1+rocm6.2",
        "cuda": None,
        "hip": "6.2.41133",
        "git_version": None,
    }
    row = module.gpu_row("3, Tesla V100-SXM2-16GB, [N/A], 535.1, GPU-x")
    assert row == {
        "index": 3,
        "name": "Tesla V100-SXM2-16GB",
        "memory_mib": None,
        "driver": "535.1",
        "uuid": "GPU-x",
    }
    assert module.normalize("Foo_Bar..baz") == "foo-bar-baz"


# STAND-IN for `conda env export -p PREFIX`, with an activation variable that must not travel.
CONDA = """\
#!/bin/sh
# STAND-IN for conda, for tests/test_provenance_collector.py only.
[ "$1 $2 $3" = "env export -p" ] || exit 2
printf 'name: train\\nchannels:\\n  - conda-forge\\nvariables:\\n  TOKEN: %s\\n' "$SECRET"
printf 'dependencies:\\n  - python=3.11\\nprefix: %s\\n' "$4"
"""


def test_a_conda_env_is_exported_without_its_variables(
    module: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conda = tmp_path / "conda"
    conda.write_text(CONDA)
    conda.chmod(0o755)
    monkeypatch.setenv("CONDA_EXE", str(conda))
    monkeypatch.setenv("SECRET", SECRET)
    env = {"python": module.python_facts(), "manager": "conda", "torch": None}
    lines = module.environment_txt(env, 0.0).splitlines()
    assert lines[1:3] == [
        "# manager: conda",
        "# recorded on " + socket.gethostname() + " at 1970-01-01T00:00:00Z",
    ]
    assert lines[3:] == [
        "name: train",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        "  - python=3.11",
        f"prefix: {sys.prefix}",
    ]

    conda.write_text("#!/bin/sh\necho 'CondaError: broken' >&2\nexit 1\n")
    lines = module.environment_txt(env, 0.0).splitlines()
    assert "# conda env export failed: CondaError: broken" in lines
    assert f"pytest=={importlib.metadata.version('pytest')}" in lines


def test_hardware_only_for_a_run_in_an_image(tmp_path: Path) -> None:
    """The host's interpreter beside a run in a container: the machine and its GPUs, nothing
    of the host's Python (the image's digest in run.json names the run's packages)."""
    rec, done = collect(tmp_path, "--hardware-only", **smi(tmp_path, TWO_H100))
    assert done.returncode == 0, done.stderr
    facts = load(rec / "provenance.json")
    assert facts["environment"] == {"in_image": True}
    assert len(facts["hardware"]["gpus"]) == 2
    assert not (rec / "environment.txt").exists()
    versions = load(rec / "versions.json")
    assert (versions["python"], versions["torch"], versions["gpus"]) == (None, None, 2)
