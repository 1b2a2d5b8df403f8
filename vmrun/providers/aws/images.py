"""Which machine image a cluster boots: found by owner and name each time, never a fixed
ID (IDs differ per region and the newest release changes every few weeks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vmrun.errors import UsageError
from vmrun.providers.aws.session import cloud_error

# NVIDIA's driver preinstalled, Ubuntu LTS: AWS's Deep Learning Base AMIs (owner: Amazon).
DLAMI_OWNER = "898082745236"
DLAMI_NAMES = (
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) *",
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
)
# Canonical's Ubuntu LTS: `vmrun setup` installs the driver on it.
UBUNTU_OWNER = "099720109477"
UBUNTU_NAMES = (
    "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-{arch}-server-*",
    "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-{arch}-server-*",
)
ALIASES = ("dlami", "ubuntu")


@dataclass(frozen=True)
class Image:
    id: str
    name: str
    user: str  # the login user cloud-init makes
    root_device: str  # where the disk size applies


def check_image(image: str) -> None:
    """The --image form alone (before any call): an alias or an AMI id."""
    if image not in ALIASES and not image.startswith("ami-"):
        raise UsageError(
            f"--image {image!r} is neither dlami, ubuntu nor an AMI id (ami-...)",
            code="cloud-image-not-found",
        )


def find_image(ec2: Any, image: str, arch: str, user: str = "") -> Image:
    """The newest available image for `image` (dlami, ubuntu, or an ami- id) and `arch`
    (x86_64 or arm64, the instance type's)."""
    check_image(image)
    if image.startswith("ami-"):
        found = _describe(ec2, {"ImageIds": [image]}, image)
    else:
        owner, names = (
            (DLAMI_OWNER, DLAMI_NAMES) if image == "dlami" else (UBUNTU_OWNER, UBUNTU_NAMES)
        )
        ubuntu_arch = "amd64" if arch == "x86_64" else "arm64"
        filters = [
            {"Name": "name", "Values": [n.format(arch=ubuntu_arch) for n in names]},
            {"Name": "state", "Values": ["available"]},
            {"Name": "architecture", "Values": [arch]},
        ]
        found = _describe(ec2, {"Owners": [owner], "Filters": filters}, image)
    if not found:
        where = f"for {arch}" if not image.startswith("ami-") else "in this region"
        raise UsageError(
            f"no {image} image {where} (describe_images found none)",
            hint="pass --os-image ami-... for an image you know, or another --region",
            code="cloud-image-not-found",
        )
    newest = max(found, key=lambda i: i.get("CreationDate", ""))
    return Image(
        id=newest["ImageId"],
        name=newest.get("Name", newest["ImageId"]),
        user=user or "ubuntu",
        root_device=newest.get("RootDeviceName") or "/dev/sda1",
    )


def _describe(ec2: Any, query: dict[str, Any], image: str) -> list[dict[str, Any]]:
    try:
        return list(ec2.describe_images(**query).get("Images", []))
    except Exception as exc:
        from vmrun.providers.aws.session import error_code

        if error_code(exc).startswith("InvalidAMIID"):
            return []
        raise cloud_error(exc, f"finding the image {image}") from None
