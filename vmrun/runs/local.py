"""Training on this machine (`vmrun train --local`): launch, tee, supervise, stop completely.

Ctrl-C (or SIGTERM/SIGHUP to vmrun) stops the whole run:
SIGTERM to its process group, then SIGKILL to everything that descends from it after a grace
period. torchrun starts each worker in a session of its own, so vmrun also makes itself a
child subreaper while the run lasts: workers orphaned by a dying torchrun are re-parented to
vmrun, so they are still found and killed.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from vmrun.containers.runtime import IMAGE_PYTHON
from vmrun.errors import Interrupted, UsageError, run_failed
from vmrun.reporting import QUIET, Reporter
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import LOCAL, Image, Launch, LocalEnd, RunRecord
from vmrun.runs.lines import Prefixer
from vmrun.runs.plan import (
    CPU_PROCESSES,
    STOP_GRACE_S,
    Plan,
    free_port,
    probe_torch,
    utc_now,
    write_json_atomic,
)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def run_local(
    plan: Plan,
    *,
    verbose: bool = False,
    on_start: Callable[[str], None] | None = None,
    out: Reporter = QUIET,
) -> int:
    """Probe torch, create the run directory, launch, stream, record; return the exit code.
    Output as on hosts (to `out.output`): whole lines per rank, `[rankN]`; torchrun's banner
    and c10d's host name warnings only in train.log unless `verbose`. `on_start`: told the
    run id once its record exists (a sweep keeps it)."""
    from vmrun.runs import launch

    request = plan.containers.resolve({})
    image = None
    if request is not None:
        from vmrun.runs import local_image

        image = local_image.prepare(request, out)
    python = IMAGE_PYTHON if image else sys.executable
    child_env = {**os.environ, **plan.env}
    gpus = image.gpus if image else probe_torch(python, child_env)
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
    outer = dict(child_env)
    argv = _argv(plan, python, nproc, rid, rel_dir, child_env)
    child_env.update({"PYTHONUNBUFFERED": "1", "VMRUN_RUN_ID": rid, "VMRUN_RUN_DIR": str(run_dir)})
    if image is not None:  # the variables vmrun and --env set, and NCCL_*, by name only
        names = {k for k, v in child_env.items() if outer.get(k) != v} | set(plan.env)
        names |= {k for k in child_env if k.startswith("NCCL_")}
        argv = local_image.wrap(
            image, argv, sorted(names), project=plan.project, rid=rid, script=plan.script
        )
    record = _record(plan, rid, nproc, argv, run_dir, python)
    record = replace(
        record,
        launch=replace(
            record.launch,
            image=Image.from_json(image.meta()) if image else None,
            variables=_variables(plan, child_env, outer),
        ),
        code=_code(plan, run_dir),
    )
    _write(run_dir, record)
    if on_start is not None:
        on_start(rid)
    procs = f"{nproc} processes" if plan.launcher == "torchrun" else "1 process"
    out.info(f"run {rid}: {plan.script.name}, {plan.launcher}, {procs}; files in {rel_dir}/")
    own = {k: v for k, v in child_env.items() if k not in ("VMRUN_RUN_ID", "VMRUN_RUN_DIR")}
    collector = _describe(run_dir, own, in_image=image is not None)  # not one of the run's
    try:
        code = _supervise(plan, rid, run_dir, rel_dir, record, argv, child_env, out, verbose)
    except (KeyboardInterrupt, Interrupted):
        _finish(collector, wait=0.5)  # stopping: at once
        raise
    except BaseException:
        _finish(collector, wait=5.0)
        raise
    _finish(collector)
    return code


def _variables(
    plan: Plan, child_env: dict[str, str], outer: dict[str, str]
) -> dict[str, str | None]:
    """What vmrun set for the run (values) and what the user gave (--env: names only)."""
    from vmrun.runs.provenance import variables

    given = {k: v for k, v in child_env.items() if outer.get(k) != v or k in plan.env}
    return variables(given, list(plan.env))


def _code(plan: Plan, run_dir: Path) -> dict[str, Any]:
    """The code's facts for run.json; its uncommitted diff into the run's code.patch."""
    from vmrun.runs.provenance import code_of, sent_patch

    code = code_of(plan.project, trainer=plan.script if plan.is_template else None)
    patch = sent_patch(code.patch)
    if patch:
        (run_dir / "code.patch").write_bytes(patch)
    return code.facts


def _describe(
    run_dir: Path, env: dict[str, str], *, in_image: bool
) -> subprocess.Popen[bytes] | None:
    """hostside/run_provenance.py beside the run, as on a host: vmrun's interpreter is the
    run's, with the run's environment (its PYTHONPATH); in an image, the machine's hardware
    alone. A session of its own, so that what it starts goes with it."""
    from vmrun.hostside import HERE

    argv = [sys.executable, str(HERE / "run_provenance.py"), str(run_dir)]
    try:
        return subprocess.Popen(
            [*argv, *(["--hardware-only"] if in_image else [])],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


def _finish(collector: subprocess.Popen[bytes] | None, wait: float = 30.0) -> None:
    """Nothing left behind: the collector has its time, then its whole session (a torch
    or conda child included) is killed."""
    if collector is None:
        return
    try:
        collector.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(collector.pid, signal.SIGKILL)
        collector.wait()


def _argv(
    plan: Plan, python: str, nproc: str | None, rid: str, rel_dir: str, child_env: dict[str, str]
) -> list[str]:
    """The launcher's argv; its variables go into child_env (an explicit --env wins)."""
    from vmrun.runs import launch

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
            log_dir=os.path.join(rel_dir, "workers"),  # each rank's own output, kept whole
        )
        env = {
            **launch.torchrun_env(plan.max_restarts),
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": launch.RANK_PREFIX_TEMPLATE,
        }
        for key, value in env.items():
            child_env.setdefault(key, value)  # an explicit --env or outer value wins
    else:
        argv = launch.python_argv(python, str(plan.script), args)
    if plan.launcher == "env":
        child_env.update(
            launch.env_wiring(
                node_rank=0, nnodes=1, master_addr="127.0.0.1", master_port=free_port()
            )
        )
    return argv


