"""`s3://BUCKET/PREFIX`: a place in a bucket, checked once (bucket naming rules, no `..`)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from vmrun.errors import UsageError

SCHEMES = ("s3",)  # S3 and what speaks it (MinIO, R2, Ceph: an endpoint of their own)
# S3's bucket names: 3-63 of lowercase letters, digits, dots and hyphens, a letter or digit
# at each end (the older, looser names are long gone from new buckets)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class StoreURL:
    scheme: str
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the whole bucket

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    @property
    def name(self) -> str:
        """What the prefix arrives as on a host (DIR/<name>), as a local folder's name does."""
        return posixpath.basename(self.prefix) or self.bucket

    def join(self, *parts: str) -> StoreURL:
        return StoreURL(self.scheme, self.bucket, posixpath.join(self.prefix, *parts).strip("/"))

    @property
    def path(self) -> str:
        """bucket/prefix, as the mover names it after its remote."""
        return f"{self.bucket}/{self.prefix}".rstrip("/")


def is_store(text: str) -> bool:
    return any(text.startswith(f"{scheme}://") for scheme in SCHEMES)


def parse_store(text: str) -> StoreURL:
    """A bucket place from `s3://BUCKET[/PREFIX]`; one clear line for anything else."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in SCHEMES:
        raise UsageError(
            f"{text!r} is not a bucket address", hint="write s3://BUCKET/PREFIX", code="bad-store"
        )
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise UsageError(
            f"{text!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, dots,"
            " hyphens)",
            code="bad-store",
        )
    prefix = prefix.strip("/")
    parts = prefix.split("/") if prefix else []
    if any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 or c in '"\\' for c in prefix):
        raise UsageError(
            f"{text!r}: the prefix has an empty, `.` or `..` part, a quote, a backslash or a"
            " control character",
            code="bad-store",
        )
    return StoreURL(scheme, bucket, prefix)
