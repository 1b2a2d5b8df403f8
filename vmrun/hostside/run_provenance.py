"""Beside a run on its host: what the run ran on (its Python and packages, torch's build, the
machine and its GPUs, the Slurm allocation), so a result can be traced back and rebuilt.

    python run_provenance.py REC [--per-node] [--hardware-only]

Started detached with the run's own interpreter, so `sys.executable` is the Python described.
Writes REC/provenance.json (the facts), REC/environment.txt (`pip install -r`-able, or the
conda env export) and REC/versions.json (one line: the versions a report shows). With
--per-node (a Slurm job; REC is shared by its nodes) each node writes
REC/provenance-<hostname>.json, and only node 0 the other two. --hardware-only (a run in a
container image, whose digest names its packages): the host's interpreter describes the
machine alone, and there is no environment.txt. Each file is written whole
(NAME.tmp.<pid>, then renamed). Stdlib only, Python 3.8+; torch is never imported here (a
child does, only for a CUDA build's NCCL and cuDNN versions). A part that fails records
"error" in its place and the rest goes on; exit 0 always: provenance never fails a run.
No environment variable is recorded but the SLURM_* ones named below.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

SCHEMA = 1
SMI_TIMEOUT_S = 10
SCONTROL_TIMEOUT_S = 10
CONDA_TIMEOUT_S = 60
TORCH_TIMEOUT_S = 120
GPU_FIELDS = "index,name,memory.total,driver_version,uuid"
SLURM_VARS = {
    "job_id": ("SLURM_JOB_ID",),
    "node_list": ("SLURM_JOB_NODELIST",),
    "num_nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "partition": ("SLURM_JOB_PARTITION",),
    "account": ("SLURM_JOB_ACCOUNT",),
    "qos": ("SLURM_JOB_QOS",),
    "cpus_on_node": ("SLURM_CPUS_ON_NODE",),
    "job_cpus_per_node": ("SLURM_JOB_CPUS_PER_NODE",),
    "mem_per_node": ("SLURM_MEM_PER_NODE",),
    "gpus_on_node": ("SLURM_GPUS_ON_NODE",),
    "node_id": ("SLURM_NODEID",),
    "restart_count": ("SLURM_RESTART_COUNT",),
}
# In a child: torch's own NCCL and cuDNN versions (only a CUDA build has them). The last
# line of stdout is the answer; importing torch may print warnings before it.
TORCH_CHILD = """
import json
import torch
out = {"nccl": None, "cudnn": None}
try:
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
except Exception as exc:
    out["error"] = "nccl: %s: %s" % (type(exc).__name__, exc)
try:
    out["cudnn"] = torch.backends.cudnn.version()
except Exception as exc:
    out["error"] = "cudnn: %s: %s" % (type(exc).__name__, exc)
print()
print(json.dumps(out))
"""


def one_line(what) -> str:
    """An error, or a tool's complaint, as one short line."""
    if isinstance(what, BaseException):
        what = f"{type(what).__name__}: {what}"
    lines = [line.strip() for line in str(what).splitlines() if line.strip()]
    return (lines[0] if lines else "no message")[:300]


def run(argv: list, timeout: float) -> subprocess.CompletedProcess:
    """A tool's output; stdin is /dev/null so nothing waits on a terminal."""
    return subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
    )


