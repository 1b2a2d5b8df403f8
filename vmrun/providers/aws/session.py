"""boto3 clients, and AWS's answers as vmrun's errors.

boto3 is imported here and nowhere else, on the first call: `vmrun --help` and every other
command start as fast as before. `AWS_ENDPOINT_URL` (boto3's own) points every client at
another endpoint, which is how the tests reach their moto server.
"""

from __future__ import annotations

from typing import Any

from vmrun.errors import CloudError, UsageError

# Throttling and the cloud's own hiccups: retried by botocore's standard mode, not by vmrun.
_RETRIES = {"max_attempts": 6, "mode": "standard"}
DEFAULT_REGION = "us-east-1"


class Session:
    """One boto3 session (a profile, or the default chain) and its clients, per region."""

    def __init__(self, profile: str | None = None) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError(
                "the AWS commands need boto3, which is not installed here",
                hint="pip install 'vmrun[aws]'",
                code="cloud-extra-missing",
            ) from None
        try:
            self._session = boto3.Session(
                botocore_session=_botocore_session(), profile_name=profile or None
            )
        except Exception as exc:  # botocore.exceptions.ProfileNotFound
            raise CloudError(
                f"AWS profile {profile!r} is not configured ({exc})",
                hint="list profiles with `aws configure list-profiles`, or drop --profile",
                code="cloud-credentials",
            ) from None
        self._config = Config(retries=_RETRIES, user_agent_extra="vmrun")
        # RunInstances refused for capacity answers HTTP 500, which botocore retries: the
        # next zone, not the same one again, is the answer (SkyPilot's "fail fast" too).
        once = Config(retries={"total_max_attempts": 1}, user_agent_extra="vmrun")
        # answers vmrun can do without (prices): one retry and short timeouts
        quick = self._config.merge(
            Config(
                retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=10
            )
        )
        self._configs = {"": self._config, "once": once, "quick": quick}
        self._clients: dict[tuple[str, str, str], Any] = {}

    @property
    def default_region(self) -> str:
        return self._session.region_name or DEFAULT_REGION

    def check_credentials(self) -> None:
        """The credential chain resolved here (variables, files, a profile's process; IMDS
        only on an instance): none found is `cloud-credentials`, before any call is made."""
        try:
            found = self._session.get_credentials()
        except Exception as exc:  # a profile's broken credential_process, and the like
            raise cloud_error(exc, "looking for AWS credentials") from None
        if found is None:
            raise CloudError(
                "no AWS credentials found",
                hint="set AWS_PROFILE (or pass --profile), or run `aws configure`",
                code="cloud-credentials",
            )

    def frozen_credentials(self) -> tuple[str, str, str]:
        """The resolved credentials as they are now: key id, secret, session token ("")."""
        frozen = self._session.get_credentials().get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token or ""

    def client(self, service: str, region: str, *, once: bool = False, quick: bool = False) -> Any:
        """The service's client for `region`. `once`: one attempt per call, no retries;
        `quick`: for answers vmrun can do without (prices), one retry and short timeouts,
        so a service that does not answer costs seconds, not minutes."""
        mode = "once" if once else "quick" if quick else ""
        key = (service, region, mode)
        if key not in self._clients:
            config = self._configs[mode]
            self._clients[key] = self._session.client(service, region_name=region, config=config)
        return self._clients[key]


_LOADER: list[Any] = []  # botocore's model loader, shared by every Session of this process


def _botocore_session() -> Any:
    """A botocore session reusing the process's model loader: each new loader reads and
    parses the service models again (about 0.3 s for EC2), for a library caller that makes
    several Sessions (a sweep of regions, the tests)."""
    import botocore.session

    session = botocore.session.get_session()
    if _LOADER:
        session.register_component("data_loader", _LOADER[0])
    else:
        _LOADER.append(session.get_component("data_loader"))
    return session


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", "")) or str(exc)
    return str(exc)


_CREDENTIAL_CODES = {
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "RequestExpired",
    "AccessDenied",
    "AccessDeniedException",
}


def cloud_error(exc: BaseException, doing: str) -> BaseException:
    """A botocore failure as vmrun's error (call sites `raise cloud_error(exc, ...) from
    None`); anything not from botocore comes back unchanged."""
    module = type(exc).__module__
    if not module.startswith(("botocore", "boto3")):
        return exc
    name = type(exc).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError"):
        return CloudError(
            f"{doing}: no AWS credentials found",
            hint="set AWS_PROFILE (or pass --profile), or run `aws configure`",
            code="cloud-credentials",
        )
    code = error_code(exc)
    if code in _CREDENTIAL_CODES:
        return CloudError(
            f"{doing}: AWS refused the credentials or the action ({code}: {error_message(exc)})",
            hint="check AWS_PROFILE/--profile and that the user may use EC2",
            code="cloud-credentials",
        )
    if name == "EndpointConnectionError" or name.endswith("ConnectionError"):
        return CloudError(f"{doing}: AWS could not be reached ({exc})")
    return CloudError(f"{doing}: {code or name}: {error_message(exc)}")
