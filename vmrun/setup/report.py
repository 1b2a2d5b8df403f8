"""What a setup run is asked to do (SetupOptions) and what it did (HostReport, StepOutcome)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vmrun.compat import StrEnum
from vmrun.setup.facts import Facts
from vmrun.setup.playbook import Playbook


@dataclass
class SetupOptions:
    playbook: Playbook
    params: dict[str, str]
    force: frozenset[str] = frozenset()
    only: frozenset[str] = frozenset()
    dry_run: bool = False
    wheelhouse: Path | None = None
    installer: Path | None = None
    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    reboot_timeout: float = 600.0
    log_dir: Path | None = None
    # a Slurm cluster's login node (`setup -C`): steps that need root (sudo, apt, reboot) do
    # not apply there, and setup's state, record and envs live under `root` (the cluster's
    # absolute workdir on the shared filesystem) rather than the home
    cluster: bool = False
    root: str = ""

    def path(self, relative: str) -> str:
        """One of remote_paths' paths (relative to the home) where this run keeps it."""
        return f"{self.root.rstrip('/')}/{relative}" if self.root else relative


class StepStatus(StrEnum):
    """A step's verdict, as `vmrun setup` prints it."""

    RAN = "ran"
    SKIPPED = "skipped"  # done before, its check passes
    ADOPTED = "adopted"  # never run by vmrun, but its check passes (already present)
    NOT_APPLICABLE = "n/a"  # its `when` does not hold on this host
    UNSELECTED = "unselected"  # left out by --only
    WOULD_RUN = "would-run"  # planned (what --dry-run shows)
    CHECK = "check"  # while planning: its check decides


@dataclass
class StepOutcome:
    name: str
    status: StepStatus
    detail: str = ""
    duration: float = 0.0
    script: str = ""  # for --dry-run: exactly what would run


@dataclass
class HostReport:
    host: str
    facts: Facts
    steps: list[StepOutcome] = field(default_factory=list)
    record: dict[str, str] = field(default_factory=dict)
    rebooted: bool = False
    python: str = ""
    notes: list[str] = field(default_factory=list)  # for --dry-run: what a real run would hit

    @property
    def ran(self) -> list[str]:
        return [s.name for s in self.steps if s.status == StepStatus.RAN]
