"""Test bed for vmrun: real OpenSSH servers as test hosts (see README.md).

``NetnsBed`` (root) gives each host its own network namespace, hostname, Unix
user, home and sshd on private bridges; ``LoopbackHost`` is the no-root
fallback: one sshd on 127.0.0.1 for the current user.  ``SlurmCluster`` puts a real
Slurm (munged, slurmctld, slurmd) on hosts of a ``NetnsBed``; ``DockerBed`` a real Docker
Engine per host and a registry serving the test image; ``CloudBed`` a fake EC2 (moto)
whose instances boot as hosts of a bed.
"""

from .cloud import CloudBed
from .docker import DockerBed, DockerDaemon, ImageRegistry, skip_reason_no_docker
from .errors import TestbedError
from .keys import ClientKeys
from .loopback import LoopbackHost
from .netns import NetnsBed, have_root_netns, skip_reason_no_netns
from .offline import offline_argv, skip_reason_no_offline
from .procs import wait_until
from .registry import cleanup_on_sigterm, cleanup_stale
from .slurm import SlurmCluster
from .slurmconf import skip_reason_no_slurm
from .sockets import can_connect
from .sshd import guard as testbed_guard
from .testhost import TestHost

__all__ = [
    "ClientKeys",
    "CloudBed",
    "DockerBed",
    "DockerDaemon",
    "ImageRegistry",
    "LoopbackHost",
    "NetnsBed",
    "SlurmCluster",
    "TestHost",
    "TestbedError",
    "can_connect",
    "cleanup_on_sigterm",
    "cleanup_stale",
    "have_root_netns",
    "offline_argv",
    "skip_reason_no_docker",
    "skip_reason_no_netns",
    "skip_reason_no_offline",
    "skip_reason_no_slurm",
    "testbed_guard",
    "wait_until",
]
