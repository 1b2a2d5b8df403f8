"""One exception tree, one table of exit codes, one registry of error codes.

Every failure vmrun reports is a `VmrunError`; its class decides the exit code, so the CLI
maps errors to codes in exactly one place (`exit_code_for`). Messages are one line that
names the host (when there is one) and says what to do.

Each error also carries a stable `code` (`host-key-changed`, `run-not-found`): the fact,
for scripts and tests, that survives any rewording of the message. A class has its own code;
a raise site names a more specific one (`UsageError(..., code="run-not-found")`) where one
class covers several facts. Every code is registered here, once, with the class whose exit
code it has, so `CODES` lists them all (docs/errors.md is checked against it).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any


class ExitCode(enum.IntEnum):
    """Exit statuses, documented in docs/errors.md (tests/test_errors.py keeps the two in step)."""

    OK = 0
    FAILED = 1  # a remote command or run failed (exec returns the worst remote code itself)
    USAGE = 2  # bad input: flags, host specs, vmrun.toml
    HOST_KEY = 10  # unknown or changed host key
    AUTH = 11  # authentication failed
    UNREACHABLE = 12  # DNS failure, refused, no route, connect timeout
    CONNECTION_LOST = 13  # link dropped or stopped answering mid-command
    REMOTE = 14  # the host answered but could not do what was asked (missing tool, no space)
    CLOUD = 15  # the cloud refused or failed a request (quota, capacity, credentials)
    TIMEOUT = 124  # a remote command hit --timeout (the code timeout(1) uses)
    INTERRUPTED = 130  # Ctrl-C


@dataclass(frozen=True)
class ErrorCode:
    """One registered code: the class that carries it (its exit code) and what it means."""

    name: str
    owner: str  # the class's name; "" for the CLI's own (bad flags, internal errors)
    exit_code: int
    meaning: str
    own_status: bool = False  # exits with the failed command's own status (1 if none)


CODES: dict[str, ErrorCode] = {}
_KEBAB = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def register(name: str, owner: Any, meaning: str, exit_code: int | None = None) -> str:
    """Add a code (owner: the error class whose exit code it has, or the exit code of a
    line the CLI prints itself; `exit_code`: the status a CommandFailed's code always has).
    A code is registered once, so two facts never share a name by accident."""
    if not _KEBAB.fullmatch(name):
        raise ValueError(f"error code {name!r} is not kebab-case")
    if name in CODES:
        raise ValueError(f"error code {name!r} is registered twice")
    if isinstance(owner, int):
        CODES[name] = ErrorCode(name, "", int(owner), meaning)
        return name
    own = exit_code is None and any(k.__name__ == "CommandFailed" for k in owner.__mro__)
    status = int(owner.exit_code if exit_code is None else exit_code)
    CODES[name] = ErrorCode(name, owner.__name__, status, meaning, own)
    return name


class VmrunError(Exception):
    """Root of every error vmrun reports; `host` is set when one host is to blame, `code`
    (the class's, or the raise site's more specific one) says what happened."""

    exit_code: int = ExitCode.FAILED
    code: str = "failed"

    def __init_subclass__(cls, *, code: str | None = None, meaning: str = "", **kw: Any):
        super().__init_subclass__(**kw)
        if code is None:
            raise TypeError(
                f"{cls.__name__} needs its own error code: class {cls.__name__}(...,"
                " code=..., meaning=...)"
            )
        cls.code = register(code, cls, meaning)

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        hint: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.host = host
        self.hint = hint
        if code is not None:
            entry = CODES.get(code)
            if entry is None or not _may_carry(type(self), entry):
                raise ValueError(f"{type(self).__name__} cannot carry error code {code!r}")
            self.code = code

    def one_line(self) -> str:
        """The single line shown without --debug: `host: what happened; what to do`."""
        text = self.message
        if self.hint:
            text = f"{text}; {self.hint}"
        if self.host and not text.startswith(f"{self.host}:"):
            text = f"{self.host}: {text}"
        return text

    def __str__(self) -> str:
        return self.one_line()


register("failed", VmrunError, "a failure that has no more specific code")


def _may_carry(cls: type[VmrunError], entry: ErrorCode) -> bool:
    """A site code is its owner's (or a subclass's with the same exit code), so the exit
    code docs/errors.md gives for it is the one the process returns."""
    if not any(k.__name__ == entry.owner for k in cls.__mro__):
        return False
    return issubclass(cls, CommandFailed) or cls.exit_code == entry.exit_code


def code_of(err: BaseException) -> str:
    """The code printed for any failure: a VmrunError's own, Ctrl-C's, or `internal`."""
    if isinstance(err, VmrunError):
        return err.code
    if isinstance(err, KeyboardInterrupt):
        return Interrupted.code
    return "internal"


class UsageError(
    VmrunError,
    code="usage",
    meaning="bad input: a flag, an argument, or flags that do not go together",
):
    exit_code = ExitCode.USAGE


class HostSpecError(UsageError, code="bad-host-spec", meaning="a host is not `user@host[:port]`"):
    pass


class ConfigError(
    UsageError,
    code="bad-config",
    meaning="a bad value in vmrun.toml, config.toml, an ssh config or a playbook",
):
    pass


class HostKeyError(
    VmrunError,
    code="host-key-rejected",
    meaning="the host key could not be checked (ssh refused it, or known_hosts is unreadable)",
):
    exit_code = ExitCode.HOST_KEY


class UnknownHostKeyError(
    HostKeyError,
    code="host-key-unknown",
    meaning="the host's key is not known here and was not accepted",
):
    pass


class ChangedHostKeyError(
    HostKeyError,
    code="host-key-changed",
    meaning="the host offers another key than the one known here",
):
    pass


class AuthError(
    VmrunError, code="auth-failed", meaning="the host refused every key, agent and password offered"
):
    exit_code = ExitCode.AUTH


class UnreachableError(
    VmrunError,
    code="host-unreachable",
    meaning="no SSH connection: DNS failure, refused, no route, connect timeout, not SSH",
):
    exit_code = ExitCode.UNREACHABLE


class ConnectionLostError(
    VmrunError,
    code="connection-lost",
    meaning="the connection dropped or stopped answering mid-command",
):
    exit_code = ExitCode.CONNECTION_LOST


class RemoteError(
    VmrunError, code="remote-failed", meaning="the host answered but could not do what was asked"
):
    exit_code = ExitCode.REMOTE


class CloudError(
    VmrunError,
    code="cloud-failed",
    meaning="the cloud refused or failed a request (the line names it)",
):
    """An answer from a cloud provider's API that vmrun cannot work around: the message
    names the call and the cloud's own error code, the hint what to do."""

    exit_code = ExitCode.CLOUD


