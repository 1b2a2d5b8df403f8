"""A run's one companion on its host: reads the launch spec (vmrun.runs.launch_spec: one
JSON document on stdin, from run_start.sh) and supervises the run.

    python3 run_agent.py fields     the words run_start.sh needs: REC ID MODE ALONE
    python3 run_agent.py prepare    the record's files from the spec (run.json, notify.json
                                    and code.patch, out_dir, the resume's banner); 126 when
                                    the work directory is missing
    python3 run_agent.py run        the run itself (run_start.sh starts it with setsid; its
                                    pid is the record's pid: the run is alive while it lives)

A Slurm job's batch script (slurm_job.bash) keeps the job's own steps (srun, requeues,
recoveries) and hands the spec to the same parts, from the copies of this file and its
siblings the job writes into REC/.watch (a user's own batch script's with `submit
--recover`, slurm_own_recover.bash, only tells):

    python3 run_agent.py budget     before the step: the cap as the user wrote it (printed;
                                    nothing without one), REC/budget written when the job
                                    has cost it already (budget_watch.py's `spent`)
    python3 run_agent.py step PID SHELL  the watchers beside the job's step (PID: its srun),
                                    until it ends: the hang watch over every node, the cap
                                    (SIGUSR2 to SHELL, the batch shell, when it is reached)
    python3 run_agent.py failure RC the job's code: torchrun's failed worker's, from job.log
    python3 run_agent.py tell EVENT EXIT  an event told to the record's notify.json's
                                    webhooks (EVENT "": the end, from EXIT)

`run` writes pid_start, starts the command in a session of its own (REC/session: PID START,
what run_stop.sh stops) in the work directory with its output in REC/log (appended for a
resume), the spec's `env` and the few variables a run reads on the host (VMRUN_RUN_ID,
VMRUN_RUN_DIR, VMRUN_BEAT_DIR, VMRUN_SNAPSHOT_SIGNAL; with the spot or budget watcher
VMRUN_REQUEUE_FILE and VMRUN_REQUEUE_ON_TERM), then writes pid (its own), and runs every
part the spec asks for in this one process while the command runs:

- marks: REC/log.times (run_marks.py's Marks), every 0.1 s in the main loop;
- hang (hang_watch.py), budget (budget_watch.py), spot (spot_watch.py): each its watch, a
  thread of this process that ends with the run; budget and spot signal the command's tree;
- store: the bucket copy (store_copier.py: a thread running store_sync.sh's passes, fenced
  by generation, the config in a 0600 file only it reads), its last pass after the end;
- provenance: run_provenance.py under the run's interpreter, niced, outside the run's session;
- at the end: exit_code (the run's own; run_failure.py names the failed worker of a torchrun
  that exited 1; 75 when the run stopped after its snapshot to go on elsewhere, REC/requeue;
  124 when its hang watcher stopped it; a run its budget watcher stopped is recorded as
  stopped), then the end told to notify.json's webhooks (notify_send.py). A run that
  run_stop.sh stopped is that stop's to record: the agent makes the copy's last pass alone.

A new watcher is a settings class in vmrun.runs.launch_spec and a part here. The agent's own
environment has neither the run's id (run_stop.sh finds every process of the run by it) nor
a place in the command's session, so a stop leaves it the copy's last pass; VMRUN_AGENT (the
run's id) names it, and stacks.py never takes it for a rank. Stdlib only.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # its siblings on the host
VERSION = 1  # the launch spec's (vmrun.runs.launch_spec.VERSION)


def home_path(path: str) -> str:
    return path if path.startswith("/") else os.path.join(os.environ.get("HOME", "/"), path)


def read_spec() -> dict:
    spec = json.loads(sys.stdin.read())
    version = spec.get("version") if isinstance(spec, dict) else None
    if version != VERSION:  # a vmrun of another version sent it: its own agent reads it
        raise SystemExit(f"vmrun: launch spec version {version!r}, not {VERSION}")
    return spec


def write_file(path: str, text, private: bool = False) -> None:
    """`text` (str or bytes) in one rename; `private`: only the user reads it, from its first
    byte."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
    with os.fdopen(fd, "wb") as fh:
        fh.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape"))
    os.replace(tmp, path)


def fields(spec: dict) -> int:
    print(spec["rec"], spec["run_id"], spec["mode"], "1" if spec.get("alone") else "0")
    return 0


