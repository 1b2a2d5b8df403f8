"""Every rank of a run on this host, its Python stacks now (every thread), read by py-spy:

    python3 stacks.py RUN_ID [FOLDER]
    python3 stacks.py --tool        # where py-spy is (a line, empty if nowhere), the machine, $HOME
    python3 stacks.py --saved REC   # the newest hang's stacks (REC/stacks/hang-N), each
                                    # rank's flight recorder dump in REC/nccl ({"fr": ...}),
                                    # then {"hang": REC/hang's JSON or null}
    python3 stacks.py --read FOLDER # the stacks kept in FOLDER (several nodes' tasks wrote
                                    # there: their output, mixed by srun, is not read)

prints one JSON line per rank: {"rank", "local_rank", "pid", "host", "threads"} (py-spy's
`dump --json`: each thread's frames, innermost first), or the same with "error" in place of
"threads". With FOLDER, each line is also written there as rank-R.json. The last line is
{"done": N, "tool": PATH or ""}.

A rank is a process carrying the run's id (VMRUN_RUN_ID, as every process of the run does;
in a Slurm task, of this node: the same SLURMD_NODENAME) and a RANK (torchrun's workers,
`--launcher env`) whose parent is not one of them (a data loader's workers are their rank's
children); a run with no RANK (one plain process) has its topmost Python process as rank 0;
the run's agent (VMRUN_AGENT, run_agent.py) is never one.
py-spy is found as VMRUN_PY_SPY, beside the run's Python (`pip install py-spy` in the env),
in ~/.vmrun/tools (what vmrun sends), then on PATH. Where the kernel lets only a process's
ancestors trace it (Yama's ptrace_scope 1, Ubuntu's default) and this user is not root,
py-spy runs under `sudo -n` when plain py-spy is refused.
py-spy rather than faulthandler or gdb: it reads a process from outside (nothing installed
in it, no signal it might not survive), works while the process sits in C code such as a
collective, and gives every thread of any Python 3 as JSON. Stdlib only.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

TIMEOUT = 20  # seconds one py-spy dump may take


def environ(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def parent(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def is_python(pid: str) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def ranks(run_id: str) -> list[dict[str, object]]:
    """The run's rank processes here, by global rank."""
    mine: dict[str, dict[str, str]] = {}
    node = os.environ.get("SLURMD_NODENAME")  # a Slurm task: this node's ranks only
    for path in glob.glob("/proc/[0-9]*"):
        pid = path[6:]
        env = environ(pid)
        if env.get("VMRUN_AGENT"):  # the run's agent (run_agent.py): never a rank
            continue
        if env.get("VMRUN_RUN_ID") == run_id and env.get("SLURMD_NODENAME") == node:
            mine[pid] = env
    ranked = {p: e for p, e in mine.items() if e.get("RANK", "").isdigit()}
    if not ranked:  # one plain process: the topmost Python one
        ranked = {p: {**e, "RANK": "0"} for p, e in mine.items() if is_python(p)}
    found = []
    for pid, env in ranked.items():
        if parent(pid) in ranked:
            continue
        local = env.get("LOCAL_RANK", "")
        found.append(
            {
                "rank": int(env["RANK"]),
                "local_rank": int(local) if local.isdigit() else None,
                "pid": int(pid),
            }
        )
    return sorted(found, key=lambda r: (r["rank"], r["pid"]))  # type: ignore[arg-type]