class OutcomeUnknown(
    RemoteError,
    code="outcome-unknown",
    meaning="the scheduler stopped answering: the run may still be running",
):
    """A followed run whose end nobody can confirm (a scheduler that stopped answering): it
    may still run, so nothing that waits for its end (a sweep's next size) may go on."""


class Interrupted(
    VmrunError, code="interrupted", meaning="Ctrl-C; what vmrun started remotely was stopped"
):
    """Ctrl-C, after vmrun has cleaned up (closed channels, so remote commands stopped)."""

    exit_code = ExitCode.INTERRUPTED


class Detached(
    VmrunError, code="detached", meaning="Ctrl-C while following a run that goes on (not a failure)"
):
    """Ctrl-C while following a run that goes on running (`train`, `logs -f`): information,
    not a failure; the message says how to reattach."""

    exit_code = ExitCode.OK


class CommandFailed(VmrunError, code="command-failed", meaning="a remote command exited non-zero"):
    """A remote command exited non-zero where success was required."""

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        hint: str | None = None,
        exit_status: int = 1,
        output_tail: str = "",
        code: str | None = None,
    ):
        super().__init__(message, host=host, hint=hint, code=code)
        self.exit_status = exit_status
        self.output_tail = output_tail


def run_failed(
    rid: str, why: str, code: int | None, *, host: str | None = None, hint: str | None = None
) -> CommandFailed:
    """A followed run that ended badly, said alike by every backend: `run RID WHY`, code
    run-failed, vmrun's exit status the run's own code where it fits in one (else 1)."""
    status = code if code is not None and 0 < code < 256 else 1
    return CommandFailed(
        f"run {rid} {why}", host=host, hint=hint, exit_status=status, code="run-failed"
    )


