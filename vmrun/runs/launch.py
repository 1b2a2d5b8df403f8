"""How a training script is started on one node: launcher argv, env wiring, script args.

Pure: no I/O and no torch import, so the CLI can build (and tests can check) every launch
command on a machine without torch. Three launch modes:

- `torchrun` (default): `python -m torch.distributed.run ... SCRIPT ARGS`; torchrun starts the
  workers and sets RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* itself (field notes, section 2).
- `python`: `python SCRIPT ARGS`, for scripts that spawn their own workers (mp.spawn).
- `env`: `python SCRIPT ARGS` with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set by
  vmrun, one process per node, for scripts that read those variables themselves (on several
  hosts: RANK is the node's place in the node order, the master first).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from vmrun.errors import UsageError

LAUNCHERS = ("torchrun", "python", "env")
NPROC_WORDS = ("gpu", "cpu", "auto")
DEFAULT_MASTER_PORT = 29500
_NNODES = re.compile(r"[1-9][0-9]*(:[1-9][0-9]*)?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_nproc_per_node(value: str | int) -> str:
    """torchrun's `--nproc-per-node`: gpu|cpu|auto or a whole number >= 1."""
    text = str(value).strip().lower()
    if text in NPROC_WORDS:
        return text
    if text.isdigit() and int(text) >= 1:
        return str(int(text))
    raise UsageError(f"--nproc-per-node {value!r}: use gpu, cpu, auto or a whole number >= 1")


def check_launcher(value: str) -> str:
    if value not in LAUNCHERS:
        raise UsageError(f"--launcher {value!r}: use one of {', '.join(LAUNCHERS)}")
    return value


def _check_nnodes(value: str) -> str:
    text = str(value).strip()
    match = _NNODES.fullmatch(text)
    if not match:
        raise UsageError(f"nnodes {value!r}: use N or MIN:MAX with whole numbers >= 1")
    if match.group(1):
        low, high = (int(x) for x in text.split(":"))
        if low > high:
            raise UsageError(f"nnodes {value!r}: MIN must not exceed MAX")
    return text


def _check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise UsageError(f"port {port}: ports are 1-65535")
    return port


def script_args(
    epochs: int | None, save_every: int | None, user_args: Sequence[str] | None
) -> list[str]:
    """Args after `--` are used as-is; else the seed's positional `EPOCHS SAVE_EVERY`."""
    if user_args:
        return list(user_args)
    if epochs is None or epochs < 1:
        raise UsageError(f"--epochs must be >= 1, got {epochs}")
    if save_every is None or save_every < 1:
        raise UsageError(f"--save-every must be >= 1, got {save_every}")
    return [str(epochs), str(save_every)]


