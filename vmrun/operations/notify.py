"""`vmrun notify` as a library: the notification targets configured (or given), and a test
message sent to each.

    from vmrun.operations.notify import targets, test
    sent = test(targets(settings))
"""

from __future__ import annotations

from collections.abc import Sequence

from vmrun.config import Settings
from vmrun.notify.send import Sent, send
from vmrun.notify.targets import Target, parse_all


def targets(settings: Settings, urls: Sequence[str] = ()) -> list[Target]:
    """The URLs given, else the `notify` setting's; each checked (one line for a bad one)."""
    return parse_all(list(urls or settings.notify))


def test(found: Sequence[Target]) -> Sent:
    """A test message to each target, from this machine (Apprise where it is installed)."""
    import socket

    title = "vmrun: test message"
    body = f"vmrun can reach you here (sent from {socket.gethostname()} by `vmrun notify --test`)."
    return send(found, title, body, "test")