def run_stopped(rid: str, *, host: str | None = None) -> CommandFailed:
    """A followed run that `vmrun stop` ended (exit status 143, as SIGTERM's)."""
    return CommandFailed(f"run {rid} was stopped", host=host, exit_status=143, code="run-stopped")


def run_over_budget(rid: str, cap: str, *, host: str | None = None) -> CommandFailed:
    """A followed run that its budget watcher stopped at `train --max-cost` (its work
    saved): exit status 143, as a stop's."""
    return CommandFailed(
        f"run {rid} was stopped at --max-cost {cap}, its work saved",
        host=host,
        exit_status=143,
        code="run-over-budget",
        hint=f"`vmrun train --resume {rid} --max-cost MORE` goes on from its snapshot",
    )


class HostsFailed(
    VmrunError,
    code="hosts-failed",
    meaning="several hosts failed, for different reasons (each is named)",
):
    """Several hosts failed in one fan-out; carries each host's error for the summary, and
    their code when they share one (every host unreachable is `host-unreachable`)."""

    def __init__(self, failures: dict[str, BaseException], total: int):
        self.failures = failures
        whys = "; ".join(_host_line(host, err) for host, err in failures.items())
        super().__init__(f"{len(failures)} of {total} hosts failed: {whys}")
        codes = [exit_code_for(err) for err in failures.values()]
        self.exit_code = max(codes) if codes else ExitCode.FAILED
        shared = {code_of(err) for err in failures.values()}
        if len(shared) == 1:
            self.code = shared.pop()


