"""The autostop settings of one host, and the file that carries them to its watchdog.

Each `autostop*` setting (vmrun.config) may also be given per host in vmrun.toml. A host's
own value is the most specific part of the vmrun.toml layer: it wins over the file's
top-level value and the user config, and loses to `VMRUN_*` and flags, as every setting does.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal, overload

from vmrun.config import FIELDS, FLAGS, Settings
from vmrun.remote_paths import (
    ACTIVE_DIR,
    AUTOSTOP_LOG,
    AUTOSTOP_NOTIFY,
    AUTOSTOP_STATE,
    NVIDIA_PATH,
    RUN_ENV,
    RUNS_DIR,
)
from vmrun.setting_types import OFF, format_period, period_seconds
from vmrun.ssh import quoting
from vmrun.ssh.inventory import HostEntry

KEYS = tuple(name for name in FIELDS if name.startswith("autostop"))
DEFAULT_COMMAND = "sudo -n shutdown -h now"  # as root: `shutdown -h now` (decided on the host)
_OVERRIDDEN = ("environment", FLAGS)  # layers above a host's own value


@dataclass(frozen=True)
class Autostop:
    """What a host's watchdog is told. Seconds for the periods; `command` is shell text, ""
    for the default."""

    period: int
    interval: int
    warn: int
    gpu_threshold: int
    sessions: str  # active | any | ignore
    command: str
    nvidia_smi: str = "nvidia-smi"
    notify: str = ""  # notify.json for the warning's notification ("": none): a secret
    budget: int = 0  # seconds of running time in all, then off (`up --max-cost`); 0: none

    @property
    def command_word(self) -> str:
        """The power-off command's program, which the host must have ("" for the default)."""
        try:
            words = shlex.split(self.command)
        except ValueError:
            words = self.command.split()
        return words[0] if words else ""

    @property
    def shown(self) -> str:
        """The power-off command as vmrun prints it: its program alone, for its arguments
        often carry a cloud API key (the default is shown whole)."""
        if not self.command:
            return DEFAULT_COMMAND
        word = self.command_word
        return word if self.command.strip() == word else f"{word} ..."

    def describe(self) -> str:
        how, every = self.shown, format_period(self.interval)
        budget = f"after {format_period(self.budget)} running in all" if self.budget else ""
        if not self.period:
            return f"powers off {budget}, its runs saved first (checked every {every}; {how})"
        idle = f"after {format_period(self.period)} idle" + (f", or {budget}" if budget else "")
        return f"powers off {idle} (checked every {every}; {how})"

    def conf_text(self) -> str:
        """CONF for vmrun/hostside/autostop_watch.sh: shell assignments, quoted here."""
        values: dict[str, Any] = {
            "period": self.period,
            "interval": self.interval,
            "warn": self.warn,
            "threshold": self.gpu_threshold,
            "sessions": self.sessions,
            "poweroff": self.command,
            "nvsmi": self.nvidia_smi,
            "nvpath": NVIDIA_PATH,
            "run_env": RUN_ENV,
            "runs": RUNS_DIR,
            "active": ACTIVE_DIR,
            "state": AUTOSTOP_STATE,
            "log": AUTOSTOP_LOG,
            "notify": AUTOSTOP_NOTIFY if self.notify else "",
            "budget": self.budget,
        }
        lines = [f"{k}={quoting.quote(str(v)) if v != '' else ''}" for k, v in values.items()]
        head = "# vmrun autostop: written by `vmrun autostop`, read by the watchdog every tick"
        return "\n".join([head, *lines])


@overload
def for_host(settings: Settings, entry: HostEntry) -> Autostop | None: ...
@overload
def for_host(settings: Settings, entry: HostEntry, *, one_off: Literal[True]) -> Autostop: ...


def for_host(settings: Settings, entry: HostEntry, *, one_off: bool = False) -> Autostop | None:
    """The host's settings, or None where autostop is off for it. `one_off`: for powering
    off once (`train --down-after-run`), whatever the period says."""
    values: dict[str, Any] = {}
    for key in KEYS:
        value = getattr(settings, key)
        if key in entry.vars and settings.sources[key] not in _OVERRIDDEN:
            value = FIELDS[key].parse(f"{key} of host {entry.label}", entry.vars[key])
        values[key] = value
    budget = values["autostop_budget"]
    if values["autostop"] == OFF and budget == OFF and not one_off:
        return None
    command = values["autostop_command"]
    nvidia_smi = entry.vars.get("nvidia_smi", "nvidia-smi")
    idle = 0 if budget != OFF else 1  # a budget alone: never off for idleness
    return Autostop(
        period=idle if values["autostop"] == OFF else period_seconds(values["autostop"]),
        budget=0 if budget == OFF else period_seconds(budget),
        interval=period_seconds(values["autostop_interval"]),
        warn=0 if values["autostop_warn"] == OFF else period_seconds(values["autostop_warn"]),
        gpu_threshold=int(values["autostop_gpu_threshold"]),
        sessions=str(values["autostop_sessions"]),
        command=quoting.join(command) if isinstance(command, list) else str(command),
        nvidia_smi=str(nvidia_smi) if isinstance(nvidia_smi, str) and nvidia_smi else "nvidia-smi",
        notify=_warning_notify(settings, entry.label),
    )


def _warning_notify(settings: Settings, host: str) -> str:
    """The watchdog's notify.json: the warning before a power-off, to the `notify` targets
    a host can post to (told whatever `notify_on` says: it is about the machine)."""
    if not settings.notify:
        return ""
    from vmrun.notify.send import Notify

    notify = Notify.from_settings(settings.notify, ["all"])
    notify = Notify(notify.targets, ("autostop",))
    title = "vmrun: {where} powers off at {off}"
    body = (
        "{where} has been idle since {since} and powers off at {off} (vmrun autostop).\n"
        "To keep it up: start a vmrun run, or `vmrun autostop --cancel -H {where}`."
    )
    return notify.host_config({"where": host}, title=title, body=body)
