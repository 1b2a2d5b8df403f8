"""The GPU path on a machine with an NVIDIA GPU, for real: what the test bed stands in for.

    python3 benchmarks/gpu_path.py

1. vmrun's nvidia-smi command (vmrun/hostside/gpus_watch.bash, the argv watch-gpus and
   autostop run on every host) against the real nvidia-smi, its rows read by vmrun's parser;
   then `nvidia-smi -q` and the kernel log through vmrun.gpus.health;
2. `vmrun train --local` with the template trainer on CUDA (torchrun, nccl), to its results;
3. `vmrun doctor`'s all-reduce (vmrun/trainer/allreduce.py) under torchrun, on nccl, with
   NCCL's INIT/NET lines in a file as vmrun's runs have them, read by the hang watcher's
   reader (the network NCCL chose; the RDMA devices here);
4. the host's health as `doctor` and `train` read it (vmrun/hostside/gpu_health.sh), and
   a live NCCL rank's stack by hostside/stacks.py (py-spy: `pip install py-spy` first).
Prints one line per step and exits non-zero on the first that fails; without nvidia-smi or
a CUDA torch it says so in one line and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step(name: str, argv: list[str], cwd: Path, timeout: float = 600) -> str:
    start = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"gpu_path: {name} failed with exit {done.returncode}")
    print(f"gpu_path: {name}: ok in {took:.1f} s")
    return done.stdout + done.stderr


def health(smi: str, count: int) -> None:
    """`nvidia-smi -q` and the kernel log through vmrun.gpus.health (the parsers the test
    suite checks on recorded outputs): each GPU's problems and the Xids, printed."""
    from vmrun.gpus.health import parse_query, parse_xids

    text = step("nvidia-smi -q", [smi, "-q"], ROOT, 60)
    found = parse_query(text)
    if len(found) != count:
        raise SystemExit(f"gpu_path: vmrun.gpus.health read {len(found)} GPU(s), not {count}")
    for gpu in found:
        said = "; ".join(f"{p.level}: {p.text}" for p in gpu.problems()) or "no problem"
        print(
            f"gpu_path: health {gpu.bus} {gpu.name} pcie gen {gpu.pcie_gen} width"
            f" {gpu.pcie_width} persistence {gpu.persistence}: {said}"
        )
    log = subprocess.run(["dmesg"], capture_output=True, text=True)
    if log.returncode != 0:
        print(f"gpu_path: dmesg not readable here ({log.stderr.strip()[:100]}): no Xids read")
        return
    xids = parse_xids(log.stdout)
    print(
        f"gpu_path: {len(xids)} kind(s) of Xid in the kernel log"
        + "".join(f"; Xid {x.code} x{x.count} on {x.bus} ({x.level})" for x in xids)
    )


def main() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("gpu_path: no nvidia-smi here: run this on a machine with an NVIDIA GPU")
        return 0
    probe = "import torch; print(torch.cuda.is_available(), torch.__version__)"
    has = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if not has.stdout.startswith("True"):
        why = has.stdout.strip() or has.stderr[-200:]
        print(f"gpu_path: no CUDA torch for {sys.executable}: {why}")
        return 0
    sys.path.insert(0, str(ROOT))
    from vmrun.gpus.nvidia_smi import parse_gpu_line, watch_argv

    rows = step("nvidia-smi through gpus_watch.bash", watch_argv(smi, None), ROOT, 60)
    gpus = [g for g in map(parse_gpu_line, rows.splitlines()) if g is not None]
    if not gpus:
        raise SystemExit(f"gpu_path: vmrun's parser read no GPU from:\n{rows}")
    for g in gpus:
        print(f"gpu_path: parsed {json.dumps(g.to_json())}")
    health(smi, len(gpus))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out = step(
            "vmrun train --local (template, CUDA)",
            [sys.executable, "-m", "vmrun", "train", "--local", "--epochs", "3", "--save-every=1"],
            work,
        )
        tail = [line for line in out.splitlines() if "epoch" in line.lower()][-3:]
        print("\n".join(f"gpu_path:   {line}" for line in tail))
        runs = sorted((work / "results").glob("*/run.json"))
        if not runs:
            raise SystemExit("gpu_path: train --local left no results/<run>/run.json")
        print(f"gpu_path: results: {sorted(p.name for p in runs[-1].parent.iterdir())}")
        allreduce = ROOT / "vmrun" / "trainer" / "allreduce.py"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        n = str(len(gpus))
        nccl = work / "nccl"
        nccl.mkdir()
        os.environ.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=f"{nccl}/%h.%p.log"
        )
        out = step("all-reduce (nccl)", [*torchrun, "--nproc-per-node", n, str(allreduce)], work)
        print("\n".join(f"gpu_path:   {x}" for x in out.splitlines() if "allreduce" in x))
        network(work)
    host_health()
    live_stack()
    return 0


def network(work: Path) -> None:
    """NCCL's network as the run's watcher reads it from NCCL's debug files."""
    sys.path.insert(0, str(ROOT / "vmrun" / "hostside"))
    import hang_watch  # type: ignore[import-not-found]

    transport = hang_watch.Transport(str(work))
    print(
        f"gpu_path: NCCL's network {transport.seen() or '(not said)'}; RDMA devices here:"
        f" {transport.rdma() or 'none'}; {transport.warning() or 'no warning'}"
    )


def host_health() -> None:
    """The host's health as vmrun reads it on every host (gpu_health.sh, parse_host)."""
    from vmrun.gpus.health import parse_host

    text = step("gpu_health.sh", ["sh", str(ROOT / "vmrun/hostside/gpu_health.sh")], ROOT, 60)
    health = parse_host(text)
    print(
        f"gpu_path: host health: {len(health.gpus)} GPU(s), kernel log {health.kernel},"
        f" worst {health.worst or 'none'}, flags {health.flags()}; "
        + ("; ".join(health.lines()) or "no problem")
    )


def live_stack() -> None:
    """A rank in an NCCL all_reduce loop, its stack read as `vmrun stacks` reads it."""
    if shutil.which("py-spy") is None:
        print("gpu_path: no py-spy here (pip install py-spy): live stacks not read")
        return
    loop = (
        "import os, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('nccl'); torch.cuda.set_device(0)\n"
        "t = torch.ones(1 << 20, device='cuda')\n"
        "end = time.time() + 20\n"
        "while time.time() < end: dist.all_reduce(t); torch.cuda.synchronize()\n"
    )
    env = dict(
        os.environ,
        VMRUN_RUN_ID="gpu-path",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29517",
    )
    proc = subprocess.Popen([sys.executable, "-c", loop], env=env)
    try:
        time.sleep(8)
        said = step(
            "stacks.py (py-spy)",
            [sys.executable, str(ROOT / "vmrun/hostside/stacks.py"), "gpu-path"],
            ROOT,
            60,
        )
        from vmrun.runs.stacks import lines, parse

        print("\n".join(f"gpu_path:   {x}" for x in lines(parse(said, "here"))))
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