def prepare(spec: dict) -> int:
    """The record's files the spec brings (run_start.sh has numbered the attempt)."""
    rec, resume = home_path(spec["rec"]), spec["mode"] == "resume"
    write_file(os.path.join(rec, "run.json"), spec.get("meta", "{}") + "\n")
    told = spec["watchers"].get("notify")
    if told and told.get("config"):  # the webhooks: a secret, in a file only the user reads
        write_file(os.path.join(rec, "notify.json"), told["config"] + "\n", private=True)
    patch = os.path.join(rec, "code.patch")
    if resume and os.path.exists(patch):  # the earlier attempt's
        with open(os.path.join(rec, "attempt")) as fh:
            os.replace(patch, f"{patch}.{int(fh.read().strip() or 2) - 1}")
    with contextlib.suppress(OSError):
        os.unlink(patch)
    sent = (spec["watchers"].get("provenance") or {}).get("code_patch")
    if sent:
        with contextlib.suppress(ValueError, OSError, EOFError):
            write_file(patch, gzip.decompress(base64.b64decode(sent)))
    write_file(os.path.join(rec, "out_dir"), home_path(spec.get("out") or spec["workdir"]) + "\n")
    if not os.path.isdir(spec["workdir"]):
        print(f"vmrun: the work directory {spec['workdir']} is missing", file=sys.stderr)
        return 126
    if resume and spec.get("banner"):
        with open(os.path.join(rec, "log"), "a") as log:
            log.write(spec["banner"] + "\n")
    if not resume:
        write_file(os.path.join(rec, "log.times"), "")
    return 0


def started(pid: int) -> str:
    """Field 22 of /proc/PID/stat: when it started (run_alive.sh's rule)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[19]


def own_start() -> str:
    """What pid_start holds."""
    return started(os.getpid())


def run_env(spec: dict, rec: str) -> dict:
    env = dict(os.environ)
    env.update(
        VMRUN_RUN_ID=spec["run_id"],
        VMRUN_RUN_DIR=rec,
        VMRUN_BEAT_DIR=os.path.join(rec, "beat"),
        VMRUN_SNAPSHOT_SIGNAL="SIGUSR1",
    )
    if spec["watchers"].get("spot") is not None or spec["watchers"].get("budget") is not None:
        env.update(VMRUN_REQUEUE_FILE=os.path.join(rec, "requeue"), VMRUN_REQUEUE_ON_TERM="0")
    return env


def say(rec: str, text: str) -> None:
    with open(os.path.join(rec, "log"), "a") as log:
        log.write(f"vmrun: {text}\n")


def part(target, *args) -> None:
    """A watcher as a thread of this process: it ends with the run (a daemon)."""

    def guarded() -> None:
        with contextlib.suppress(Exception):
            target(*args)

    threading.Thread(target=guarded, daemon=True).start()


def watchers(spec: dict, rec: str, pid: int) -> None:
    """The hang watch, before the command: its first lines are progress."""
    hang = spec["watchers"].get("hang")
    if hang:
        import hang_watch  # type: ignore[import-not-found]

        part(
            hang_watch.watch,
            rec,
            pid,
            float(hang["seconds"]),
            hang["action"],
            spec["run_id"],
            bool(hang.get("ranked", True)),
            False,
            hang.get("python") or "",
        )


def tree(spec: dict, rec: str, pid: int, run: int) -> None:
    """The parts that signal the run's processes: the command `run` and its tree, never the
    agent's own (a copy pass, its mover)."""
    budget = spec["watchers"].get("budget")
    if budget:
        import budget_watch  # type: ignore[import-not-found]

        part(budget_watch.watch, rec, pid, float(budget["seconds"]), budget["cap"], run)
    if spec["watchers"].get("spot") is not None:
        import spot_watch  # type: ignore[import-not-found]

        part(spot_watch.watch, rec, pid, run)