def torchrun_argv(
    python: str,
    script: str,
    script_args: Sequence[str],
    *,
    nproc_per_node: str | int,
    max_restarts: int,
    nnodes: str = "1",
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    standalone: bool = False,
    local_addr: str | None = None,
    rdzv_conf: Mapping[str, str] | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """`python -m torch.distributed.run` (not the `torchrun` shim: that may belong to another
    environment) with one of three rendezvous styles:

    - `standalone`: `--standalone --nnodes=1`; torchrun picks a free port and a random id.
    - `rdzv_endpoint`: c10d rendezvous; `localhost:0` with nnodes 1 is the single-node form
      that lets several jobs share a host *and* keeps our run id as TORCHELASTIC_RUN_ID;
      multi-node needs the same `rdzv_id` on every node. Required for elastic MIN:MAX.
      `local_addr` is this node's address for the others (rank 0's becomes MASTER_ADDR),
      `rdzv_conf` torchrun's `--rdzv-conf` (e.g. is_host=true on the endpoint's host).
    - neither: static rendezvous; multi-node needs `node_rank` and `master_addr`.

    `log_dir`: every worker's output also goes to files there, and torchrun copies it to its
    own output as it comes, each piece prefixed as RANK_PREFIX_TEMPLATE says (`--tee 3`).
    """
    nproc = check_nproc_per_node(nproc_per_node)
    if max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {max_restarts}")
    nodes = _check_nnodes(nnodes)
    static = _Static(node_rank, master_addr, master_port)
    if standalone:
        rendezvous = _standalone_flags(nodes, rdzv_endpoint or rdzv_id, static)
    elif rdzv_endpoint:
        rendezvous = _c10d_flags(nodes, rdzv_endpoint, rdzv_id, rdzv_conf, local_addr, static)
    else:
        rendezvous = _static_flags(nodes, static)
    argv = [python, "-m", "torch.distributed.run", *rendezvous]
    argv += [f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}"]
    if log_dir:
        argv += [f"--log-dir={log_dir}", "--tee=3"]
    return [*argv, script, *script_args]


@dataclass(frozen=True)
class _Static:
    """A static rendezvous's flags (node rank, master address and port), as given."""

    node_rank: int | None
    master_addr: str | None
    master_port: int | None

    def given(self) -> bool:
        return any(x is not None for x in (self.node_rank, self.master_addr, self.master_port))


def _standalone_flags(nodes: str, rdzv: str | None, static: _Static) -> list[str]:
    if nodes != "1":
        raise UsageError("--standalone runs one node only (nnodes 1)")
    if rdzv or static.given():
        raise UsageError("--standalone picks its own rendezvous; drop the rdzv/master flags")
    return ["--standalone", "--nnodes=1"]


def _c10d_flags(
    nodes: str,
    endpoint: str,
    rdzv_id: str | None,
    conf: Mapping[str, str] | None,
    local_addr: str | None,
    static: _Static,
) -> list[str]:
    if static.given():
        raise UsageError("node rank and master address are for static rendezvous, not c10d")
    if re.search(r"\s", endpoint) or endpoint.startswith(":"):
        raise UsageError(f"rendezvous endpoint {endpoint!r}: use HOST[:PORT]")
    if nodes != "1" and not rdzv_id:
        raise UsageError("a multi-node c10d rendezvous needs an rdzv id shared by every node")
    flags = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
    if rdzv_id:
        flags.append(f"--rdzv-id={rdzv_id}")
    if conf:
        flags.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items()))
    if local_addr:
        flags.append(f"--local-addr={local_addr}")
    return [*flags, f"--nnodes={nodes}"]


def _static_flags(nodes: str, static: _Static) -> list[str]:
    if ":" in nodes:
        raise UsageError(f"elastic nnodes {nodes} needs a c10d rendezvous endpoint")
    rank, addr, port = static.node_rank, static.master_addr, static.master_port
    if nodes != "1":
        if rank is None or not addr:
            raise UsageError("a static multi-node launch needs a node rank and master address")
        if not 0 <= rank < int(nodes):
            raise UsageError(f"node rank {rank} is outside 0..{int(nodes) - 1}")
    flags = [f"--nnodes={nodes}"]
    if rank is not None:
        flags.append(f"--node-rank={rank}")
    if addr:
        flags.append(f"--master-addr={addr}")
    if port is not None:
        flags.append(f"--master-port={_check_port(port)}")
    return flags


# torchrun puts this before each piece of a worker's output it copies (with `log_dir`); the
# record separator (\x1e) says where a piece starts, so vmrun.runs.lines can put lines that
# came in pieces back together and show `[rank3]:text` as `[rank3] text` (`[h rank3] text`
# from host h of several). RANK_PREFIX: the same without \x1e, in logs of older runs.
RANK_PREFIX_TEMPLATE = "\x1e[rank${rank}]:"
RANK_PREFIX = re.compile(rb"^\[rank(\d+)\]:")


def torchrun_env(max_restarts: int) -> dict[str, str]:
    """Environment torchrun itself needs: with restarts, a fresh rendezvous store per attempt.

    torchrun >= 2.4 shares its rendezvous TCPStore with the workers and keeps it across
    restarts, so restarted workers can read the previous attempt's keys (a dead peer's
    gloo/NCCL address) and fail to connect (pytorch/pytorch#135712; seen here with torch
    2.13 and gloo: one restart in four failed). Opting out makes rank 0 host a new store on
    every attempt, as before 2.4.
    """
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if max_restarts > 0 else {}