def _record(
    plan: Plan, rid: str, nproc: str | None, argv: list[str], run_dir: Path, python: str
) -> RunRecord:
    return RunRecord(
        run_id=rid,
        where=LOCAL,
        launch=Launch(
            script=str(plan.script),
            template=plan.is_template,
            launcher=plan.launcher,
            args=tuple(plan.args),
            nproc={"torchrun": nproc, "env": "1"}.get(plan.launcher),  # python: the script's
            max_restarts=plan.max_restarts,
            argv=tuple(argv),
            env_keys=tuple(sorted(plan.env)),  # names only: values may be secrets
            python=python,
        ),
        local=LocalEnd(
            status="running", cwd=str(plan.project), run_dir=str(run_dir), start_time=utc_now()
        ),
    )


def _write(run_dir: Path, record: RunRecord) -> None:
    write_json_atomic(run_dir / "run.json", record.to_json())


def _ended(record: RunRecord, **how: Any) -> RunRecord:
    """The record with how the run went (`status`, `end_time`, `exit_code`, ...)."""
    return replace(record, local=replace(record.local or LocalEnd(), **how))


def _supervise(
    plan: Plan,
    rid: str,
    run_dir: Path,
    rel_dir: str,
    record: RunRecord,
    argv: list[str],
    child_env: dict[str, str],
    out: Reporter,
    verbose: bool = False,
) -> int:
    """Run it to the end, recording how it ended; raise unless it exited 0."""
    supervisor = _Supervisor(rid, run_dir, record, out, verbose=verbose)
    try:
        code, stopped = supervisor.run(argv, plan.project, child_env)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        _write(run_dir, _ended(supervisor.record, status="error", end_time=utc_now(), error=why))
        raise
    torchrun = plan.launcher == "torchrun" and not stopped
    failure = _worker_failure(run_dir, code) if torchrun else None
    code = failure.exit if failure else code
    status = "stopped" if stopped else ("finished" if code == 0 else "failed")
    _write(run_dir, _ended(supervisor.record, status=status, end_time=utc_now(), exit_code=code))
    if stopped:
        raise Interrupted(f"run {rid} stopped", hint=f"its files are in {rel_dir}/")
    if code != 0:
        why = f"exited with {code}" + (f": {failure.describe()}" if failure else "")
        raise run_failed(rid, why, code, hint=f"see {rel_dir}/train.log")
    out.info(f"run {rid} finished; files in {rel_dir}/")
    return 0


def _worker_failure(run_dir: Path, code: int) -> WorkerFailure | None:
    """torchrun exits 1 when a worker fails: which one, and its own code, from torchrun's
    summary in train.log (hostside/run_failure.py, as on the hosts: failure.json here)."""
    if code != 1:
        return None
    from vmrun import hostside

    script = hostside.HERE / "run_failure.py"
    argv = [sys.executable, str(script), str(run_dir), str(run_dir / "train.log"), str(code)]
    try:
        subprocess.run(argv, capture_output=True, timeout=30, check=False)
        return WorkerFailure.parse((run_dir / "failure.json").read_text())
    except (OSError, subprocess.SubprocessError):
        return None


class _ToFile(Reporter):
    """The run's lines into its train.log, as they come."""

    def __init__(self, supervisor: _Supervisor):
        self.supervisor = supervisor

    def output(self, data: bytes) -> None:
        log = self.supervisor.log
        if log is not None:
            log.write(data)
            log.flush()


class _Shown(Reporter):
    """The run's lines to the caller's `out`, until it can take no more (its reader gone)."""

    def __init__(self, out: Reporter):
        self.out = out
        self.ok = True

    def output(self, data: bytes) -> None:
        if self.ok:
            try:
                self.out.output(data)
            except (BrokenPipeError, ValueError):
                self.ok = False  # nobody reads our stdout any more; train.log keeps it


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


def die_with_vmrun() -> None:
    """In the child before exec: get SIGTERM when vmrun dies, even by SIGKILL."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Supervisor:
    """Runs the child in its own session, tees its output, and on a stop request ends every
    process of the run: those below vmrun that carry VMRUN_RUN_ID=<this run> (so a caller's
    other children are never touched, even when vmrun runs in-process in a test)."""

    def __init__(
        self,
        rid: str,
        run_dir: Path,
        record: RunRecord,
        out: Reporter,
        *,
        verbose: bool = False,
    ):
        self.rid = rid
        self.run_dir = run_dir
        self.record = record
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: BinaryIO | None = None
        self.to_log = Prefixer(None, _ToFile(self), verbose=True)  # train.log keeps all
        self.to_terminal = Prefixer(None, _Shown(out), verbose=verbose)

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
                        preexec_fn=die_with_vmrun,
                    )
                    self.record = _ended(self.record, pid=self.proc.pid)
                    _write(self.run_dir, self.record)
                    while self.pump(None):
                        pass
                    self.to_log.flush()
                    self.to_terminal.flush()
                    code = self.proc.wait()
                    return (128 - code if code < 0 else code), False
                except (KeyboardInterrupt, _StopRequested):
                    self.stop()
                    self.to_log.flush()  # a last partial line, as it is
                    self.to_terminal.flush()
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
        self.to_log.feed(data)
        self.to_terminal.feed(data)
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
