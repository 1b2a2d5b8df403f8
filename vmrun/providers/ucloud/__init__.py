"""UCloud (cloud.sdu.dk, SDU eScience): VMs as UCloud jobs of its VM application, behind the
provider seam `vmrun up` has (vmrun.providers.api). No official client exists; the calls
and shapes are those of UCloud's own source (SDU-eScience/UCloud: shared/pkg/orchestrators,
shared/pkg/accounting, core2/pkg/foundation).

- `session`  the HTTP calls: a token (a refresh token, exchanged for 10-minute access
             tokens, or a personal API token `uc...`), the project header, UCloud's errors.
"""
