"""Putting a run's code on a host: the template trainer into ~/.vmrun/lib, or the project
synced to its work directory (warning about large files), so the script runs there as it
would by hand.
"""

from __future__ import annotations

from vmrun.backends.hosts.node_launch import Node
from vmrun.errors import RemoteError, UsageError
from vmrun.remote_paths import LIB_DIR, remote_workdir
from vmrun.reporting import Reporter
from vmrun.runs.plan import Plan
from vmrun.transfer.types import Progress


def stage(
    node: Node,
    plan: Plan,
    out: Reporter,
    progress: Progress | None = None,
    files: list[str] | None = None,
) -> None:
    """Put the code on the host: node.workdir, and node.script as the run will see it;
    then the run's --data. `files`: the project's files to sync, listed once for every host
    (None: listed here)."""
    _stage_code(node, plan, out, progress, files)
    if plan.data:
        _push_data(node, plan, out, progress)


def _push_data(node: Node, plan: Plan, out: Reporter, progress: Progress | None) -> None:
    from vmrun.stores.data import place_data

    access = plan.store_access.on(node.entry.vars) if plan.store_access else None
    node.data += place_data(node.conn, plan.data, node.workdir, out, progress, access)


def _stage_code(
    node: Node, plan: Plan, out: Reporter, progress: Progress | None, files: list[str] | None
) -> None:
    from vmrun.sync.files import large_files, project_files
    from vmrun.sync.project import sync_project
    from vmrun.trainer import is_bundled
    from vmrun.transfer.upload import upload

    conn = node.conn
    node.workdir = workdir = remote_workdir(plan.project)
    if is_bundled(plan.script):  # the run's cwd; a SCRIPT's sync makes it itself
        conn.run(["mkdir", "-p", workdir], check=True)
        remote = f"{LIB_DIR}/vmrun_{plan.script.name}"
        report = upload(conn, plan.script, remote)
        if not report.ok:
            raise RemoteError(
                f"could not place vmrun's {plan.script.name} on the host", host=conn.label
            )
        node.script = f"{node.env.home}/{remote}"
        return
    try:
        script = plan.script.relative_to(plan.project).as_posix()
    except ValueError:
        raise UsageError(
            f"script {plan.script} is outside the project {plan.project}, so it"
            " would not be synced",
            hint="run vmrun from the project, or move the script into it",
            code="script-not-synced",
        ) from None
    files = project_files(plan.project) if files is None else files
    if script not in files:
        raise UsageError(
            f"script {script} is excluded from the sync (.gitignore,"
            " .vmrunignore or vmrun's defaults)",
            hint=f"add `!{script}` to .vmrunignore",
            code="script-not-synced",
        )
    for name, size in large_files(plan.project, files):
        out.warn(
            f"{conn.label}: syncing a large file: {name} ({size / 2**20:.0f} MiB);"
            " list it in .vmrunignore to leave it here"
        )
    synced = sync_project(conn, plan.project, workdir, files=files, progress=progress)
    if progress is None:  # else the progress view has shown them
        for text in synced.warnings:
            out.warn(f"{conn.label}: {text}")
    if synced.sent:
        out.info(
            f"{conn.label}: synced {synced.sent} file(s), {synced.sent_bytes / 2**20:.1f} MiB"
            f" ({synced.engine}, {synced.seconds:.1f} s) to ~/{workdir}"
        )
    node.script = script
