"""`vmrun train --local [SCRIPT] [-- SCRIPT_ARGS...]`: launch DDP training on this machine.

Without SCRIPT it runs vmrun's template trainer (`vmrun/trainer/template.py`). The CLI
process never imports torch: torch is checked for, and runs, only in child processes.

Where things go (the project dir is the nearest directory holding vmrun.toml, else the
current directory):
- `results/<run-id>/` in the project dir, with `run.json` (the run record, rewritten
  atomically at start and end) and `train.log` (the run's stdout and stderr, merged, as also
  streamed to this terminal). The run id is `<name or script stem>-<YYYYmmdd-HHMMSS>-<4 hex>`.
- The template writes snapshot.pt, finalmodel.pt and metrics.jsonl there too (its
  `--out-dir`). A user SCRIPT runs with the project dir as its working directory, exactly as
  `torchrun script.py` typed there would, so its files land where it puts them; it also gets
  VMRUN_RUN_ID and VMRUN_RUN_DIR to write into the run directory if it wants to.

The child runs in its own session. Ctrl-C (or SIGTERM/SIGHUP to vmrun) stops the whole run:
SIGTERM to its process group, then SIGKILL to everything that descends from it after a grace
period. torchrun starts each worker in a session of its own, so vmrun also makes itself a
child subreaper while the run lasts: workers orphaned by a dying torchrun are re-parented to
vmrun, so they are still found and killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from vmrun.errors import CommandFailed, Interrupted, UsageError, VmrunError

DEFAULT_EPOCHS = 10
DEFAULT_SAVE_EVERY = 5
CPU_PROCESSES = 2  # default world size without CUDA: small, but a real multi-process DDP run
STOP_GRACE_S = 10.0
_SCRIPT_ARGS = "vmrun.train.script_args"
_TORCH_PROBE = "import torch; print(torch.__version__); print(torch.cuda.device_count())"
_PIN_HINT = (
    "install it with `pip install torch==2.13.0` (always pin torch: an unpinned `torch` pulls"
    " the multi-GB CUDA build)"
)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _DashDashCommand(TyperCommand):
    """Keeps the words after `--` for the script, so `train -- 5 2` is not read as SCRIPT=5."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_SCRIPT_ARGS] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- SCRIPT_ARGS...]"]


@dataclass
class Plan:
    """Everything decided before anything starts: bad input fails here, with nothing run."""

    script: Path
    is_template: bool
    name: str
    args: list[str]
    launcher: str
    nproc: str | None
    max_restarts: int
    env: dict[str, str]
    project: Path


def register(app: typer.Typer) -> None:
    @app.command(
        "train",
        cls=_DashDashCommand,
        help="Launch torchrun DDP training and stream its output (--local: on this machine)."
        " SCRIPT (default: vmrun's template trainer) gets `EPOCHS SAVE_EVERY`, or the words"
        " after `--` as-is. Files go to results/<run-id>/: train.log, run.json and the"
        " template's snapshot.pt, finalmodel.pt, metrics.jsonl; a SCRIPT runs in the project"
        " directory and writes where it always does.",
    )
    def train_command(
        ctx: typer.Context,
        script: Annotated[
            str | None,
            typer.Argument(metavar="[SCRIPT]", show_default=False, help="Default: the template."),
        ] = None,
        local: Annotated[
            bool, typer.Option("--local", help="Train on this machine (no SSH).")
        ] = False,
        epochs: Annotated[
            int | None,
            typer.Option("--epochs", metavar="N", help="Total epochs [default: 10]."),
        ] = None,
        save_every: Annotated[
            int | None,
            typer.Option("--save-every", metavar="K", help="Snapshot every K epochs [default: 5]."),
        ] = None,
        nproc_per_node: Annotated[
            str | None,
            typer.Option(
                "--nproc-per-node",
                metavar="gpu|cpu|auto|N",
                help="Worker processes (torchrun's meaning for gpu/cpu/auto). Default: one per"
                " CUDA GPU, else 2 CPU processes (gloo).",
            ),
        ] = None,
        max_restarts: Annotated[
            int,
            typer.Option("--max-restarts", metavar="R", help="torchrun restarts after a failure."),
        ] = 0,
        env: Annotated[
            list[str] | None,
            typer.Option("--env", "-e", metavar="KEY[=VAL]", help="Set a variable; repeatable."),
        ] = None,
        name: Annotated[
            str | None,
            typer.Option("--name", metavar="NAME", help="Run-id prefix [default: script stem]."),
        ] = None,
        batch_size: Annotated[
            int | None,
            typer.Option("--batch-size", metavar="B", help="Passed on as --batch-size B."),
        ] = None,
        lr: Annotated[
            float | None, typer.Option("--lr", metavar="LR", help="Passed on as --lr LR.")
        ] = None,
        launcher: Annotated[
            str,
            typer.Option(
                "--launcher",
                metavar="torchrun|python|env",
                help="torchrun; python (the script spawns its own workers); env (one process"
                " with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set).",
            ),
        ] = "torchrun",
    ) -> int:
        if not local:
            raise UsageError(
                "training on remote hosts is not available yet",
                hint="use --local to train on this machine",
            )
        plan = make_plan(
            script=script,
            user_args=ctx.meta.get(_SCRIPT_ARGS),
            epochs=epochs,
            save_every=save_every,
            nproc_per_node=nproc_per_node,
            max_restarts=max_restarts,
            env=env,
            name=name,
            batch_size=batch_size,
            lr=lr,
            launcher=launcher,
        )
        return run_local(plan)


