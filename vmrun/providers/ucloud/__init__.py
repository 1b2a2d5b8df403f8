"""UCloud (cloud.sdu.dk, SDU eScience): VMs as UCloud jobs of its VM application, behind the
provider seam `vmrun up` has (vmrun.providers.api). No official client exists; the calls
and shapes are those of UCloud's own source (SDU-eScience/UCloud: shared/pkg/orchestrators,
shared/pkg/accounting, core2/pkg/foundation).

- `session`  the HTTP calls: a token (a refresh token, exchanged for 10-minute access
             tokens, or a personal API token `uc...`), the project header, UCloud's errors.
"""

from typing import Any

from vmrun.providers.api import ProviderCapabilities

# what `vmrun up --cloud ucloud` can do: the refusals of `up` are derived from it. UCloud
# runs a VM job with KubeVirt's RunStrategy Always: a guest that powers itself off is booted
# again, and its job stays RUNNING and charged.
CAPABILITIES = ProviderCapabilities(
    "UCloud",
    why_no_power_off="a VM there cannot power itself off (UCloud boots a guest that shuts"
    " down again, and keeps charging its job)",
)


def make(profile: str) -> Any:
    """The UCloud provider (its own Session, from the environment; no profiles)."""
    from vmrun.providers.ucloud.provider import UCloudProvider

    return UCloudProvider()
