"""Test bed for vmrun: real OpenSSH servers as test hosts (see README.md).

``NetnsBed`` (root) gives each host its own network namespace, hostname, Unix
user, home and sshd on private bridges; ``LoopbackHost`` is the no-root
fallback: one sshd on 127.0.0.1 for the current user.
"""

from .loopback import LoopbackHost
from .netns import (
    ClientKeys,
    NetnsBed,
    TestbedError,
    TestHost,
    can_connect,
    cleanup_on_sigterm,
    cleanup_stale,
    have_root_netns,
    skip_reason_no_netns,
    wait_until,
)

__all__ = [
    "ClientKeys",
    "LoopbackHost",
    "NetnsBed",
    "TestHost",
    "TestbedError",
    "can_connect",
    "cleanup_on_sigterm",
    "cleanup_stale",
    "have_root_netns",
    "skip_reason_no_netns",
    "wait_until",
]
