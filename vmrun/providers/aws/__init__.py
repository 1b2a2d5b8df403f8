"""AWS EC2 as a provider (boto3, the `vmrun[aws]` extra, imported only when a cloud command
runs). Credentials come from boto3's own chain (AWS_PROFILE / --profile, the environment,
~/.aws); vmrun never reads, prints or records them."""

from typing import Any

from vmrun.providers.api import ProviderCapabilities

# what `vmrun up --cloud aws` can do: the refusals of `up` are derived from it
CAPABILITIES = ProviderCapabilities("AWS", spot=True, store=True, zones=True, power_off=True)


def make(profile: str) -> Any:
    """The AWS provider under `profile` (empty: boto3's default chain)."""
    from vmrun.providers.aws.provider import AwsProvider
    from vmrun.providers.aws.session import Session

    return AwsProvider(Session(profile or None))
