"""The Slurm backend over its contract's fakes: the login node is a home on this machine,
where vmrun's login-node scripts run by `sh` as they would over SSH (LocalConnection, a
STAND-IN for a Connection), against a small fake scheduler (tests/fake_slurm.py, a STAND-IN for
Slurm) first on the PATH; the project's sync is a copy (STAND-IN for rsync over SSH).
Everything else (the batch script, submission, listing, following, stopping) is the real
code."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import fake_slurm
from conftest import install_hostlib
from contract_harness import Gate, pid_alive
from local_connection import LocalConnection, kill_group

from vmrun.backends.api import RunRef
from vmrun.backends.slurm.backend import SlurmBackend
from vmrun.backends.slurm.cluster import Cluster
from vmrun.backends.slurm.job import check_spec
from vmrun.backends.slurm.options import SlurmOptions
from vmrun.reporting import Reporter
from vmrun.runs.plan import Plan
from vmrun.transfer.types import Progress


class SlurmHarness(Gate):
    resumes = False  # Slurm requeues a job itself; `start(resume=...)` is refused

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        self.home = tmp_path / "login-home"
        install_hostlib(self.home)
        self.slurm = tmp_path / "slurm"
        fake_slurm.install(self.slurm, self.slurm / "bin")
        self.conn = LocalConnection("bed", self.home, self.slurm / "bin")
        cluster = Cluster("bed", "login", python=sys.executable)
        spec = check_spec(SlurmOptions().job_spec(cluster, None), "python")
        self.backend = SlurmBackend(
            self.conn,
            cluster,
            spec,
            poll=0.05,  # type: ignore[arg-type]
            unanswered_limit=30,
        )
        self.backend._sync = self._copy  # type: ignore[method-assign]

    def _copy(self, plan: Plan, code: str, out: Reporter, progress: Progress | None) -> None:
        """STAND-IN for the project's sync over SSH (rsync): the files it would send, copied
        into the code folder on the "shared filesystem" (the login home)."""
        from vmrun.sync.files import project_files

        for name in project_files(plan.project):
            (Path(code) / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(plan.project / name, Path(code) / name)

    def __enter__(self) -> SlurmHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        for job in fake_slurm.jobs(self.slurm, None):  # every job's processes, whatever happened
            supervisor = job.dir / "supervisor"
            if supervisor.exists():
                kill_group(int(supervisor.read_text()))
            if pgid := job.read().get("pgid"):
                kill_group(int(pgid))

    def plan(self) -> Plan:
        return super().plan()

    def began(self, ref: RunRef) -> bool:
        return super().began()

    def alive(self, ref: RunRef) -> bool:
        state = fake_slurm.Job(self.slurm, ref.record.job.job_id if ref.record.job else "").read()
        began = int(self.began_file.read_text()) if self.began_file.exists() else 0
        return bool(began and pid_alive(began)) or fake_slurm.group_alive(int(state["pgid"]))

    def exists(self, path: str) -> bool:
        return (self.home / path).exists()