def failure(proc: subprocess.CompletedProcess) -> str:
    return one_line(proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def safely(part, *args):
    """A part's facts, or {"error": ...} in their place."""
    try:
        return part(*args)
    except Exception as exc:
        return {"error": one_line(exc)}


def to_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except (ValueError, AttributeError):
        return None


def hostname() -> str:
    return socket.gethostname()


# -- environment ------------------------------------------------------------------------------


def python_facts() -> dict:
    return {
        "executable": sys.executable,
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "prefix": sys.prefix,
        "virtualenv": sys.prefix != sys.base_prefix,
    }


def manager() -> str:
    """conda when the prefix is a conda env, uv when uv made the venv, else pip."""
    if os.path.isdir(os.path.join(sys.prefix, "conda-meta")):
        return "conda"
    cfg = read_text(os.path.join(sys.prefix, "pyvenv.cfg")) or ""
    if any(re.match(r"uv\s*=", line) for line in cfg.splitlines()):
        return "uv"
    return "pip"


def normalize(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


# packages and environment.txt: one walk of sys.path (functools.cache is Python 3.9+)
@functools.lru_cache(maxsize=None)  # noqa: UP033
def distributions() -> dict:
    """{normalized name: (name as its metadata spells it, version)}: the first of each name on
    sys.path, the one an import would find."""
    found = {}
    for dist in importlib.metadata.distributions():
        try:
            name, version = dist.metadata["Name"], dist.version
        except Exception:
            continue
        if name and normalize(name) not in found:
            found[normalize(name)] = (name, version)
    return found


def version_py(text: str) -> dict:
    """`__version__`, `cuda`, `hip`, `git_version` from torch/version.py's assignments
    (`cuda: Optional[str] = '12.4'`, `hip = None`); anything but a literal is null."""
    facts: dict = {"version": None, "cuda": None, "hip": None, "git_version": None}
    keys = {"__version__": "version", "cuda": "cuda", "hip": "hip", "git_version": "git_version"}
    pattern = r"^(__version__|cuda|hip|git_version)\s*(?::[^=\n]*)?=\s*(.+?)\s*$"
    for name, value in reversed(re.findall(pattern, text, re.MULTILINE)):
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            literal = None
        facts[keys[name]] = literal if isinstance(literal, str) else None
    return facts


def torch_dir() -> str | None:
    try:
        spec = importlib.util.find_spec("torch")
    except Exception:
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return next(iter(spec.submodule_search_locations))
    return os.path.dirname(spec.origin) if spec.origin else None


def cpu_build():
    """torch's version where its version.py says a CPU build (`cuda` and `hip` both None:
    it sees no GPU and has no NCCL), read without importing torch (2-3 s of CPU); else None
    (no torch, no readable file, or a build that may see GPUs: import it to ask)."""
    where = torch_dir()
    text = read_text(os.path.join(where, "version.py")) if where else None
    if not text or len(re.findall(r"^(?:cuda|hip)\s*(?::[^=\n]*)?=\s*None\s*$", text, re.M)) < 2:
        return None
    return version_py(text)["version"]


def torch_child() -> dict:
    """NCCL and cuDNN versions, from a child that imports torch (this process never does)."""
    try:
        proc = run([sys.executable, "-c", TORCH_CHILD], TORCH_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": one_line(exc)}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": failure(proc)}
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return {"error": "torch child: " + one_line(lines[-1])}
    return answer


def torch_facts() -> dict | None:
    """torch's build, read from its version.py: null when torch is not there."""
    where = torch_dir()
    if where is None:
        return None
    text = read_text(os.path.join(where, "version.py"))
    facts = version_py(text or "")
    facts.update(nccl=None, cudnn=None)
    if text is None:
        facts["error"] = f"no readable version.py in {where}"
    elif facts["cuda"]:
        facts.update(torch_child())
    return facts


def environment() -> dict:
    env = {"python": python_facts(), "manager": "pip", "packages": {}, "torch": None}
    env["manager"] = manager()
    try:
        env["packages"] = {key: version for key, (_, version) in distributions().items()}
    except Exception as exc:
        env["error"] = one_line(exc)
    env["torch"] = safely(torch_facts)
    return env


# -- hardware ---------------------------------------------------------------------------------


def os_name() -> str | None:
    for line in (read_text("/etc/os-release") or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PRETTY_NAME":
            return value.strip().strip("\"'") or None
    return None


def cpu() -> dict:
    model = None
    for line in (read_text("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
            break
    count = os.cpu_count()
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = count
    return {"model": model, "count": count, "usable": usable}


def memory_bytes() -> int | None:
    for line in (read_text("/proc/meminfo") or "").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "MemTotal:":
            kib = to_int(fields[1])
            return None if kib is None else kib * 1024
    return None


def gpu_row(line: str) -> dict | None:
    """One CSV row; the name is whatever lies between index and the last three fields."""
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) < 5:
        return None
    return {
        "index": to_int(cells[0]),
        "name": ", ".join(cells[1:-3]),
        "memory_mib": to_int(cells[-3]),
        "driver": cells[-2],
        "uuid": cells[-1],
    }


def gpus() -> tuple:
    """(the GPUs nvidia-smi lists, or [], and why it could not list them, or None)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None
    argv = [smi, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"]
    try:
        proc = run(argv, SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], one_line(exc)
    if proc.returncode != 0:
        return [], failure(proc)
    rows = [gpu_row(line) for line in proc.stdout.splitlines() if line.strip()]
    return [row for row in rows if row is not None], None


def hardware() -> dict:
    found, error = gpus()
    facts = {
        "hostname": hostname(),
        "fqdn": socket.getfqdn(),
        "os": os_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu": safely(cpu),
        "memory_bytes": memory_bytes(),
        "gpus": found,
        "driver": found[0]["driver"] if found else None,
    }
    if error is not None:
        facts["gpu_error"] = error
    return facts


# -- Slurm ------------------------------------------------------------------------------------


def first_node() -> bool:
    return os.environ.get("SLURM_NODEID", "0") == "0"


def scontrol(*args: str) -> tuple:
    """(scontrol's stdout, or None, and why not, or None)."""
    tool = shutil.which("scontrol")
    if tool is None:
        return None, "no scontrol on PATH"
    try:
        proc = run([tool, *args], SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, one_line(exc)
    if proc.returncode != 0:
        return None, failure(proc)
    return proc.stdout, None


def slurm() -> dict | None:
    """The job's allocation as Slurm states it; null outside a Slurm job."""
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        return None
    facts = {}
    for key, names in SLURM_VARS.items():
        facts[key] = next((os.environ[n] for n in names if n in os.environ), None)
    facts.update(nodes=None, alloc_tres=None)
    errors = []
    if facts["node_list"]:
        out, error = scontrol("show", "hostnames", facts["node_list"])
        facts["nodes"] = None if out is None else out.split()
        errors.append(error)
    if first_node():
        out, error = scontrol("show", "job", "-o", job)
        # `TRES=` is what scontrol calls the allocated TRES (sacct: AllocTRES)
        found = re.search(r"(?:\bAlloc|\s|^)TRES=(\S+)", out or "")
        facts["alloc_tres"] = found.group(1) if found else None
        errors.append(error)
    errors = [error for error in errors if error]
    if errors:
        facts["error"] = errors[0]
    return facts


# -- outputs ----------------------------------------------------------------------------------


def conda_binary() -> str | None:
    exe = os.environ.get("CONDA_EXE")
    if exe and os.path.isfile(exe) and os.access(exe, os.X_OK):
        return exe
    candidates = [
        shutil.which("conda"),
        os.path.join(sys.prefix, "..", "..", "bin", "conda"),
        os.path.join(sys.prefix, "bin", "conda"),
    ]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def without_variables(export: str) -> str:
    """An env export less its `variables:` block: env vars set on activation may be secrets."""
    kept, skipping = [], False
    for line in export.splitlines(keepends=True):
        if line[:1] not in (" ", "\t", "-", ""):
            skipping = line.startswith("variables:")
        if not skipping:
            kept.append(line)
    return "".join(kept)


def conda_export() -> tuple:
    """(`conda env export` of this prefix, or None, and why not, or None)."""
    conda = conda_binary()
    if conda is None:
        return None, "no conda found"
    try:
        proc = run([conda, "env", "export", "-p", sys.prefix], CONDA_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, one_line(exc)
    if proc.returncode != 0:
        return None, failure(proc)
    return without_variables(proc.stdout), None


def header(env: dict, recorded: float) -> list:
    py = env.get("python") or python_facts()
    lines = [
        f"# python {py['version']} {py['implementation']} ({py['executable']})",
        f"# manager: {env.get('manager') or 'pip'}",
    ]
    torch = env.get("torch")
    if torch and torch.get("version"):
        lines.append(f"# torch {torch['version']} (cuda {torch.get('cuda') or 'none'})")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(recorded))
    lines.append(f"# recorded on {hostname()} at {when}")
    return lines


def requirements() -> list:
    """`Name==version` lines, as pip freeze spells them, sorted by name."""
    dists = sorted(distributions().values(), key=lambda item: item[0].lower())
    return [f"{name}=={version}" for name, version in dists]


def environment_txt(env: dict, recorded: float) -> str:
    lines = header(env, recorded)
    if env.get("manager") == "conda":
        export, why = conda_export()
        if export is not None:
            return "\n".join(lines) + "\n" + export
        lines.append(f"# conda env export failed: {why}")
    try:
        lines.extend(requirements())
    except Exception as exc:
        lines.append(f"# packages not listed: {one_line(exc)}")
    return "\n".join(lines) + "\n"


def versions(facts: dict) -> dict:
    env, hw = facts["environment"], facts["hardware"]
    torch = env.get("torch") or {}
    found = hw.get("gpus") or []
    return {
        "python": None
        if env.get("in_image")
        else (env.get("python") or {}).get("version", platform.python_version()),
        "torch": torch.get("version"),
        "cuda": torch.get("cuda"),
        "nccl": torch.get("nccl"),
        "gpu": found[0]["name"] if found else None,
        "gpus": len(found),
        "driver": hw.get("driver"),
    }


def write(rec: str, name: str, text: str) -> None:
    """REC/NAME whole or not at all: a reader never sees half a file."""
    tmp = os.path.join(rec, f"{name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(rec, name))
    except OSError as exc:
        print(f"run_provenance: {name}: {one_line(exc)}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def collect(hardware_only: bool = False) -> dict:
    """`hardware_only`: the run's Python is an image's (described by its digest in run.json);
    this interpreter is the host's and describes nothing of the run's."""
    return {
        "schema": SCHEMA,
        "recorded": time.time(),
        "node": hostname(),
        "environment": {"in_image": True} if hardware_only else safely(environment),
        "hardware": safely(hardware),
        "slurm": safely(slurm),
    }


def main(argv: list) -> None:
    per_node = "--per-node" in argv
    hardware_only = "--hardware-only" in argv
    args = [arg for arg in argv if arg not in ("--per-node", "--hardware-only")]
    if len(args) != 1:
        print("usage: run_provenance.py REC [--per-node] [--hardware-only]", file=sys.stderr)
        return
    rec = args[0]
    facts = collect(hardware_only)
    name = f"provenance-{hostname().replace('/', '_')}.json" if per_node else "provenance.json"
    write(rec, name, json.dumps(facts, indent=1, sort_keys=True) + "\n")
    if per_node and not first_node():
        return
    parts = [("versions.json", lambda: json.dumps(versions(facts), sort_keys=True) + "\n")]
    if not hardware_only:  # an image's packages are its digest's
        env_txt = lambda: environment_txt(facts["environment"], facts["recorded"])  # noqa: E731
        parts.insert(0, ("environment.txt", env_txt))
    for part, make in parts:
        try:
            write(rec, part, make())
        except Exception as exc:
            print(f"run_provenance: {part}: {one_line(exc)}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as exc:
        print(f"run_provenance: {one_line(exc)}", file=sys.stderr)
    sys.exit(0)
