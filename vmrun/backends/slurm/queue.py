"""Slurm's job states and pending reasons, read from squeue in a fixed `--format` (its JSON
changed across versions), and what each means for a vmrun run."""

from __future__ import annotations

from dataclasses import dataclass

from vmrun.errors import RemoteError, UsageError, VmrunError
from vmrun.runs.state import RunState

_RUNNING = {
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "STOPPED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
}
_FAILED = {
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}
ENDED = _FAILED | {"COMPLETED", "CANCELLED"}
# Pending reasons that no wait will clear: the job asks for more than the partition, account
# or QOS ever allows, or names what does not exist.
NEVER_STARTS = {
    "PartitionNodeLimit": "more nodes than the partition has or allows",
    "PartitionTimeLimit": "a longer --time than the partition allows",
    "PartitionConfig": "more than the partition's configuration allows",
    "BadConstraints": "a --constraint or resources no node has",
    "InvalidAccount": "an account that is not valid",
    "InvalidQOS": "a QOS that is not valid",
    "AccountNotAllowed": "an account the partition does not allow",
    "QOSJobLimit": "more than the QOS allows per job",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows per job",
    "QOSMaxCpuPerJobLimit": "more CPUs than the QOS allows per job",
    "QOSMaxGRESPerJob": "more GPUs than the QOS allows per job",
    "QOSMaxWallDurationPerJobLimit": "a longer --time than the QOS allows",
    "AssocMaxNodesPerJobLimit": "more nodes than the account allows per job",
    "AssocMaxWallDurationPerJobLimit": "a longer --time than the account allows",
}


@dataclass(frozen=True)
class JobState:
    """One job as squeue says (`%T|%r`): its state and, while pending, why."""

    state: str
    reason: str = ""

    @classmethod
    def parse(cls, text: str) -> JobState | None:
        text = text.strip()
        if not text:
            return None
        state, _, reason = text.partition("|")
        return cls(state.strip().upper(), "" if reason.strip() == "None" else reason.strip())

    @property
    def run_state(self) -> RunState:
        base = self.state.split()[0].rstrip("+") if self.state else ""
        if base == "PENDING":
            return RunState.PENDING
        if base in _RUNNING:
            return RunState.RUNNING
        if base == "COMPLETED":
            return RunState.DONE
        if base == "CANCELLED":
            return RunState.STOPPED
        if base in _FAILED:
            return RunState.FAILED
        return RunState.LOST

    @property
    def never_starts(self) -> str | None:
        """Why the job can never start, when its pending reason says so."""
        if self.state != "PENDING":
            return None
        return NEVER_STARTS.get(self.reason)

    def describe(self) -> str:
        if self.state == "PENDING" and self.reason:
            return f"PENDING ({self.reason})"
        return self.state


def explain_failure(state: str) -> str:
    """Words for a job's end that its exit code does not tell."""
    return {
        "TIMEOUT": "hit its --time limit",
        "NODE_FAIL": "lost a node",
        "OUT_OF_MEMORY": "ran out of memory (--mem)",
        "PREEMPTED": "was preempted",
        "BOOT_FAIL": "could not boot its nodes",
        "DEADLINE": "passed its deadline",
        "CANCELLED": "was cancelled",
    }.get(state, state.lower())


def submit_refusal(status: int, err: str, cluster: str, check: str) -> VmrunError:
    """sbatch's answer when it did not take a job (the submit scripts' exit 2: its own
    refusal, printed), as one line; `check`: what the user should check."""
    text = " ".join(err.split())
    if status == 2:
        return UsageError(
            f"cluster {cluster} refused the job: {text}",
            hint=f"check {check} against `sinfo` there",
            code="job-refused",
        )
    return RemoteError(
        f"could not submit to {cluster}: {text or status}", host=cluster, code="submit-failed"
    )