def make_plan(
    *,
    script: str | None,
    user_args: list[str] | None,
    epochs: int | None,
    save_every: int | None,
    nproc_per_node: str | None,
    max_restarts: int,
    env: list[str] | None,
    name: str | None,
    batch_size: int | None,
    lr: float | None,
    launcher: str,
) -> Plan:
    """Validate every flag; raise UsageError (exit 2) before anything is started."""
    from vmrun import launch
    from vmrun.cli.exec_cmd import parse_env
    from vmrun.config import find_project_dir
    from vmrun.trainer import TEMPLATE_NAME, TEMPLATE_PATH

    launch.check_launcher(launcher)
    if script is None:
        path, is_template = TEMPLATE_PATH, True
    else:
        path, is_template = Path(script).expanduser().absolute(), False
        if not path.is_file():
            raise UsageError(f"script {script}: no such file")
    if user_args:
        given = [
            flag
            for flag, value in (
                ("--epochs", epochs),
                ("--save-every", save_every),
                ("--batch-size", batch_size),
                ("--lr", lr),
            )
            if value is not None
        ]
        if given:
            raise UsageError(
                f"{', '.join(given)} cannot be combined with script args after --;"
                " put them after -- in the form the script expects"
            )
    args = launch.script_args(
        DEFAULT_EPOCHS if epochs is None else epochs,
        DEFAULT_SAVE_EVERY if save_every is None else save_every,
        user_args,
    )
    if batch_size is not None:
        if batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
        args += ["--batch-size", str(batch_size)]
    if lr is not None:
        if not lr > 0:
            raise UsageError(f"--lr must be > 0, got {lr}")
        args += ["--lr", repr(lr)]
    if launcher == "torchrun":
        nproc = None if nproc_per_node is None else launch.check_nproc_per_node(nproc_per_node)
        if max_restarts < 0:
            raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    else:
        if nproc_per_node is not None or max_restarts:
            raise UsageError(
                f"--nproc-per-node and --max-restarts are torchrun's; --launcher {launcher}"
                " starts one process"
            )
        nproc = None
    env_map = parse_env(env)
    run_name = (
        launch.check_run_name(name)
        if name is not None
        else (TEMPLATE_NAME if is_template else launch.name_from_script(path.stem))
    )
    return Plan(
        script=path,
        is_template=is_template,
        name=run_name,
        args=args,
        launcher=launcher,
        nproc=nproc,
        max_restarts=max_restarts,
        env=env_map,
        project=find_project_dir() or Path.cwd(),
    )