# -- the codes raise sites give where one class covers several facts -----------------------
_SITE_CODES: tuple[tuple[type[VmrunError], str, str], ...] = (
    (UsageError, "run-not-found", "no run with that id (or no run at all) where vmrun looked"),
    (UsageError, "cluster-not-found", "`-C NAME` names no [[clusters]] table"),
    (UsageError, "group-not-found", "`-H @group` names a group no host in vmrun.toml is in"),
    (
        UnreachableError,
        "handshake-refused",
        "the host's sshd kept dropping handshakes unanswered (MaxStartups)",
    ),
    (UsageError, "no-hosts", "no host was given and vmrun.toml records none"),
    (UsageError, "host-busy", "a run is already alive on the host (see --allow-concurrent)"),
    (UsageError, "run-still-running", "`--resume` of a run that still runs on every node"),
    (
        UsageError,
        "run-not-resumable",
        "the run cannot be resumed from here (older vmrun, other project)",
    ),
    (UsageError, "env-value-missing", "a variable named by --env has no value here"),
    (UsageError, "flags-conflict", "flags that do not go together (the line names them)"),
    (UsageError, "needs-cluster", "a Slurm option (--partition, --time, ...) without -C NAME"),
    (
        UsageError,
        "resume-conflict",
        "`--resume` repeats what was recorded: a flag that would change it is refused",
    ),
    (UsageError, "sweep-not-found", "`sweep --resume` names no recorded sweep"),
    (UsageError, "sweep-complete", "`sweep --resume` of a sweep whose every size is done"),
    (UsageError, "script-not-found", "the training (or batch) script does not exist"),
    (UsageError, "script-no-interpreter", "a batch script without its `#!` interpreter line"),
    (
        UsageError,
        "script-not-synced",
        "the script is outside the project or excluded from the sync",
    ),
    (
        UsageError,
        "host-not-set-up",
        "no Python environment is recorded for the host (`vmrun setup`)",
    ),
    (UsageError, "torch-missing", "torch is not importable by the host's Python"),
    (UsageError, "numpy-missing", "train --fsdp over several nodes: the host's Python lacks numpy"),
    (UsageError, "hosts-differ", "the hosts differ in torch/CUDA versions or GPU counts"),
    (UsageError, "checkpoints-differ", "the nodes hold different checkpoints; nothing was started"),
    (UsageError, "port-busy", "the port asked for (or every port tried) is in use"),
    (UsageError, "sbatch-missing", "the cluster's login host has no sbatch"),
    (UsageError, "bad-cluster-name", "a cluster name Slurm cannot take (lower case, letter first)"),
    (UsageError, "job-refused", "Slurm refused the job (partition, account, qos, time)"),
    (
        UsageError,
        "output-folder",
        "a batch script's --output/--error folder cannot be made, or its --chdir is missing",
    ),
    (UsageError, "job-never-starts", "Slurm says the job can never start; it was cancelled"),
    (UsageError, "metric-not-found", "no run has the metric asked for"),
    (UsageError, "source-not-found", "a path to push is not here, or not a file or folder"),
    (UsageError, "target-not-writable", "the folder to push into cannot be made or written"),
    (UsageError, "notify-url-bad", "a notify URL that is not one Apprise takes"),
    (UsageError, "missing-dependency", "an optional Python package is not installed here"),
    (
        UnreachableError,
        "rendezvous-unreachable",
        "the other hosts cannot reach the master's rendezvous port",
    ),
    (
        UnreachableError,
        "relay-unreachable",
        "a host could not open SSH to another's private address (push sends from here instead)",
    ),
    (RemoteError, "run-start-failed", "the host could not start the run"),
    (RemoteError, "stop-failed", "the run's processes could not be stopped"),
    (RemoteError, "transfer-failed", "files did not arrive intact (upload, sync or a fetch round)"),
    (
        RemoteError,
        "remote-path-not-found",
        "a path asked for is not on the host (or in the bucket, fetching a run's copy there)",
    ),
    (RemoteError, "submit-failed", "sbatch failed for a reason other than refusing the job"),
    (RemoteError, "needs-root", "setup steps need root and sudo cannot give it"),
    (
        RemoteError,
        "slurm-host-unfit",
        "a host cannot be a Slurm node (no root, no systemd, another Slurm, packages missing)",
    ),
    (RemoteError, "slurm-nodes-down", "the cluster's nodes did not come into service in time"),
    (RemoteError, "slurm-not-shared", "the --shared folder is not one folder on every host"),
    (RemoteError, "slurm-busy", "the cluster to remove still has jobs in its queue"),
    (
        UsageError,
        "no-shared-folder",
        "what was asked needs a folder every node sees; the cluster was made without one",
    ),
    (
        RemoteError,
        "node-not-found",
        "a run's files are on a node the cluster (made without a shared folder) no longer has",
    ),
    (RemoteError, "reboot-needed", "a setup step needs a reboot to take effect"),
    (RemoteError, "reboot-failed", "the host still answers from the same boot after a reboot"),
    (RemoteError, "driver-too-old", "the NVIDIA driver is too old for the torch wheels"),
    (RemoteError, "no-master-address", "the master has no IPv4 address the other hosts could use"),
    (
        RemoteError,
        "autostop-failed",
        "installing, reading or removing the autostop watchdog failed",
    ),
    (RemoteError, "power-off-failed", "the host was not powered off"),
    (RemoteError, "tensorboard-failed", "TensorBoard on the host did not start or stopped"),
    (RemoteError, "no-gpu", "no NVIDIA driver, nvidia-smi or GPU on the host (watch-gpus)"),
    (RemoteError, "nvidia-smi-failed", "nvidia-smi failed on the host (watch-gpus)"),
    (
        CommandFailed,
        "run-failed",
        "the run exited non-zero (vmrun exits with its status: a failed torchrun worker's own)",
    ),
    (VmrunError, "checksum-mismatch", "a fetched file's SHA-256 differs from the host's"),
    (VmrunError, "file-not-fetched", "a file could not be fetched or placed here"),
    (VmrunError, "write-failed", "a file could not be written here"),
    (VmrunError, "metrics-missing", "a finished run brought back no metrics.jsonl"),
    (VmrunError, "tensorboard-missing", "tensorboard is not installed here (`--local`)"),
    (VmrunError, "notify-failed", "`notify --test`: a service did not take the test message"),
    (UsageError, "dashboard-extra-missing", "`vmrun dashboard` needs aiohttp (vmrun[dashboard])"),
    (UsageError, "dashboard-port-taken", "`vmrun dashboard --port N`: the port is in use here"),
)
for _owner, _name, _meaning in _SITE_CODES:
    register(_name, _owner, _meaning)
