"""The provider seam: what `vmrun up/down/cloud` ask of a cloud, as values.

One protocol (torchx's scheduler API is the model): `offer` turns a request into what will be
launched (image, zones, login user) without creating anything; `launch` creates; `describe`,
`stop`, `terminate` and `resources` find and remove what a cluster made, by its tags. Every
call is synchronous and returns values; progress goes to the caller's Reporter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from vmrun.reporting import Reporter

# Every resource vmrun creates carries these tags, so it can be found and removed.
TAG_CLUSTER = "vmrun-cluster"
TAG_CREATOR = "vmrun-creator"  # user@machine that ran `vmrun up`
TAG_CREATED = "vmrun-created"  # ISO 8601, UTC
# An instance's states, all of them: `describe` lists the live ones unless asked for more.
EVERY_STATE = ("pending", "running", "stopping", "stopped", "shutting-down", "terminated")


@dataclass(frozen=True)
class Request:
    """What `vmrun up NAME` asks for. `ssh_cidr`: who may reach port 22 (the caller's public
    address as /32, or what the user gave); `user_data`: the cloud-init document (holds the
    user's public key and the host key vmrun made); `power_off`: what a shutdown from inside
    does, "stop" or "terminate"."""

    cluster: str
    instance_type: str
    count: int = 1
    region: str = ""
    zone: str = ""
    image: str = "dlami"
    disk_gb: int = 0  # 0: the image's own size
    spot: bool = False
    spot_fallback: bool = False
    ssh_cidr: str = ""
    user_data: str = ""
    power_off: str = "stop"
    placement: bool = True  # a cluster placement group when count > 1 and the type allows
    creator: str = ""
    user: str = ""  # the image's login user when vmrun cannot know it (a custom AMI)
    store: str = ""  # s3://BUCKET/PREFIX: the VMs get a role that reaches that prefix alone
    public_key: str = ""  # the user's, for a cloud that takes it apart from user data
    boot_timeout: float = 600.0  # how long a VM may take to say where SSH is (UCloud)


@dataclass(frozen=True)
class Offer:
    """What a request resolves to before anything is created."""

    region: str
    image_id: str
    image_name: str
    user: str  # the image's login user
    zones: list[str]  # in the order they will be tried
    placement: bool  # a placement group will be made
    root_device: str = "/dev/sda1"  # the image's, where the disk size applies


@dataclass(frozen=True)
class Instance:
    id: str
    cluster: str
    state: str  # pending, running, stopping, stopped, shutting-down, terminated
    instance_type: str
    zone: str
    region: str
    public_addr: str
    private_addr: str
    launched: datetime | None = None
    spot: bool = False
    index: int = 0  # its place in the cluster (0: the first node)
    image_id: str = ""  # what it booted: a replacement boots the same, not a newer release
    ssh_port: int = 22  # where its sshd answers (UCloud: a port of its gateway)
    login_user: str = ""  # the user its SSH line names, where the cloud says one


@dataclass(frozen=True)
class Resource:
    """One tagged thing vmrun made, for `vmrun cloud`. `price`: USD per hour where the
    price list answered (None: unknown, or free now: a group, a stopped instance)."""

    kind: str  # "instance", "security-group", "placement-group", "volume"
    id: str
    cluster: str
    region: str
    state: str = ""
    instance_type: str = ""  # a volume: its type (gp3)
    created: datetime | None = None
    creator: str = ""
    price: float | None = None
    spot: bool = False
    zone: str = ""  # an instance's or a volume's (a spot price is the zone's)
    size_gb: int = 0  # a volume's


@dataclass(frozen=True)
class Removed:
    """What `terminate` or `stop` did, per kind (ids), and what is left (`left`: ids that are
    still there, with why)."""

    instances: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)  # the VMs' own role (up --store)
    networks: list[str] = field(default_factory=list)  # a UCloud cluster's private network
    keys: list[str] = field(default_factory=list)  # SSH keys vmrun added to the account


class Provider(Protocol):
    """A cloud that makes VMs. Each method names the cluster by its `vmrun-cluster` tag."""

    name: str

    @property
    def default_region(self) -> str:
        """Where a request without a region goes (the profile's, else the provider's)."""
        ...

    def check_credentials(self) -> None:
        """Refuse (`cloud-credentials`) when no credentials are found here: a local look,
        before anything else is asked or dialed."""
        ...

    def offer(self, request: Request) -> Offer: ...

    def launch(self, request: Request, offer: Offer, out: Reporter) -> list[Instance]:
        """Create the cluster's network rules, placement and instances; on any failure, or
        Ctrl-C, remove what this call made before raising."""
        ...

    def add(self, request: Request, offer: Offer, index: int, out: Reporter) -> Instance:
        """One instance more for a cluster that is there (a lost node's replacement, node
        `index`), in its network rules, placement and role; on any failure, or Ctrl-C,
        terminate the instance this call made, and nothing else, before raising."""
        ...

    def describe(self, cluster: str, region: str, states: tuple[str, ...] = ...) -> list[Instance]:
        """The cluster's instances in node order; `states`: which (the live ones unless
        asked, see EVERY_STATE)."""
        ...

    def wait_running(
        self, cluster: str, region: str, ids: list[str], timeout: float
    ) -> list[Instance]: ...

    def stop(self, cluster: str, region: str) -> Removed: ...

    def start(self, cluster: str, region: str, out: Reporter) -> list[Instance]: ...

    def terminate(self, cluster: str, region: str) -> Removed: ...

    def terminate_ids(self, region: str, ids: list[str]) -> list[str]:
        """Terminate these instances alone, not waiting; the ids asked. An id already gone
        is no error."""
        ...

    def resources(self, regions: list[str]) -> list[Resource]: ...

    def hourly_price(self, instance: Instance) -> float | None:
        """What one instance like this costs an hour, in `price_currency` (None: unknown)."""
        ...

    def price_currency(self, instance: Instance) -> str:
        """The currency of `hourly_price` (ISO 4217: USD on AWS, DKK on UCloud)."""
        ...

    def host_key(self, instance: Instance) -> str:
        """The public host key vmrun gave the instance at launch ("" if none)."""
        ...

    def user_data(self, instance: Instance) -> str:
        """The cloud-init document the instance was launched with ("" if none)."""
        ...


@dataclass(frozen=True)
class ProviderCapabilities:
    """What a cloud can do for `vmrun up`, declared by its provider package: the flags a
    cloud lacks are refused by the capability's name (vmrun.operations.cloud), before
    anything is made. `what`: how an error names the cloud; `why_no_power_off`: why its
    VMs cannot power themselves off, where they cannot."""

    what: str
    spot: bool = False  # spot instances (--spot)
    store: bool = False  # a bucket the VMs reach with their own role (--store)
    zones: bool = False  # an availability zone chosen (--zone)
    power_off: bool = False  # a VM that powers itself off stops being charged
    why_no_power_off: str = ""

    def lacks(self, name: str) -> bool:
        return not getattr(self, name)


def capabilities_of(cloud: str) -> ProviderCapabilities:
    """What the provider of `cloud` declares (its package's CAPABILITIES; the provider and
    its client library are not imported)."""
    import importlib

    declared = importlib.import_module(f"vmrun.providers.{cloud}").CAPABILITIES
    assert isinstance(declared, ProviderCapabilities)
    return declared
