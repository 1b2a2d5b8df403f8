"""A STAND-IN for Slurm on this machine, for quick-tier tests (tests/contract_slurm.py): just
enough of sbatch, squeue, sacct, scontrol, scancel, srun and sinfo for vmrun's login-node
scripts (vmrun/hostside/slurm_*.sh) and the batch script vmrun writes (slurm_job.bash).

`install(state, bin_dir)` puts one wrapper per command in `bin_dir`; each runs this file as
`fake_slurm.py STATE COMMAND ARGS...`. One node (`node1`), one task per step, long options
only (`--name=value`), no queue: a job starts once submitted, its batch script in a session
of its own under a small supervisor (this file's `job` command), which ends whatever the
script leaves and then records the job's end (STATE/jobs/<id>/: state.json, and the pids of
the supervisor and of the batch script, the job's process group). squeue lists the
jobs that have not ended (MinJobAge 0), sacct every job; scancel sends SIGTERM to the job's
process group (no KillWait). Anything else it is asked fails loudly (exit 2)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

NODE = "node1"
COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "srun", "sinfo")
ENDED = ("COMPLETED", "FAILED", "CANCELLED")


def install(state: Path, bin_dir: Path) -> None:
    (state / "jobs").mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I {__file__} {state} {name} "$@"\n')
        wrapper.chmod(0o755)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (a zombie has ended)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


class Job:
    def __init__(self, state: Path, jid: str):
        self.id, self.dir = jid, state / "jobs" / jid

    def read(self) -> dict:
        return json.loads((self.dir / "state.json").read_text())

    def write(self, **changes: object) -> None:
        path = self.dir / "state.json"
        values = {**(self.read() if path.exists() else {}), **changes}
        (self.dir / "state.tmp").write_text(json.dumps(values))
        os.replace(self.dir / "state.tmp", path)

    def fields(self) -> dict[str, str]:
        """The job's fields by squeue's -O and sacct's -o names."""
        s = self.read()
        used = int((s.get("end") or time.time()) - s["start"]) if s.get("start") else 0
        started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(s.get("start") or 0))
        on = NODE if s["state"] != "PENDING" else ""
        return {
            "JobID": self.id,
            "JobArrayID": self.id,
            "ArrayJobID": self.id,
            "ArrayTaskID": "N/A",
            "State": s["state"],
            "Reason": "None",
            "StartTime": started if s.get("start") else "N/A",
            "NodeList": on,
            "TimeUsed": f"{used // 60}:{used % 60:02d}",
            "BatchHost": on,
            "Name": s["name"],
            "ExitCode": s.get("exit", "0:0"),
            "exit_code": "0",
        }


def jobs(state: Path, ids: str | None) -> list[Job]:
    found = sorted((p.name for p in (state / "jobs").iterdir()), key=int)
    wanted = set(ids.split(",")) if ids else set(found)
    return [Job(state, jid) for jid in found if jid in wanted]


