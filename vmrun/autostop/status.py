"""What a host's autostop watchdog reports: its state line, read in one round trip
(`vmrun autostop --status`, `vmrun status`) or as the watch script streams it (`vmrun
watch-gpus`), and the words those commands show for it.

The state line is written by vmrun/hostside/autostop_watch.sh when its decision changes:
TAB-separated key=value (pid, period, interval, since and off by the host's clock, awake,
block, note). Times are turned into this machine's clock through the host's clock read in
the same round trip, so a skewed host still shows the right local time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from vmrun.setting_types import format_period

TAG = "vmrun-autostop"  # the watch script's stderr lines: TAG HOST_NOW ALIVE STATE_LINE


def parse_state(line: str) -> dict[str, str]:
    fields = {}
    for part in line.rstrip("\n").split("\t"):
        key, eq, value = part.partition("=")
        if eq:
            fields[key] = value
    return fields


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class AutostopStatus:
    """One host's watchdog. `skew`: this machine's clock minus the host's."""

    host: str
    installed: bool
    alive: bool = False
    period: float | None = None
    since: float | None = None  # the host's clock: idle since (None: awake)
    off: float | None = None  # the host's clock: when it powers off, if it stays idle
    awake: str = ""  # what keeps it up: "run r1, GPU 0 93%, 1 login session"
    block: str = ""  # what forbids powering off: "non-vmrun GPU process pid 4242"
    note: str = ""
    skew: float = 0.0
    boot: str = ""

    @classmethod
    def from_state(
        cls, host: str, line: str, *, alive: bool, host_now: float | None, boot: str = ""
    ) -> AutostopStatus:
        fields = parse_state(line)
        skew = time.time() - host_now if host_now is not None else 0.0
        return cls(
            host,
            installed=True,
            alive=alive,
            period=_number(fields.get("period")),
            since=_number(fields.get("since")),
            off=_number(fields.get("off")),
            awake=fields.get("awake", ""),
            block=fields.get("block", ""),
            note=fields.get("note", ""),
            skew=skew,
            boot=boot,
        )

    @classmethod
    def from_watch_line(cls, host: str, rest: str) -> AutostopStatus:
        """`HOST_NOW ALIVE STATE_LINE` as the watch script sends it (after TAG); an empty
        state: not installed (or removed during the watch)."""
        now, _, rest = rest.rstrip("\n").partition(" ")
        alive, _, line = rest.partition(" ")
        if not line.strip():
            return cls(host, installed=False)
        return cls.from_state(host, line, alive=alive == "1", host_now=_number(now))

    def idle_for(self, now: float | None = None) -> float | None:
        if self.since is None:
            return None
        return max(0.0, (now if now is not None else time.time()) - self.skew - self.since)

    def off_at(self) -> float | None:
        """When it powers off if it stays idle, by this machine's clock."""
        return None if self.off is None else self.off + self.skew

    def period_text(self) -> str:
        if not self.installed:
            return "not installed"
        return format_period(self.period) if self.period else "?"

    def keeping_awake(self) -> str:
        if not self.installed:
            return "-"
        if not self.alive:
            return "the watchdog is not running (see ~/.vmrun/autostop.log)"
        failed = "; its last power-off command failed (see the log)" * self.failed
        if self.block:
            return f"{self.block}: never powers off while it runs{failed}"
        return (self.awake or "-") + failed

    @property
    def failed(self) -> bool:
        """The last power-off command failed (it is tried again after another period)."""
        return self.note.startswith("power-off command failed")

    def to_json(self) -> dict[str, object]:
        """For `watch-gpus --json`: times by this machine's clock (Unix seconds)."""
        since = None if self.since is None else round(self.since + self.skew, 1)
        off = self.off_at()
        return {
            "running": self.alive,
            "period_s": self.period,
            "idle_since": since,
            "off_at": None if off is None else round(off, 1),
            "awake": self.awake or None,
            "block": self.block or None,
            "text": self.short(),
        }

    def short(self, now: float | None = None) -> str:
        """One cell: "idle 12m, off 14:32", "awake: run r1", "blocked: ...", "-"."""
        if not self.installed:
            return "-"
        if not self.alive:
            return "not running"
        if self.block:
            return f"blocked: {self.block}"
        if self.awake:
            return f"awake: {self.awake}"
        idle = self.idle_for(now)
        off = self.off_at()
        if idle is None or off is None:
            return "starting"
        return f"idle {format_period(idle)}, off {clock_text(off, now)}"


def clock_text(when: float, now: float | None = None) -> str:
    """This machine's local time of `when`: HH:MM, with the date when it is not today."""
    now = time.time() if now is None else now
    same_day = time.localtime(when)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M" if same_day else "%m-%d %H:%M", time.localtime(when))


def from_status_output(host: str, text: str) -> AutostopStatus:
    """What vmrun/hostside/autostop_status.sh printed."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value
    if values.get("INSTALLED") != "1":
        return AutostopStatus(host, installed=False, boot=values.get("BOOT", ""))
    return AutostopStatus.from_state(
        host,
        values.get("STATE", ""),
        alive=values.get("ALIVE") == "1",
        host_now=_number(values.get("NOW")),
        boot=values.get("BOOT", ""),
    )
