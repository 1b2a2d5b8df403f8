"""What one node of a run is started with: the launch spec, a typed and versioned value that
travels to the host as one JSON document and nothing else.

The document goes over the command's stdin (vmrun.ssh.quoting's environment header, the one
input a remote command has: one variable, LAUNCH_VAR), never on a command line. On the host
run_start.sh takes the start lock and prepares the record, and one agent
(vmrun/hostside/run_agent.py) reads the rest: it writes the secrets (the bucket's config, the
webhooks) into files only the user reads and runs the command and every watcher. Nothing of
the document reaches the run's environment except `env`, the variables the command itself is
given. A new watcher is a settings class here (a field of Watchers) and a part in the agent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vmrun.errors import UsageError
from vmrun.hostside import HostPath

VERSION = 1
LAUNCH_VAR = "VMRUN_LAUNCH"  # the stdin header's one variable: the document's text
MODES = ("new", "resume")
HANG_ACTIONS = ("stop", "wait")
SPEC_LIMIT = (128 << 10) - len(LAUNCH_VAR) - 2  # MAX_ARG_STRLEN holds `NAME=VALUE` and a NUL
# what the host's sh reads back from the document (`set -- $fields`: no space, no glob); a
# Slurm job's record is under the cluster's workdir, a path of the user's
_WORD = re.compile(r"[A-Za-z0-9._/@+~:,%=-]+")


@dataclass(frozen=True)
class Hang:
    """`train --hang-timeout`: no progress for `seconds` is a hang; `action` stop or wait;
    `ranked`: only a rank's lines are progress (torchrun prefixes them); `python`: the run's
    interpreter, which takes the ranks' stacks."""

    seconds: float
    action: str = "stop"
    ranked: bool = True
    python: str = ""


@dataclass(frozen=True)
class Budget:
    """`train --max-cost`: the run may go `seconds` more on this node; `cap` as the user wrote
    it, for what the log says."""

    seconds: float
    cap: str


@dataclass(frozen=True)
class Spot:
    """`train --recover`: the cloud's interruption notices are watched on this node."""


@dataclass(frozen=True)
class Store:
    """`train --store`: this node's outputs go to the bucket (`to`: bucket/prefix/RUN_ID as
    the mover names it, `url` as shown). `since`: only what changed since the run first
    started is the run's (its outputs are the work directory). `config`: the mover's config,
    credentials maybe: a secret. `records`: this node (the master) copies the run's record
    too and claims the attempt in the bucket; every other node copies its outputs only and
    follows the claim by `attempt`, the attempt's id, the same on every node."""

    to: str
    url: str
    python: str = ""
    since: bool = False
    config: str = field(default="", repr=False)
    records: bool = True
    attempt: str = ""


@dataclass(frozen=True)
class Notify:
    """The run's end told by the host itself: notify.json's text (its webhooks: a secret);
    "" where the record has its notify.json already (a Slurm job's, written as it was
    submitted: its batch script, which holds the spec, never holds a secret)."""

    config: str = field(default="", repr=False)


@dataclass(frozen=True)
class Provenance:
    """Who describes the run's environment (`interpreter`, "" for nobody here) and the
    uncommitted diff (base64 of gzip, "" when clean)."""

    interpreter: str = ""
    code_patch: str = field(default="", repr=False)