def options(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading `--name[=value]` options, and the words after them."""
    opts: dict[str, str] = {}
    while words and words[0].startswith("-"):
        name, _, value = words.pop(0).lstrip("-").partition("=")
        opts[name] = value
    return opts, words


def sbatch(state: Path, args: list[str]) -> int:
    given, rest = options(args)
    script = Path(rest[0])
    directives = re.findall(r"^#SBATCH +(\S+)", script.read_text(), re.MULTILINE)
    opts = {**options(directives)[0], **given}
    with open(state / "next", "a+") as counter:  # ids 1, 2, 3...
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        jid = str(int(counter.read() or 0) + 1)
        counter.seek(0)
        counter.truncate()
        counter.write(jid)
    job = Job(state, jid)
    job.dir.mkdir()
    shutil.copy(script, job.dir / "script")  # a queued job runs the script as submitted
    chdir = os.path.abspath(opts.get("chdir") or os.getcwd())
    output = os.path.join(chdir, opts.get("output", "slurm-%j.out").replace("%j", jid))
    job.write(
        state="PENDING",
        name=opts.get("job-name") or script.name,
        chdir=chdir,
        output=output,
        append=opts.get("open-mode") == "append",
        args=rest[1:],
    )
    supervisor = subprocess.Popen(
        [sys.executable, "-I", __file__, str(state), "job", jid],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    (job.dir / "supervisor").write_text(str(supervisor.pid))  # state.json is the job's now
    print(jid if "parsable" in opts else f"Submitted batch job {jid}")
    return 0


def run_job(state: Path, args: list[str]) -> int:
    """The job's supervisor (slurmd's part): the batch script, then the job's end."""
    job = Job(state, jid := args[0])
    s = job.read()
    env = {
        **os.environ,
        "SLURM_JOB_ID": jid,
        "SLURM_JOBID": jid,
        "SLURM_JOB_NAME": s["name"],
        "SLURM_JOB_NODELIST": NODE,
        "SLURM_NODELIST": NODE,
        "SLURM_NNODES": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURMD_NODENAME": NODE,
        "SLURM_NTASKS": "1",
    }
    with open(s["output"], "ab" if s["append"] else "wb") as log:
        proc = subprocess.Popen(
            ["bash", job.dir / "script", *s["args"]],
            cwd=s["chdir"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    job.write(pgid=proc.pid, state="RUNNING", start=time.time())
    if (job.dir / "cancelled").exists():  # scancel came before the pgid was known
        os.killpg(proc.pid, signal.SIGTERM)
    status = proc.wait()
    with contextlib.suppress(ProcessLookupError):  # Slurm ends every process of the job
        os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    ended = "CANCELLED" if (job.dir / "cancelled").exists() else "FAILED" if status else "COMPLETED"
    exit_code = f"{status}:0" if status >= 0 else f"0:{-status}"
    if ended == "CANCELLED":  # as sacct says it: the signal that ended the job
        exit_code = f"0:{signal.SIGTERM.value}"
    job.write(state=ended, exit=exit_code, end=time.time())
    return 0


def after(args: list[str]) -> dict[str, str]:
    """Each word's next (`-j ID`, `-o FORMAT`; the flags' next words are never asked for)."""
    return dict(zip(args, [*args[1:], ""], strict=True))


def squeue(state: Path, args: list[str]) -> int:
    opts = after(args)
    listed = [j for j in jobs(state, opts.get("-j")) if j.read()["state"] not in ENDED]
    if "-s" in args:  # the steps: one (srun's) while the job runs
        print("".join(f"{j.id}.0\n" for j in listed if j.read()["state"] == "RUNNING"), end="")
        return 0
    letters = {"i": "JobID", "T": "State", "r": "Reason", "N": "NodeList", "j": "Name"}
    for values in (job.fields() for job in listed):
        if "-o" in opts:  # '%T|%r': printf-like letters
            words = re.split(r"%\.?\d*([a-zA-Z])", opts["-o"])  # text, letter, text, ...
            print("".join(values[letters[w]] if i % 2 else w for i, w in enumerate(words)))
        else:  # -O 'Name:|,Other:|,...': each value, then what follows its colon
            items = (f.partition(":") for f in opts["-O"].split(","))
            print("".join(values[name] + sep for name, _, sep in items))
    return 0


def sacct(state: Path, args: list[str]) -> int:
    opts = after(args)
    names = opts["-o"].split(",")
    for job in jobs(state, opts.get("-j", "").strip(",") or None):
        print("|".join(job.fields()[name] for name in names))
    return 0


def scontrol(state: Path, args: list[str]) -> int:
    if args[:2] == ["show", "hostnames"]:
        print("\n".join(args[2].split(",")))
        return 0
    if args[:3] == ["show", "job", "-o"] and (state / "jobs" / args[3]).is_dir():
        v = Job(state, args[3]).fields()
        print(
            f"JobId={v['JobID']} JobName={v['Name']} JobState={v['State']} Reason=None"
            f" ExitCode={v['ExitCode']} NodeList={v['NodeList'] or '(null)'}"
        )
        return 0
    return unfaked("scontrol", args)


def scancel(state: Path, args: list[str]) -> int:
    if len(args) != 1 or not (state / "jobs" / args[0]).is_dir():
        return unfaked("scancel", args)
    job = Job(state, args[0])
    if job.read()["state"] in ENDED:
        return 0
    (job.dir / "cancelled").touch()  # first: a job still starting finds it (run_job)
    with contextlib.suppress(ProcessLookupError, KeyError):
        os.killpg(job.read()["pgid"], signal.SIGTERM)
    return 0


def srun(_state: Path, args: list[str]) -> int:
    """One task, here, its lines labelled `0: ` with --label."""
    opts, command = options(list(args))
    env = {
        **os.environ,
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_ID": "0",
    }
    if "label" not in opts:
        status = subprocess.call(command, env=env)
    else:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout or ():
            sys.stdout.buffer.write(b"0: " + line)
            sys.stdout.buffer.flush()
        status = proc.wait()
    return status if status >= 0 else 128 - status


def unfaked(name: str, args: list[str]) -> int:
    print(f"fake slurm: `{name} {' '.join(args)}` is not faked", file=sys.stderr)
    return 2


def sinfo(_state: Path, args: list[str]) -> int:
    if args != ["--version"]:
        return unfaked("sinfo", args)
    print("slurm 23.02.1")  # the version decides the GPU option (vmrun.backends.slurm.job)
    return 0


def main(argv: list[str]) -> int:
    commands = {
        "sbatch": sbatch,
        "squeue": squeue,
        "sacct": sacct,
        "scontrol": scontrol,
        "scancel": scancel,
        "srun": srun,
        "sinfo": sinfo,
        "job": run_job,
    }
    return commands[argv[1]](Path(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
