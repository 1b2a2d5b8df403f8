"""Who may read a bucket, and how the hosts are told: the user's credentials found here as
boto3 finds them (AWS_* variables, AWS_PROFILE and ~/.aws files), the endpoint by boto3's
convention (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, a profile's endpoint_url: MinIO, R2),
or, with none here or `store_credentials = "host"`, the host's own (an instance profile,
its environment; under "auto" also a host that `vmrun up --store` gave a role). They reach
a host only as the mover's config on stdin (store_copy.sh writes it to a 0600 file and
removes it in every ending): never on a command line, in a log or in a run's record."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vmrun.errors import UsageError

DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class Access:
    key_id: str = ""
    secret: str = ""
    token: str = ""
    region: str = DEFAULT_REGION
    endpoint: str = ""
    from_host: bool = False  # the host's own credentials (rclone's env_auth)
    auto: bool = False  # store_credentials = "auto": a host with a role of its own uses it

    def on(self, host_vars: Mapping[str, object]) -> Access:
        """What one host gets: under "auto", a host `vmrun up --store` gave a role that
        reaches the bucket (`store_role` in its [[hosts]] entry) uses its own."""
        if self.auto and not self.from_host and host_vars.get("store_role"):
            return Access(region=self.region, endpoint=self.endpoint, from_host=True, auto=True)
        return self

    def __repr__(self) -> str:  # never the secret, in a traceback or a log
        who = "the host's" if self.from_host else f"key {self.key_id[:4]}..."
        return f"Access({who}, region={self.region!r}, endpoint={self.endpoint!r})"

    def mover_config(self) -> str:
        """rclone's config: one remote, `store`, with these credentials (its `env_auth`:
        the host's own)."""
        values = {
            "type": "s3",
            "provider": "Other" if self.endpoint else "AWS",
            "env_auth": "true" if self.from_host else "false",
            "access_key_id": "" if self.from_host else self.key_id,
            "secret_access_key": "" if self.from_host else self.secret,
            "session_token": "" if self.from_host else self.token,
            "region": self.region,
            "endpoint": self.endpoint,
            "no_check_bucket": "true",  # never create a bucket; a missing one is an error
        }
        for key, value in values.items():
            if any(c in value for c in "\r\n\0"):
                raise UsageError(f"the bucket's {key} holds a line break", code="bad-store")
        return "[store]\n" + "".join(f"{k} = {v}\n" for k, v in values.items() if v)


def resolve(mode: str = "auto") -> Access:
    """The access the hosts get, from this process's environment. `mode`: "auto" (the
    user's credentials where found here, else the host's), "host" (always the host's),
    "mine" (the user's, or refuse)."""
    env = os.environ
    if mode not in ("auto", "host", "mine"):
        raise UsageError(f"store_credentials {mode!r}: use auto, host or mine", code="bad-store")
    region, endpoint, found = _from_boto3(env)
    if found is None:
        found = _from_variables(env)
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or endpoint
    region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    if mode == "host" or (found is None and mode == "auto"):
        return Access(region=region, endpoint=endpoint, from_host=True, auto=mode == "auto")
    if found is None:
        raise UsageError(
            "no AWS credentials here for the bucket",
            hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or let the hosts"
            ' use their own: store_credentials = "host" in vmrun.toml',
            code="bad-store",
        )
    key_id, secret, token = found
    return Access(key_id, secret, token, region, endpoint, auto=mode == "auto")


def _from_variables(env: Mapping[str, str]) -> tuple[str, str, str] | None:
    key_id, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if not key_id or not secret:
        return None
    return key_id, secret, env.get("AWS_SESSION_TOKEN", "")


def _from_boto3(env: Mapping[str, str]) -> tuple[str, str, tuple[str, str, str] | None]:
    """(region, endpoint, credentials) as botocore here sees them (variables, profile, ~/.aws
    files, SSO and process credentials), never asking an instance or container metadata
    service: those are a machine's own, which the hosts have their own of. Empty without
    botocore (the `aws` extra), and then the variables alone count."""
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        return "", "", None
    try:
        session = botocore.session.Session(profile=env.get("AWS_PROFILE") or None)
        resolver = session.get_component("credential_provider")
        for name in ("container-role", "iam-role"):
            resolver.remove(name)
        frozen = session.get_credentials()
        creds = frozen.get_frozen_credentials() if frozen is not None else None
        scoped = session.get_scoped_config()  # the profile's own settings
        region = str(session.get_config_variable("region") or "")
    except botocore.exceptions.BotoCoreError as exc:
        raise UsageError(f"AWS settings here: {exc}", code="bad-store") from None
    endpoint = str(scoped.get("endpoint_url") or "")
    if creds is None or not creds.access_key:
        return region, endpoint, None
    return region, endpoint, (creds.access_key, creds.secret_key, creds.token or "")
