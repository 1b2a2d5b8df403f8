"""The variables every step script gets: params, facts, the interpreter, pip's index options.

Kept apart from running steps because it is pure: the same facts and options always give the
same environment, which is what --dry-run shows and what the fingerprints rely on.
"""

from __future__ import annotations

from collections.abc import Mapping

from vmrun import remote_paths
from vmrun.errors import RemoteError, UsageError
from vmrun.setup.facts import Facts
from vmrun.setup.report import SetupOptions

TORCH_INDEX = "https://download.pytorch.org/whl/"
ENV_MANAGERS = ("venv", "uv", "conda", "python")  # python: an interpreter the host has

# Which PyTorch CUDA wheel index suits a host, from the CUDA version its driver reports
# (nvidia-smi's "CUDA Version") and its oldest GPU's compute capability. Why, since this ages:
# * CUDA minor-version compatibility: a driver that runs CUDA 12.0 (R525+) runs every 12.x
#   runtime, and an 11.x driver (R450+) every 11.x one, so a 12.2 driver gets the newest 12.x
#   build, not the one at or below 12.2 (PyTorch's own maintainers run cu128 on 12.4 drivers).
# * The CUDA 12 builds PyTorch publishes now are cu126 and cu128 (cu129 was 2.8 only; cu118
#   ended with 2.7, cu121/cu124 earlier): cu128 is the newest every release since 2.7 carries.
# * cu128 and the CUDA 13 builds ship kernels for Turing (7.5) and newer only; cu126 is the last
#   with Maxwell, Pascal and Volta (5.0-7.0), so those GPUs get cu126 on any 12.x or 13.x driver.
# * A 13.x driver with a Turing or newer GPU needs no index: PyPI's default torch is CUDA 13.
_CUDA12_INDEX = "cu128"
_CUDA12_LEGACY_GPU_INDEX = "cu126"
_CUDA11_INDEX = "cu118"
_OLDEST_CURRENT_ARCH = (7, 5)


def _version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = (int(p) for p in text.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def cuda_index(cuda_driver: str, compute_cap: str = "") -> str | None:
    """The torch wheel index for a driver's CUDA version and the oldest GPU (see the table's
    notes above); None means PyPI's default (the CUDA 13 build) or an unknown driver."""
    have = _version(cuda_driver)
    if have is None:
        return None
    cap = _version(compute_cap)
    if have >= (12, 0) and cap is not None and cap < _OLDEST_CURRENT_ARCH:
        return TORCH_INDEX + _CUDA12_LEGACY_GPU_INDEX
    if have >= (13, 0):
        return None
    if have >= (12, 0):
        return TORCH_INDEX + _CUDA12_INDEX
    if have >= (11, 0):
        return TORCH_INDEX + _CUDA11_INDEX
    raise RemoteError(
        f"the NVIDIA driver supports CUDA {cuda_driver} only; torch wheels need 11.0 or newer",
        hint="install a newer driver branch",
        code="driver-too-old",
    )


def python_path(params: Mapping[str, str], facts: Facts, root: str = "") -> str:
    """The interpreter the env manager makes (or, for env=python, the one given); venv and
    uv envs go under `root` when given (a cluster's workdir on its shared filesystem, so the
    compute nodes see them), else under the home. conda's stay in ~/miniconda3."""
    env = params.get("env", "venv")
    name = params.get("env_name", "vmrun") or "vmrun"
    if env == "python":
        if not params.get("python"):
            raise UsageError("env=python needs --python PATH (the interpreter to use)")
        return facts.absolute(params["python"])
    if env == "conda":
        return facts.absolute(f"miniconda3/envs/{name}/bin/python")
    where = f"{root.rstrip('/')}/{remote_paths.ENVS_DIR}" if root else remote_paths.ENVS_DIR
    return facts.absolute(f"{where}/{name}/bin/python")


def environment(
    opts: SetupOptions, params: Mapping[str, str], facts: Facts, python: str, run_token: str
) -> dict[str, str]:
    """Every VMRUN_* variable a step script sees (playbooks/default.yaml's header lists them)."""
    env = {f"VMRUN_{k.upper()}": v for k, v in params.items()}
    wheelhouse = facts.absolute(remote_paths.WHEELHOUSE) if opts.wheelhouse else ""
    installer = (
        facts.absolute(f"{remote_paths.INSTALLERS}/{opts.installer.name}") if opts.installer else ""
    )
    env.update(
        {
            "VMRUN_PYTHON": python,
            "VMRUN_GPU": "1" if facts.has_gpu else "0",
            "VMRUN_OS_RELEASE": facts.os_release,
            "VMRUN_CUDA_DRIVER": facts.cuda_driver,
            "VMRUN_WHEELHOUSE": wheelhouse,
            "VMRUN_INSTALLER": installer,
            "VMRUN_SUDO": facts.sudo_prefix,
            "VMRUN_SETUP_RUN": run_token,
            "VMRUN_APT_MARK": facts.absolute(remote_paths.SETUP_APT_MARK),
            "VMRUN_TOOLS_DIR": facts.absolute(remote_paths.TOOLS_DIR),
            "VMRUN_PIP_INDEX_ARGS": " ".join(
                pip_index_args(opts, params, facts, wheelhouse, torch=True)
            ),
            "VMRUN_PIP_EXTRA_ARGS": " ".join(
                pip_index_args(opts, params, facts, wheelhouse, torch=False)
            ),
            "DEBIAN_FRONTEND": "noninteractive",
            "PIP_NO_INPUT": "1",
            # one retry for a blip, not five: a host with no way out fails in seconds, and
            # says why once (vmrun.setup.offline), instead of five retry warnings
            "PIP_RETRIES": "1",
        }
    )
    return env


def pip_index_args(
    opts: SetupOptions, params: Mapping[str, str], facts: Facts, wheelhouse: str, *, torch: bool
) -> list[str]:
    """pip's index options: the wheelhouse and the user's indexes first; for torch, the wheel
    index that matches the driver (a CPU host gets the CPU build, never the CUDA one)."""
    args: list[str] = []
    if wheelhouse:
        args += ["--no-index", "--find-links", wheelhouse]
    for link in opts.find_links:
        args += ["--find-links", link]
    if opts.index_url:
        args += ["--index-url", opts.index_url]
    if wheelhouse or opts.index_url or not torch:
        return args
    choice = params.get("torch_index", "auto")
    if choice == "none":
        return args
    if choice != "auto":
        return [*args, "--index-url", choice]
    if not facts.has_gpu and opts.cluster:
        # a login node without GPUs builds for the compute nodes, whose driver it cannot
        # see: the CUDA 12 build runs on every 12.x and 13.x driver (--torch-index to choose)
        return [*args, "--index-url", TORCH_INDEX + _CUDA12_INDEX]
    if not facts.has_gpu:
        return [*args, "--index-url", TORCH_INDEX + "cpu"]  # never the multi-GB CUDA build
    index = cuda_index(facts.cuda_driver, facts.compute_cap) if facts.cuda_driver else None
    return [*args, "--index-url", index] if index else args