def detached(argv: list) -> None:
    """A one-shot beside the run, niced, in a session of its own (setsid -f: not a child)."""
    nice = ["nice", "-n", "10"] if _which("nice") else []
    with contextlib.suppress(OSError):
        subprocess.run(
            ["setsid", "-f", *nice, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


def _which(name: str) -> bool:
    return any(
        os.access(os.path.join(d, name), os.X_OK) for d in os.environ.get("PATH", "").split(":")
    )


def store(spec: dict, rec: str):
    """The bucket copy (store_copier.py), or None: the config by its environment alone."""
    to = spec["watchers"].get("store")
    if not to:
        return None
    import store_copier  # type: ignore[import-not-found]

    since = ""
    if to.get("since"):
        with contextlib.suppress(OSError), open(os.path.join(rec, "first_started")) as fh:
            since = fh.read().strip()
    copier = store_copier.Copier(
        rec,
        home_path(spec.get("out") or spec["workdir"]),
        to["to"],
        to["url"],
        since,
        "record" if to.get("records", True) else "outputs",
        to.get("attempt") or "",
        to.get("python") or "",
    )
    if not copier.start(to.get("config") or ""):
        say(rec, f"the copy to {to['url']} did not start")
        return None
    return copier


def exit_code(rec: str, rc: int) -> int:
    """The run's own code, as its records say it ended."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(rec, "failure.json"))
    if rc == 1:  # torchrun's: the first failed worker's own code
        with contextlib.suppress(OSError):
            with open(os.path.join(rec, "log_start")) as fh:
                start = fh.read().strip()
            done = subprocess.run(
                [
                    sys.executable,
                    os.path.join(HERE, "run_failure.py"),
                    rec,
                    os.path.join(rec, "log"),
                    str(rc),
                    start,
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
            said = done.stdout.strip()
            if said.isdigit():
                rc = int(said)
    requeue = os.path.join(rec, "requeue")
    if rc == 0 and os.path.exists(requeue) and os.path.getsize(requeue) > 0:
        rc = 75  # stopped after a snapshot to go on elsewhere (the template wrote it)
    if rc != 0 and _exists(rec, "hang_stopped"):
        rc = 124  # stopped by its hang watcher, as timeout(1) says it
    if rc != 0 and _exists(rec, "budget"):  # at its --max-cost: stopped, as by the user
        write_file(os.path.join(rec, "stopped"), "budget\n")
    return rc


def _exists(rec: str, name: str) -> bool:
    return os.path.exists(os.path.join(rec, name))


def stopped_by_stop(rec: str) -> bool:
    """Stopped by run_stop.sh (the user, a failure elsewhere, a newer attempt), not by its
    budget watcher: the end is that stop's to record and tell."""
    try:
        with open(os.path.join(rec, "stopped")) as fh:
            return fh.readline().strip() != "budget"
    except OSError:
        return False


def run(spec: dict) -> int:
    from run_marks import Marks  # type: ignore[import-not-found]

    rec = home_path(spec["rec"])
    os.environ.pop("VMRUN_AGENT", None)  # its own (/proc's), not its children's
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a later attempt's take-over
    with open(os.devnull) as null:
        os.dup2(null.fileno(), 0)
    write_file(os.path.join(rec, "pid_start"), own_start() + "\n")
    # appended either way (O_APPEND): the watchers and the bucket copy add their lines beside
    if spec["mode"] != "resume":
        write_file(os.path.join(rec, "log"), "")
    log = open(os.path.join(rec, "log"), "a")  # noqa: SIM115  # the command's, all its life
    # the run's --env values are the watchers' and the copier's too (their pace, in a test)
    os.environ.update(spec.get("env") or {})
    interpreter = (spec["watchers"].get("provenance") or {}).get("interpreter")
    if interpreter:
        detached([interpreter, os.path.join(HERE, "run_provenance.py"), rec])
    # a host-side file by its path from the home (vmrun.hostside.HostPath), whatever the cwd
    argv = [home_path(w["home"]) if isinstance(w, dict) else w for w in spec["argv"]]
    # before the command: its first lines are progress the hang watcher sees
    watchers(spec, rec, os.getpid())
    try:  # in a session of its own: what run_stop.sh stops, never this agent
        child = subprocess.Popen(
            argv,
            cwd=spec["workdir"],
            env=run_env(spec, rec),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        log.write(f"vmrun: {argv[0]}: {exc.strerror}\n")
        log.flush()
        rc = 127 if isinstance(exc, FileNotFoundError) else 126
        child = None
    if child is not None:
        write_file(os.path.join(rec, "session"), f"{child.pid} {started(child.pid)}\n")
    write_file(os.path.join(rec, "pid"), f"{os.getpid()}\n")
    marks, ended, copier = Marks(rec), threading.Event(), None
    if child is not None:
        tree(spec, rec, os.getpid(), child.pid)
        copier = store(spec, rec)
        if copier is not None:
            copier.begin(ended.is_set)
        while child.poll() is None:
            marks.step()
            time.sleep(0.1)
        rc = child.returncode if child.returncode >= 0 else 128 - child.returncode
    marks.step()
    marks.close()
    log.close()
    end(rec, rc, ended)
    if copier is not None:
        copier.join()
    return 0


def end(rec: str, rc: int, ended: threading.Event) -> None:
    """The run's end recorded and told, then the copy's last pass let go (`ended`)."""
    told = not stopped_by_stop(rec)
    if told:
        rc = exit_code(rec, rc)
        if not _exists(rec, "stopped"):
            write_file(os.path.join(rec, "exit_code"), f"{rc}\n")
    else:  # run_stop.sh writes the exit code once the run's processes are gone
        until = time.monotonic() + 15
        while not _exists(rec, "exit_code") and time.monotonic() < until:
            time.sleep(0.05)
    ended.set()
    if told and os.access(os.path.join(rec, "notify.json"), os.R_OK):
        with open(os.path.join(rec, "log"), "a") as out:
            subprocess.run(
                [sys.executable, os.path.join(HERE, "notify_send.py"), rec, "send"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )


def budget(spec: dict) -> int:
    """A Slurm job's cap before its step: printed (the batch shell's lines name it), and
    REC/budget written when the job has cost it already."""
    cap = spec["watchers"].get("budget")
    if not cap:
        return 0
    import budget_watch  # type: ignore[import-not-found,unused-ignore]

    budget_watch.spent(home_path(spec["rec"]), float(cap["seconds"]), cap["cap"])
    print(cap["cap"])
    return 0


def step(spec: dict) -> int:
    """A Slurm job's step watched, each part a thread of this process until the step (its
    srun) ends: the hang watch (hang_watch.py's Slurm watch: its log is job.log, its ranks
    every node's, its stop the step's srun's) and the cap (budget_watch.py's `job`)."""
    hang, cap = spec["watchers"].get("hang"), spec["watchers"].get("budget")
    if not hang and not cap:
        return 0
    import hang_watch  # type: ignore[import-not-found,unused-ignore]

    if cap:  # before any part starts: one that cannot load fails the step's agent whole
        import budget_watch  # type: ignore[import-not-found,unused-ignore]
    rec, srun = home_path(spec["rec"]), int(sys.argv[2])
    with open(os.devnull) as null:
        os.dup2(null.fileno(), 0)
    if hang:
        hang_watch.LOG = "job.log"
        part(
            hang_watch.watch,
            rec,
            srun,
            float(hang["seconds"]),
            hang["action"],
            spec["run_id"],
            bool(hang.get("ranked", True)),
            True,
            hang.get("python") or "",
        )
    if cap:
        part(budget_watch.job, rec, srun, int(sys.argv[3]), float(cap["seconds"]), cap["cap"])
    pause = hang_watch.waiter(srun)
    while hang_watch.running(srun):
        pause(5.0)
    return 0


def failure(spec: dict) -> int:
    """A Slurm job's code (printed): torchrun's first failed worker's, from job.log's last
    attempt (run_failure.py, which keeps failure.json), else the step's own."""
    rec, rc = home_path(spec["rec"]), sys.argv[2]
    try:
        import run_failure  # type: ignore[import-not-found]

        print(run_failure.main(["run_failure.py", rec, os.path.join(rec, "job.log"), rc]))
    except Exception:  # a failure's details never cost the run its code
        print(rc)
    return 0


def tell(spec: dict) -> int:
    """A Slurm job's event told (notify_send.py, the record's notify.json), its lines the
    job's log."""
    rec = home_path(spec["rec"])
    if spec["watchers"].get("notify") is None or not os.access(
        os.path.join(rec, "notify.json"), os.R_OK
    ):
        return 0
    subprocess.run(
        [sys.executable, os.path.join(HERE, "notify_send.py"), rec, "send", *sys.argv[2:4]],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        check=False,
    )
    return 0


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    steps = {
        "fields": fields,
        "prepare": prepare,
        "run": run,
        "budget": budget,
        "step": step,
        "failure": failure,
        "tell": tell,
    }
    if mode not in steps:
        print(f"run_agent.py: unknown mode {mode!r}", file=sys.stderr)
        return 2
    return steps[mode](read_spec())


if __name__ == "__main__":
    sys.exit(main())
