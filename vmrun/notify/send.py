"""What a run's notifications say and how this machine sends them.

A run's `Notify` is its targets and the events wanted. The host's sender gets the webhooks,
the message's templates and the facts known at the start (`host_config`, in notify.json);
the words are written here once and filled in where the event happens (on the host, from
its record; here, by asking the host to render it, which also claims the event: one
message per event, whoever sees it first). This machine sends through Apprise (the
`notify` extra, imported only to send); without it, the webhooks go through the host
sender's own code run here, and the other services are named as not sent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmrun.notify.targets import Target, parse_all
from vmrun.reporting import Reporter

TITLE = "vmrun: run {run} {state}"
BODY = (
    "run {run} {state} (exit {exit}) on {where}\n"
    "duration {duration}{cost}, epochs {epochs}, last loss {loss}\n"
    "results: {fetch}"
)
ALL = ("end", "fail", "stopped", "requeue", "autostop")


STATES = {"end": "done", "fail": "failed", "requeue": "requeued"}


def message(event: str, **facts: Any) -> tuple[str, str]:
    """The title and body for a message this machine composes itself (the host's sender
    fills the same templates from its record): unknown facts read `?` (a cost: nothing)."""
    known = {k: v for k, v in facts.items() if v is not None}
    filled = {
        "state": STATES.get(event, event),
        "exit": "?",
        "duration": "?",
        "epochs": "?",
        "loss": "?",
        "cost": "",
        **known,
    }
    return TITLE.format_map(filled), BODY.format_map(filled)


def events(on: Sequence[str]) -> list[str]:
    """`notify_on`'s words as the events told (`all`: every one)."""
    return list(ALL) if "all" in on else [e for e in ALL if e in on]


@dataclass(frozen=True)
class Charge:
    """What the host's sender says of the run beyond the templates' facts: its time's cost
    at `per_hour` (None: unknown, no figure) in `currency`, counting `ran_before_s` (a
    resumed run's earlier attempts), and its outputs' folder (`out_dir`: the last metrics),
    where the record folder has no out_dir file of its own."""

    per_hour: float | None = None
    currency: str = "USD"
    ran_before_s: float = 0.0
    out_dir: str = ""

    def as_dict(self) -> dict[str, Any]:
        told: dict[str, Any] = {"currency": self.currency, "ran_before_s": self.ran_before_s}
        if self.per_hour is not None:
            told["price_per_hour"] = self.per_hour
        if self.out_dir:
            told["out_dir"] = self.out_dir
        return told


@dataclass(frozen=True)
class Notify:
    """Where a run's events are told, and which."""

    targets: tuple[Target, ...] = ()
    on: tuple[str, ...] = ("end", "fail")

    def __bool__(self) -> bool:
        return bool(self.targets)

    @classmethod
    def from_settings(cls, urls: Sequence[str], on: Sequence[str]) -> Notify:
        return cls(tuple(parse_all(list(urls))), tuple(events(on)))

    @property
    def local_only(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.webhook is None)

    def host_config(
        self,
        facts: Mapping[str, Any],
        *,
        title: str = TITLE,
        body: str = BODY,
        charge: Charge | None = None,
    ) -> str:
        """notify.json for the host: its webhooks (the URLs: a secret, sent over stdin into
        a 0600 file), the templates, the events, the facts known now, and what the sender
        needs of the run (`charge`): it reads this file, never the run's record."""
        hooks = [{**t.webhook.as_dict(), "shown": t.shown} for t in self.targets if t.webhook]
        told: dict[str, Any] = {
            "webhooks": hooks,
            "title": title,
            "body": body,
            "on": list(self.on),
            "facts": dict(facts),
        }
        if charge is not None:
            told.update(charge.as_dict())
        return json.dumps(told)


@dataclass
class Sent:
    """What a send did: the targets that took the message, and why the others did not."""

    ok: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def send(targets: Sequence[Target], title: str, body: str, event: str = "end") -> Sent:
    """Every target, through Apprise where it is installed; bounded, never raising."""
    sent = Sent()
    if not targets:
        return sent
    try:
        import apprise  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _without_apprise(targets, title, body, event)
    kind = {"end": "success", "fail": "failure", "stopped": "warning", "autostop": "warning"}
    for target in targets:
        app = apprise.Apprise()
        if not app.add(target.url):
            sent.failed.append((target.shown, "Apprise does not take this URL"))
        elif app.notify(title=title, body=body, notify_type=kind.get(event, "info")):
            sent.ok.append(target.shown)
        else:
            sent.failed.append((target.shown, "the service did not take it"))
    return sent


def _without_apprise(targets: Sequence[Target], title: str, body: str, event: str) -> Sent:
    """The webhooks through the host sender's code, run here; the rest named."""
    from vmrun import hostside

    sent = Sent()
    hooks = [t for t in targets if t.webhook]
    for target in targets:
        if target.webhook is None:
            sent.failed.append((target.shown, "needs Apprise here: pip install 'vmrun[notify]'"))
    if hooks:
        payload = json.dumps(
            {
                "hooks": [
                    {**t.webhook.as_dict(), "shown": t.shown}  # type: ignore[union-attr]
                    for t in hooks
                ],
                "title": title,
                "body": body,
                "event": event,
            }
        )
        sender = str(hostside.HERE / "notify_send.py")
        done = subprocess.run(
            [sys.executable, sender, "-", "post"],
            input=payload,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for line in done.stdout.splitlines():
            shown, why = json.loads(line)
            if why is None:
                sent.ok.append(shown)
            else:
                sent.failed.append((shown, why))
    return sent


def report(sent: Sent, out: Reporter, what: str) -> None:
    """One line per target that did not take it; never a failure of the command."""
    for shown, why in sent.failed:
        out.warn(f"the {what} notification to {shown} was not sent: {why}")