@dataclass(frozen=True)
class Watchers:
    """What runs beside the command on this node, each part off when None."""

    hang: Hang | None = None
    budget: Budget | None = None
    spot: Spot | None = None
    store: Store | None = None
    notify: Notify | None = None
    provenance: Provenance | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: asdict(v) for name, v in vars(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> Watchers:
        if not isinstance(data, dict):
            raise TypeError("watchers is not an object")
        unknown = set(data) - set(_PARTS)
        if unknown:
            raise TypeError(f"unknown watcher(s) {', '.join(sorted(unknown))}")
        return cls(**{name: _part(_PARTS[name], value) for name, value in data.items()})


@dataclass(frozen=True)
class LaunchSpec:
    """One node's start. `rec`: the record folder (relative to the home, or absolute);
    `meta`: run.json's text; `argv`: its host-side files (vmrun.hostside.HostPath) are the
    home's, whatever the work directory; `mode` new, or resume (another attempt, its log
    going on after `banner`); `out`: the run's output folder; `alone`: refuse while another
    run is alive beside the record. `env`: the command's own variables (vmrun adds
    VMRUN_RUN_ID and the few others a run reads on the host)."""

    rec: str
    workdir: str
    run_id: str
    argv: tuple[str, ...]
    meta: str = "{}"
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    mode: str = "new"
    banner: str = ""
    out: str = ""
    alone: bool = False
    watchers: Watchers = field(default_factory=Watchers)
    version: int = VERSION

    def __post_init__(self) -> None:
        if not self.argv:
            raise UsageError("a launch needs a command")
        for name in ("rec", "run_id"):
            if not _WORD.fullmatch(getattr(self, name)):
                raise UsageError(f"launch spec: {name} {getattr(self, name)!r} is not one word")
        if self.mode not in MODES:
            raise UsageError(f"launch spec: mode {self.mode!r} is not one of {', '.join(MODES)}")
        hang = self.watchers.hang
        if hang is not None and hang.action not in HANG_ACTIONS:
            raise UsageError(f"launch spec: hang action {hang.action!r}")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", dict(self.env))

    def to_json(self) -> str:
        """The document: every field, the watchers absent when off."""
        data = asdict(self)
        # a host-side file's path (vmrun.hostside.HostPath) is the home's: {"home": PATH}
        data["argv"] = [{"home": str(w)} if isinstance(w, HostPath) else w for w in self.argv]
        data["watchers"] = self.watchers.as_dict()
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"launch spec: not JSON ({exc})", code="launch-spec") from None
        if not isinstance(data, dict):
            raise UsageError("launch spec: not a JSON object", code="launch-spec")
        version = data.get("version")
        if version != VERSION:
            raise UsageError(
                f"launch spec version {version!r}: this vmrun reads version {VERSION}",
                code="launch-spec",
            )
        try:
            watchers = Watchers.from_dict(data.pop("watchers", {}))
            argv = tuple(_word(w) for w in data.pop("argv", None) or ())
            return cls(**{**data, "watchers": watchers, "argv": argv})
        except TypeError as exc:
            raise UsageError(f"launch spec: {exc}", code="launch-spec") from None

    def header(self) -> dict[str, str]:
        """The stdin header that carries the document (vmrun.ssh.quoting.env_header). The
        host's shell holds it as one environment string, which an exec refuses past
        MAX_ARG_STRLEN: a document that would not fit goes without the diff (code.patch),
        the one part that can be large, rather than not at all."""
        text = self.to_json()
        told = self.watchers.provenance
        if len(text.encode()) > SPEC_LIMIT and told is not None and told.code_patch:
            less = Provenance(told.interpreter)
            text = replace(self, watchers=replace(self.watchers, provenance=less)).to_json()
        if len(text.encode()) > SPEC_LIMIT:
            raise UsageError(
                f"the start of run {self.run_id} is {len(text.encode())} bytes, over the"
                f" {SPEC_LIMIT} one start may carry",
                hint="fewer or shorter --env values and script arguments",
                code="launch-spec",
            )
        return {LAUNCH_VAR: text}


_PARTS: dict[str, type] = {
    "hang": Hang,
    "budget": Budget,
    "spot": Spot,
    "store": Store,
    "notify": Notify,
    "provenance": Provenance,
}


def _word(word: Any) -> str:
    if isinstance(word, dict) and set(word) == {"home"}:
        return HostPath(word["home"])
    if not isinstance(word, str):
        raise TypeError(f"argv word {word!r} is not a string")
    return word


def _part(kind: type, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{kind.__name__.lower()} is not an object")
    return kind(**value)