def probe_torch(python: str, env: dict[str, str]) -> int:
    """Import torch in a child (never here) and return its CUDA device count."""
    try:
        done = subprocess.run(
            [python, "-c", _TORCH_PROBE],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VmrunError(f"cannot run {python} to check for torch: {exc}") from None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) < 2 or not lines[-1].isdigit():
        errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
        why = errors[-1].strip() if errors else f"exit status {done.returncode}"
        raise VmrunError(f"torch is not importable by {python} ({why})", hint=_PIN_HINT)
    return int(lines[-1])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Temp file in the same directory, fsync, rename: readers never see half a record."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def run_local(plan: Plan) -> int:
    """Probe torch, create the run directory, launch, stream, record; return the exit code."""
    from vmrun import launch

    python = sys.executable
    child_env = {**os.environ, **plan.env}
    gpus = probe_torch(python, child_env)
    nproc = plan.nproc
    if plan.launcher == "torchrun":
        if nproc is None:
            nproc = str(gpus) if gpus else str(CPU_PROCESSES)
        elif nproc == "gpu" and not gpus:
            raise UsageError(
                "--nproc-per-node gpu: torch sees no CUDA GPU here",
                hint="use --nproc-per-node cpu or a number",
            )

    rid = launch.run_id(plan.name)
    run_dir = plan.project / "results" / rid
    run_dir.mkdir(parents=True)
    rel_dir = os.path.relpath(run_dir, plan.project)
    args = list(plan.args)
    if plan.is_template and "--out-dir" not in args:
        args += ["--out-dir", rel_dir]
    if plan.launcher == "torchrun":
        argv = launch.torchrun_argv(
            python,
            str(plan.script),
            args,
            nproc_per_node=nproc or "1",
            max_restarts=plan.max_restarts,
            rdzv_endpoint="localhost:0",
            rdzv_id=rid,
        )
        for key, value in launch.torchrun_env(plan.max_restarts).items():
            child_env.setdefault(key, value)  # an explicit --env or outer value wins
    else:
        argv = launch.python_argv(python, str(plan.script), args)
    if plan.launcher == "env":
        child_env.update(
            launch.env_wiring(
                node_rank=0, nnodes=1, master_addr="127.0.0.1", master_port=_free_port()
            )
        )
    child_env.update({"PYTHONUNBUFFERED": "1", "VMRUN_RUN_ID": rid, "VMRUN_RUN_DIR": str(run_dir)})
    record: dict[str, Any] = {
        "id": rid,
        "status": "running",
        "script": str(plan.script),
        "template": plan.is_template,
        "launcher": plan.launcher,
        "nproc": {"torchrun": nproc, "env": "1"}.get(plan.launcher),  # python: the script's
        "max_restarts": plan.max_restarts,
        "argv": argv,
        "cwd": str(plan.project),
        "run_dir": str(run_dir),
        "env_keys": sorted(plan.env),  # names only: values may be secrets
        "python": python,
        "pid": None,
        "start_time": _utc_now(),
        "end_time": None,
        "exit_code": None,
    }
    write_json_atomic(run_dir / "run.json", record)
    procs = f"{nproc} processes" if plan.launcher == "torchrun" else "1 process"
    _note(f"run {rid}: {plan.script.name}, {plan.launcher}, {procs}; files in {rel_dir}/")

    try:
        code, stopped = _Supervisor(rid, run_dir, record).run(argv, plan.project, child_env)
    except Exception as exc:
        record.update(status="error", end_time=_utc_now(), error=f"{type(exc).__name__}: {exc}")
        write_json_atomic(run_dir / "run.json", record)
        raise
    record.update(
        status="stopped" if stopped else ("finished" if code == 0 else "failed"),
        end_time=_utc_now(),
        exit_code=code,
    )
    write_json_atomic(run_dir / "run.json", record)
    if stopped:
        raise Interrupted(f"run {rid} stopped", hint=f"its files are in {rel_dir}/")
    if code != 0:
        raise CommandFailed(
            f"run {rid} exited with {code}", hint=f"see {rel_dir}/train.log", exit_status=code
        )
    _note(f"run {rid} finished; files in {rel_dir}/")
    return 0


def _note(text: str) -> None:
    sys.stderr.write(f"vmrun: {text}\n")
    sys.stderr.flush()