def tool() -> str:
    """py-spy: where vmrun or the user put it."""
    given = os.environ.get("VMRUN_PY_SPY", "")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    sent = sorted(glob.glob(os.path.expanduser("~/.vmrun/tools/py-spy-*/py-spy")))
    for candidate in (given, beside, *reversed(sent)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy") or ""


def traced_by_ancestors_only() -> bool:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fh:
            return int(fh.read().strip() or 0) >= 1 and os.geteuid() != 0
    except (OSError, ValueError):
        return False


def dump(spy: str, pid: int) -> tuple[list[object] | None, str]:
    """py-spy's threads of `pid`, or None and why not."""
    argv = [spy, "dump", "--pid", str(pid), "--json"]
    tries = [argv]
    if traced_by_ancestors_only() and shutil.which("sudo"):
        tries.append(["sudo", "-n", *argv])
    why = ""
    for attempt in tries:
        try:
            done = subprocess.run(
                attempt,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"py-spy took more than {TIMEOUT} s"
        except OSError as exc:
            return None, f"py-spy did not run: {exc}"
        if done.returncode == 0:
            try:
                return json.loads(done.stdout), ""
            except ValueError:
                return None, "py-spy's output was not JSON"
        why = (done.stderr.strip().splitlines() or [f"py-spy exited {done.returncode}"])[-1]
    if traced_by_ancestors_only():
        why += (
            " (kernel.yama.ptrace_scope lets only a process's parents trace it and sudo"
            " needs a password: `sudo sysctl kernel.yama.ptrace_scope=0` allows it)"
        )
    return None, why


def read(folder: str) -> None:
    for name in sorted(glob.glob(os.path.join(folder, "rank-*.json"))):
        with open(name) as fh:
            print(fh.read().strip(), flush=True)


def flight(rec: str) -> None:
    """Each rank's torch flight recorder dump here (REC/nccl/fr_rank_R: written by NCCL's
    watchdog when a collective times out, TORCH_NCCL_DUMP_ON_TIMEOUT) as a line: the
    default group's last collective it enqueued and completed, and that one's name."""
    import pickle

    for path in sorted(glob.glob(os.path.join(rec, "nccl", "fr_rank_*"))):
        rank = path.rsplit("_", 1)[-1]
        if not rank.isdigit():
            continue
        try:
            with open(path, "rb") as fh:
                dump = pickle.load(fh)  # this host's own run's file
            status = (dump.get("pg_status") or {}).get("0") or {}
            enqueued = int(status.get("last_enqueued_collective", -1))
            ops = {
                e.get("collective_seq_id"): e.get("profiling_name")
                for e in dump.get("entries") or ()
                if str(e.get("pg_id")) == "0"
            }
        except Exception as exc:  # a dump cut short, another torch's format
            print(json.dumps({"fr": {"rank": int(rank), "error": str(exc)[:200]}}), flush=True)
            continue
        print(
            json.dumps(
                {
                    "fr": {
                        "rank": int(rank),
                        "enqueued": enqueued,
                        "op": ops.get(enqueued) or "",
                        "completed": int(status.get("last_completed_collective", -1)),
                    }
                }
            ),
            flush=True,
        )


def saved(rec: str) -> int:
    hang = None
    try:
        with open(os.path.join(rec, "hang")) as fh:
            hang = json.load(fh)
    except (OSError, ValueError):
        pass
    folders = glob.glob(os.path.join(rec, "stacks", "hang-*"))
    if folders:
        newest = max(
            folders, key=lambda f: int(f.rsplit("-", 1)[1]) if f.rsplit("-", 1)[1].isdigit() else 0
        )
        read(newest)
    flight(rec)
    print(json.dumps({"hang": hang}), flush=True)
    return 0


def main() -> int:
    if sys.argv[1] == "--tool":
        import platform

        print(tool())
        print(platform.machine())
        print(os.path.expanduser("~"))
        return 0
    if sys.argv[1] == "--saved":
        return saved(sys.argv[2])
    if sys.argv[1] == "--read":
        read(sys.argv[2])
        return 0
    run_id = sys.argv[1]
    folder = sys.argv[2] if len(sys.argv) > 2 else ""
    found = ranks(run_id)
    spy = tool()
    host = socket.gethostname()

    def one(rank: dict[str, object]) -> dict[str, object]:
        if not spy:
            return {**rank, "host": host, "error": "no py-spy on this host"}
        threads, why = dump(spy, int(rank["pid"]))  # type: ignore[call-overload]
        return {
            **rank,
            "host": host,
            **({"threads": threads} if threads is not None else {"error": why}),
        }

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(found)))) as pool:
        lines = list(pool.map(one, found))
    if folder:
        os.makedirs(folder, exist_ok=True)
    for line in lines:
        text = json.dumps(line)
        if folder:
            tmp = os.path.join(folder, f".rank-{line['rank']}.json.tmp")
            with open(tmp, "w") as fh:
                fh.write(text + "\n")
            os.replace(tmp, os.path.join(folder, f"rank-{line['rank']}.json"))
        print(text, flush=True)
    print(json.dumps({"done": len(lines), "tool": spy}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