# torch's flight recorder: each rank's last collectives, dumped when one times out. torch 2.8
# named its settings TORCH_FR_* (c10d reads them first) and keeps the TORCH_NCCL_* names as
# aliases that print a deprecation warning on every rank when set; torch 2.7 and older read
# only the TORCH_NCCL_* names. NEW: OLD.
FR_RENAMED_IN = (2, 8)
FR_NAMES = {
    "TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
}
FR_BUFFER = "2000"  # collectives kept per rank (torch's own suggestion)


def flight_recorder_env(
    dump_prefix: str, torch_version: str | None, given: Sequence[str] = ()
) -> dict[str, str]:
    """The flight recorder on, each rank dumping to `dump_prefix`RANK when a collective times
    out: torch 2.8's names, and the old ones as well only where the node's torch is known to
    be older (where it is unknown, torch as vmrun sets it up: the new names alone). A setting
    the run gives itself (`given`: its variables' names), under either name, is left to it."""
    env = {"TORCH_FR_BUFFER_SIZE": FR_BUFFER, "TORCH_FR_DUMP_TEMP_FILE": dump_prefix}
    release = _release(torch_version or "")
    if release is not None and release < FR_RENAMED_IN:
        env.update({old: env[new] for new, old in FR_NAMES.items()})
    env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"  # torch 2.13 has no other name for it
    for new, old in FR_NAMES.items():
        if new in given or old in given:
            env.pop(new)
            env.pop(old, None)
    return {name: value for name, value in env.items() if name not in given}


def _release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as `2.7.1+cu126`; None when it is not one."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def python_argv(python: str, script: str, script_args: Sequence[str]) -> list[str]:
    """Launch modes `python` and `env`: the script itself is the only process vmrun starts."""
    return [python, script, *script_args]


def env_wiring(
    *, node_rank: int, nnodes: int, master_addr: str, master_port: int = DEFAULT_MASTER_PORT
) -> dict[str, str]:
    """Launch mode `env`: the variables torchrun would set, for one process per node."""
    if nnodes < 1:
        raise UsageError(f"nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise UsageError(f"node rank {node_rank} is outside 0..{nnodes - 1}")
    if not master_addr or re.search(r"\s", master_addr):
        raise UsageError(f"master address {master_addr!r} is not a host name or address")
    return {
        "RANK": str(node_rank),
        "WORLD_SIZE": str(nnodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(_check_port(master_port)),
    }


def node_env_wiring(
    nodes: Sequence[str], node: str, *, master_addr: str, master_port: int
) -> dict[str, str]:
    """Launch mode `env` on several hosts: one process per host, so the node's place in
    `nodes` (the master first: MASTER_ADDR is its address) is its global rank, and the
    number of hosts is the world size."""
    if node not in nodes:
        raise UsageError(f"node {node!r} is not one of the run's nodes ({', '.join(nodes)})")
    if len(set(nodes)) != len(nodes):
        raise UsageError(f"the run's nodes must be distinct, got {', '.join(nodes)}")
    return env_wiring(
        node_rank=list(nodes).index(node),
        nnodes=len(nodes),
        master_addr=master_addr,
        master_port=master_port,
    )


def check_run_name(name: str) -> str:
    if not _NAME.fullmatch(name) or len(name) > 64:
        raise UsageError(
            f"--name {name!r}: use up to 64 letters, digits, '.', '_' or '-' (not first)"
        )
    return name


def name_from_script(stem: str) -> str:
    """A run name from a script's file stem: unsafe characters become '-'."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:64]
    return name or "run"


def run_id(name: str, *, now: datetime | None = None, token: str | None = None) -> str:
    """`<name>-<YYYYmmdd-HHMMSS>-<4 hex>`: sorts by time, unique enough for one project."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{token or secrets.token_hex(2)}"