# -- containers (vmrun.containers): the image, its mounts, its runtime, its pull ----------
_CONTAINER_CODES: tuple[tuple[type[VmrunError], str, str], ...] = (
    (UsageError, "bad-image", "an image reference or .sif path is malformed"),
    (UsageError, "bad-mount", "a --mount is not `SRC:DST[:ro|rw]` with absolute paths"),
    (UsageError, "mount-source-missing", "a --mount's source path is not on the host"),
    (UsageError, "bad-ulimit", "a container_ulimits entry is not NAME=SOFT[:HARD]"),
    (UsageError, "bad-pull", "a pull policy that is not newer, missing, always or never"),
    (UsageError, "image-not-here", "pull = never, and the host (or here) has no such image"),
    (
        UsageError,
        "images-differ",
        "the nodes would run different images (their image IDs differ); nothing was started",
    ),
    (UsageError, "container-runtime-missing", "the container runtime asked for is not there"),
    (
        UsageError,
        "container-option-unsupported",
        "the container runtime cannot do what the run asks (.sif, read-only mounts, hosts)",
    ),
    (UsageError, "image-not-found", "the registry has no such image or tag"),
    (RemoteError, "registry-auth-refused", "the registry refused the host's credentials"),
    (RemoteError, "registry-unreachable", "the host could not reach the image's registry"),
    (RemoteError, "no-space-left", "the host's disk is full (an image pull, a write)"),
    (
        RemoteError,
        "container-runtime-unavailable",
        "the container daemon is not running, or the user may not use it",
    ),
    (RemoteError, "pull-failed", "an image pull failed for a reason vmrun does not know"),
    (
        CommandFailed,
        "container-rlimits",
        "the run's container did not start: its runtime may not set a limit it asks for"
        " (container_ulimits; a daemon without CAP_SYS_RESOURCE)",
    ),
)
for _owner, _name, _meaning in _CONTAINER_CODES:
    register(_name, _owner, _meaning)
# -- clouds (vmrun.providers): `vmrun up`, `down`, `cloud` -------------------------------
_CLOUD_CODES: tuple[tuple[type[VmrunError], str, str], ...] = (
    (UsageError, "cloud-extra-missing", "the cloud's Python package is not installed (vmrun[aws])"),
    (UsageError, "cloud-type-not-offered", "no zone of the region offers the instance type"),
    (
        UsageError,
        "cloud-no-private-network",
        "several VMs asked of a UCloud provider that offers no private network to join them",
    ),
    (UsageError, "cloud-image-not-found", "no machine image matches what was asked for"),
    (UsageError, "over-budget", "it costs more than the limit given, or its price is unknown"),
    (UsageError, "launch-spec", "a run's start that cannot go (too large) or be read (version)"),
    (CloudError, "cloud-credentials", "no cloud credentials, or the cloud refused them"),
    (CloudError, "cloud-quota", "the account's quota (vCPUs, instances) is too low for this"),
    (CloudError, "cloud-no-capacity", "no zone had capacity for the type (spot or on-demand)"),
    (CloudError, "cloud-ssh-never-up", "the instances run but SSH never let vmrun log in"),
    (CloudError, "cloud-leftovers", "some resources could not be removed (each is named)"),
)
for _owner, _name, _meaning in _CLOUD_CODES:
    register(_name, _owner, _meaning)
