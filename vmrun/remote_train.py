"""Training on a host over SSH: preflight, code sync, a detached start, the live log, the exit.

The run is started with `runs.start`, so it outlives this process and the connection: Ctrl-C
here only detaches (the run goes on; `vmrun logs -f RUN` reattaches), and a dropped
connection says how to reattach instead of losing the run.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vmrun import launch, runs
from vmrun.config import Settings
from vmrun.connection import Connection
from vmrun.errors import CommandFailed, ConnectionLostError, Interrupted, RemoteError, UsageError
from vmrun.inventory import HostEntry
from vmrun.train import CPU_PROCESSES, Plan

REMOTE_TEMPLATE = ".vmrun/lib/vmrun_template.py"  # under the remote home

# One round trip: the home directory, then the environment setup recorded (base64 JSON).
_PREFLIGHT = 'printf "%s\\n" "$HOME"; base64 -w0 "$HOME/.vmrun/host.json" 2>/dev/null; echo'

Note = Callable[[str], None]


@dataclass(frozen=True)
class HostEnv:
    home: str
    python: str
    record: dict[str, Any]

    @property
    def gpus(self) -> int:
        try:
            return int(self.record.get("gpus", 0))
        except (TypeError, ValueError):
            return 0


def host_env(conn: Connection, entry: HostEntry) -> HostEnv:
    """The interpreter to train with: vmrun.toml's `python` for the host, else setup's record."""
    out = conn.run(["sh", "-c", _PREFLIGHT], check=True).stdout_tail.splitlines()
    home = out[0] if out else ""
    record: dict[str, Any] = {}
    if len(out) > 1 and out[1].strip():
        try:
            record = json.loads(base64.b64decode(out[1]))
        except ValueError:
            record = {}
    python = str(entry.vars.get("python") or record.get("python") or "")
    if not python:
        raise UsageError(
            "no Python environment is recorded for this host; nothing was started",
            host=entry.label,
            hint=f'run `vmrun setup {entry.label}` first, or set python = "/path/to/python"'
            " for it in vmrun.toml",
        )
    return HostEnv(home, python, record)


def check_not_busy(conn: Connection, allow_concurrent: bool) -> None:
    if allow_concurrent:
        return
    busy = [r for r in runs.list_runs(conn) if r.state == "running"]
    if busy:
        raise UsageError(
            f"this host is already running {busy[-1].id}; two runs would share its GPUs",
            host=conn.label,
            hint=f"wait, `vmrun stop {busy[-1].id}`, or pass --allow-concurrent",
        )


def run_remote(
    plan: Plan,
    entries: list[HostEntry],
    settings: Settings,
    *,
    detach: bool,
    allow_concurrent: bool,
    on_line: Callable[[bytes], None],
    note: Note,
) -> int:
    if len(entries) != 1:
        names = ", ".join(e.label for e in entries)
        raise UsageError(
            f"several hosts given ({names}): multi-node training is not available yet",
            hint="pick one host with -H",
        )
    (entry,) = entries
    with Connection(entry.spec, settings, label=entry.label) as conn:
        env_info = host_env(conn, entry)
        check_not_busy(conn, allow_concurrent)
        rid = launch.run_id(plan.name)
        workdir, script = _stage(conn, plan, env_info, note)
        out_dir = f"{workdir}/results/{rid}" if plan.is_template else workdir
        argv, env, nproc = _launch_argv(plan, env_info, script, rid)
        meta = {
            "name": plan.name,
            "script": script,
            "template": plan.is_template,
            "launcher": plan.launcher,
            "nproc": nproc,
            "max_restarts": plan.max_restarts,
            "workdir": workdir,
            "out_dir": out_dir,
            "python": env_info.python,
            "argv": argv,
            "env_keys": sorted(plan.env),
            "host": entry.label,
            "nnodes": 1,
            "node_rank": 0,
        }
        pid = runs.start(conn, rid, workdir, argv, meta, env=env)
        note(f"run {rid} started on {entry.label} (pid {pid}); its files: ~/{out_dir}/")
        if detach:
            note(f"follow it with `vmrun logs -f {rid}`; stop it with `vmrun stop {rid}`")
            return 0
        try:
            runs.follow(conn, rid, on_line)
        except (KeyboardInterrupt, Interrupted):
            raise Interrupted(
                f"detached from run {rid}; it goes on running on {entry.label}",
                hint=f"reattach with `vmrun logs -f {rid}`, stop it with `vmrun stop {rid}`",
            ) from None
        except ConnectionLostError as exc:
            raise ConnectionLostError(
                f"{exc.message}; run {rid} goes on running there",
                host=entry.label,
                hint=f"reattach with `vmrun logs -f {rid}`",
            ) from None
        (record,) = runs.list_runs(conn, [rid])
    if record.exit_code == 0:
        note(f"run {rid} finished on {entry.label}; `vmrun fetch --run {rid}` brings its files")
        return 0
    code = record.exit_code if record.exit_code is not None else 1
    raise CommandFailed(
        f"run {rid} exited with {code}",
        host=entry.label,
        exit_status=code,
        hint=f"see `vmrun logs {rid}`",
    )


def _stage(conn: Connection, plan: Plan, env_info: HostEnv, note: Note) -> tuple[str, str]:
    """Put the code on the host; return (workdir, script path as the run will see it)."""
    from vmrun.sync import large_files, project_files, remote_workdir, sync_project
    from vmrun.transfer_upload import upload

    workdir = remote_workdir(plan.project)
    conn.run(["mkdir", "-p", workdir], check=True)
    if plan.is_template:
        report = upload(conn, plan.script, REMOTE_TEMPLATE)
        if not report.ok:
            raise RemoteError("could not place the template trainer on the host", host=conn.label)
        return workdir, f"{env_info.home}/{REMOTE_TEMPLATE}"
    try:
        script = plan.script.relative_to(plan.project).as_posix()
    except ValueError:
        raise UsageError(
            f"script {plan.script} is outside the project {plan.project}, so it"
            " would not be synced",
            hint="run vmrun from the project, or move the script into it",
        ) from None
    files = project_files(plan.project)
    if script not in files:
        raise UsageError(
            f"script {script} is excluded from the sync (.gitignore,"
            " .vmrunignore or vmrun's defaults)",
            hint="add `!{script}` to .vmrunignore",
        )
    for name, size in large_files(plan.project, files):
        note(
            f"warning: syncing a large file: {name} ({size / 2**20:.0f} MiB); list it in"
            " .vmrunignore to leave it here"
        )
    report = sync_project(conn, plan.project, workdir, files=files)
    if report.sent:
        note(
            f"synced {report.sent} file(s), {report.sent_bytes / 2**20:.1f} MiB"
            f" ({report.engine}, {report.seconds:.1f} s) to ~/{workdir}"
        )
    return workdir, script


def _launch_argv(
    plan: Plan, env_info: HostEnv, script: str, rid: str
) -> tuple[list[str], dict[str, str], str]:
    args = list(plan.args)
    if plan.is_template and "--out-dir" not in args:
        args += ["--out-dir", f"results/{rid}"]
    env = {"PYTHONUNBUFFERED": "1", **plan.env}
    nproc = plan.nproc or ("gpu" if env_info.gpus else str(CPU_PROCESSES))
    if plan.launcher == "torchrun":
        argv = launch.torchrun_argv(
            env_info.python,
            script,
            args,
            nproc_per_node=nproc,
            max_restarts=plan.max_restarts,
            rdzv_endpoint="localhost:0",
            rdzv_id=rid,
        )
        for key, value in launch.torchrun_env(plan.max_restarts).items():
            env.setdefault(key, value)
        return argv, env, nproc
    argv = launch.python_argv(env_info.python, script, args)
    if plan.launcher == "env":
        port = random.randint(29500, 29999)
        env.update(
            launch.env_wiring(node_rank=0, nnodes=1, master_addr="127.0.0.1", master_port=port)
        )
    return argv, env, "1"