class _StopRequested(Exception):
    """SIGTERM/SIGHUP to vmrun: stop the run as Ctrl-C does."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _StopRequested(signum)


def _prctl(option: int, value: int) -> None:
    """Linux prctl via libc; a no-op elsewhere (the /proc walk then finds less)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _child_setup() -> None:
    """In the child before exec: get SIGTERM when vmrun dies, even by SIGKILL."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Supervisor:
    """Runs the child in its own session, tees its output, and on a stop request ends every
    process of the run: those below vmrun that carry VMRUN_RUN_ID=<this run> (so a caller's
    other children are never touched, even when vmrun runs in-process in a test)."""

    def __init__(self, rid: str, run_dir: Path, record: dict[str, Any]):
        self.rid = rid
        self.run_dir = run_dir
        self.record = record
        self.proc: subprocess.Popen[bytes] | None = None
        self.stdout_ok = True

    def run(self, argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bool]:
        """Returns (exit code, stopped); a child killed by signal N gives 128+N."""
        handlers = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        try:
            with open(self.run_dir / "train.log", "ab") as self.log:
                try:
                    self.proc = subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=_child_setup,
                    )
                    self.record["pid"] = self.proc.pid
                    write_json_atomic(self.run_dir / "run.json", self.record)
                    while self.pump(None):
                        pass
                    code = self.proc.wait()
                    return (128 - code if code < 0 else code), False
                except (KeyboardInterrupt, _StopRequested):
                    self.stop()
                    return 130, True
        finally:
            if self.proc is not None and self.proc.stdout is not None:
                self.proc.stdout.close()
            self.kill_leftovers()
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)
            for sig, old in handlers.items():
                signal.signal(sig, old)

    def pump(self, timeout: float | None) -> bool:
        """Copy output that is ready within `timeout` (None: wait); False at its end."""
        if self.proc is None or self.proc.stdout is None:
            return False
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return True
        data = os.read(fd, 65536)
        if not data:
            return False
        self.log.write(data)
        self.log.flush()
        if self.stdout_ok:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                self.stdout_ok = False  # nobody reads our stdout any more; keep the log
        return True

    def members(self) -> list[int]:
        """Live processes of this run: below vmrun (torchrun's workers may be orphaned and
        re-parented to us, the subreaper) and carrying this run's VMRUN_RUN_ID."""
        tag = f"VMRUN_RUN_ID={self.rid}".encode()
        found = []
        for pid in _descendants(os.getpid()):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if tag in environ:
                found.append(pid)
        return found

    def stop(self) -> None:
        """SIGTERM the run's process group (torchrun passes it on to its workers); after
        STOP_GRACE_S, or at a second Ctrl-C, SIGKILL every process of the run."""
        hurry: list[int] = []
        again = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # asked again: kill now
        previous = {sig: signal.signal(sig, lambda *_: hurry.append(1)) for sig in again}
        try:
            if self.proc is None:
                return
            _signal_all([self.proc.pid], signal.SIGTERM, group_only=True)
            deadline = time.monotonic() + STOP_GRACE_S
            output_open = True
            while time.monotonic() < deadline and not hurry:
                if self.proc.poll() is not None and not self.members():
                    break
                if output_open:
                    output_open = self.pump(0.1)  # keep draining: a full pipe blocks exit
                else:
                    time.sleep(0.05)
            if self.proc.poll() is None or self.members():
                _signal_all([self.proc.pid, *self.members()], signal.SIGKILL)
            self.proc.wait()
            self.kill_leftovers()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def kill_leftovers(self) -> None:
        """Whatever of the run is still alive now (a worker torchrun left behind) is killed."""
        deadline = time.monotonic() + 5
        killed: set[int] = set()
        while (left := self.members()) and time.monotonic() < deadline:
            _signal_all(left, signal.SIGKILL)
            killed.update(left)
            time.sleep(0.02)
            _reap(sorted(killed))
        _reap(sorted(killed))


def _descendants(root: int) -> list[int]:
    """Every live (non-zombie) process below `root`, from /proc; [] where there is none."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], sig: int, *, group_only: bool = False) -> None:
    """Signal each pid's process group (each is a session leader, or in one) and the pid."""
    for pid in pids:
        for kill in (os.killpg,) if group_only else (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, sig)


def _reap(pids: list[int]) -> None:
    """Collect the exit status of killed orphans vmrun adopted, so no zombie lingers.

    Only named pids: a caller running vmrun in-process keeps its own children's statuses.
    """
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
