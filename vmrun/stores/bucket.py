"""A run's place in its bucket, as this machine reads it with boto3 (the `aws` extra): its
objects, one object's bytes, the newest run under a store (vmrun.runs.store_fetch
brings its files here)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from vmrun.errors import RemoteError, UsageError
from vmrun.store_url import StoreURL
from vmrun.stores.access import Access
from vmrun.stores.sync import RECORD


@dataclass(frozen=True)
class Object:
    key: str  # relative to the run's place
    size: int
    etag: str
    modified: float


def client(access: Access) -> Any:
    """An S3 client of its own session: boto3's shared default session is not safe to use
    from several threads at once (the dashboard's); a client, once made, is."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise UsageError(
            "reading a bucket from here needs boto3",
            hint="pip install 'vmrun[aws]'",
            code="bad-store",
        ) from None
    config = Config(
        retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=10, read_timeout=60
    )
    keys = (
        {}
        if access.from_host
        else {
            "aws_access_key_id": access.key_id,
            "aws_secret_access_key": access.secret,
            "aws_session_token": access.token or None,
        }
    )
    return boto3.session.Session().client(
        "s3", region_name=access.region, endpoint_url=access.endpoint or None, config=config, **keys
    )


def _failure(exc: Exception, where: StoreURL) -> Exception:
    """boto3's error as vmrun's: refused, missing, out of reach."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404", "NoSuchBucket"):
            return UsageError(f"nothing at {where}", code="store-empty")
        return RemoteError(
            f"{where}: the bucket refused: {code or exc}",
            code="store-denied",
            hint="check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID)",
        )
    if isinstance(exc, BotoCoreError):
        return RemoteError(
            f"{where}: {exc}",
            code="store-unreachable",
            hint="check the endpoint (AWS_ENDPOINT_URL)",
        )
    return exc


def calling(where: StoreURL) -> Any:
    from contextlib import contextmanager

    from botocore.exceptions import BotoCoreError, ClientError

    @contextmanager
    def guard() -> Iterator[None]:
        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            raise _failure(exc, where) from None

    return guard()


def objects(s3: Any, place: StoreURL) -> list[Object]:
    """Every object under the place, keys relative to it."""
    prefix = f"{place.prefix}/" if place.prefix else ""
    found: list[Object] = []
    with calling(place):
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=place.bucket, Prefix=prefix
        ):
            for item in page.get("Contents", ()):
                found.append(
                    Object(
                        item["Key"][len(prefix) :],
                        int(item["Size"]),
                        str(item.get("ETag", "")).strip('"'),
                        item["LastModified"].timestamp(),
                    )
                )
    return found


def read(s3: Any, where: StoreURL, tail: int = 0) -> bytes:
    """One object's bytes (`tail`: only its last N, as a log or metrics file is read; an
    empty object has no range to ask for)."""
    from botocore.exceptions import ClientError

    ranged = {"Range": f"bytes=-{tail}"} if tail else {}
    with calling(where):
        try:
            return bytes(
                s3.get_object(Bucket=where.bucket, Key=where.prefix, **ranged)["Body"].read()
            )
        except ClientError as exc:
            if tail and exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""
            raise


def newest_run(s3: Any, store: StoreURL) -> str:
    """The run under `store` that started last (by its record's first object)."""
    runs = [
        (o.modified, o.key.split("/", 1)[0])
        for o in objects(s3, store)
        if o.key.endswith(f"/{RECORD}/started") and o.key.count("/") == 2
    ]
    if not runs:
        raise UsageError(f"no run under {store}", code="run-not-found")
    return max(runs)[1]