# -- buckets (vmrun.stores): `push s3://...`, the mover on the hosts ------------------------
_STORE_CODES: tuple[tuple[type[VmrunError], str, str], ...] = (
    (UsageError, "bad-store", "a bucket address is not s3://BUCKET/PREFIX, or mixes with paths"),
    (UsageError, "store-empty", "nothing in the bucket under that prefix"),
    (UsageError, "store-tool-missing", "the host has no rclone 1.63 or later (the bucket mover)"),
    (RemoteError, "store-denied", "the bucket refused the credentials, or has no such bucket"),
    (RemoteError, "store-unreachable", "the host could not reach the bucket's endpoint"),
    (RemoteError, "store-copy-failed", "objects did not arrive whole and verified from the bucket"),
)
for _owner, _name, _meaning in _STORE_CODES:
    register(_name, _owner, _meaning)
register(
    "supervisor-failed",
    RemoteError,
    "a run's supervisor (train --recover) could not be put on its host or started",
)
register(
    "stack-tool-missing",
    RemoteError,
    "py-spy could not be found on the host nor sent there (vmrun stacks, hang dumps)",
)
register(
    "gpu-unhealthy",
    UsageError,
    "a GPU of the host is unfit to train on (ECC, a pending retirement or remap, an Xid)",
)
register("not-running", UsageError, "the command needs a live run, and this one has ended")
register("timeout", CommandFailed, "a remote command hit its --timeout and was stopped", 124)
register("stop-unconfirmed", CommandFailed, "the stop of a run was not confirmed in time", 124)
register("run-stopped", CommandFailed, "the run was stopped (`vmrun stop`) while followed", 143)
register(
    "run-over-budget",
    CommandFailed,
    "the run reached its --max-cost and was stopped, its work saved",
    143,
)
register("setup-step-failed", CommandFailed, "a setup step's script failed", 1)
register(
    "node-files-differ",
    ExitCode.FAILED,
    "a run's nodes hold one path with different bytes: the master's fetched, the others' left",
)
register("internal", ExitCode.FAILED, "a bug in vmrun: re-run with --debug for the traceback")


def codes_table() -> str:
    """The Markdown table of every registered code, as docs/errors.md holds it."""
    rows = ["| code | exit | meaning |", "|---|---|---|"]
    for entry in sorted(CODES.values(), key=lambda e: e.name):
        if entry.own_status:
            status = "the command's own (1 if none)"
        elif entry.owner == HostsFailed.__name__:
            status = "the highest of the hosts'"
        else:
            status = str(entry.exit_code)
        rows.append(f"| `{entry.name}` | {status} | {entry.meaning} |")
    return "\n".join(rows) + "\n"


def _host_line(host: str, err: BaseException) -> str:
    text = err.one_line() if isinstance(err, VmrunError) else f"{type(err).__name__}: {err}"
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


def error_object(code: str, message: str, exit_status: int | None = None) -> dict[str, Any]:
    """A failure as every `--json` output carries it, so a reader groups failures by code
    (`exit_status` None: the code's own, as for a failure that is retried and not over)."""
    status = CODES[code].exit_code if exit_status is None else exit_status
    return {"code": code, "message": message, "exit_status": int(status)}


def error_json(err: BaseException) -> dict[str, Any]:
    """Any failure as `error_object`: its code, its one line, the exit status it gives."""
    message = err.one_line() if isinstance(err, VmrunError) else f"{type(err).__name__}: {err}"
    return error_object(code_of(err), message, exit_code_for(err))


def exit_code_for(err: BaseException) -> int:
    """The one mapping from a failure to the process exit code."""
    if isinstance(err, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(err, CommandFailed):
        return err.exit_status if 0 < err.exit_status < 256 else ExitCode.FAILED
    if isinstance(err, VmrunError):
        return int(err.exit_code)
    return ExitCode.FAILED
