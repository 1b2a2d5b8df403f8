"""A run's place in its bucket, as this machine reads it with boto3 (the `aws` extra): its
record (run.json), the newest run under a store, and `fetch` of its files straight from
the bucket into results/RUN_ID/ (as a fetch from its hosts lays them out), each object
verified on arrival (size, and MD5 where its ETag is one) and renamed into place only when
whole; an object already here with the same size and time is left alone."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmrun.errors import RemoteError, UsageError
from vmrun.runs.outputs import CHECKPOINTS, WHATS, RunLocation, resolve_what
from vmrun.stores.access import Access
from vmrun.stores.sync import RECORD
from vmrun.stores.url import StoreURL
from vmrun.transfer.types import FetchSpec, Progress, Report, selected


@dataclass(frozen=True)
class Object:
    key: str  # relative to the run's place
    size: int
    etag: str
    modified: float


def client(access: Access) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise UsageError(
            "reading a bucket from here needs boto3", hint="pip install 'vmrun[aws]'",
            code="bad-store",
        ) from None  # fmt: skip
    config = Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=10,
                    read_timeout=60)  # fmt: skip
    keys = {} if access.from_host else {
        "aws_access_key_id": access.key_id, "aws_secret_access_key": access.secret,
        "aws_session_token": access.token or None,
    }  # fmt: skip
    return boto3.client("s3", region_name=access.region, endpoint_url=access.endpoint or None,
                        config=config, **keys)  # fmt: skip


def _failure(exc: Exception, where: StoreURL) -> Exception:
    """boto3's error as vmrun's: refused, missing, out of reach."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404", "NoSuchBucket"):
            return UsageError(f"nothing at {where}", code="store-empty")
        return RemoteError(
            f"{where}: the bucket refused: {code or exc}", code="store-denied",
            hint="check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID)",
        )  # fmt: skip
    if isinstance(exc, BotoCoreError):
        return RemoteError(f"{where}: {exc}", code="store-unreachable",
                           hint="check the endpoint (AWS_ENDPOINT_URL)")  # fmt: skip
    return exc


def _calling(where: StoreURL) -> Any:
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
    with _calling(place):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=place.bucket,
                                                                 Prefix=prefix):  # fmt: skip
            for item in page.get("Contents", ()):
                found.append(Object(item["Key"][len(prefix) :], int(item["Size"]),
                                    str(item.get("ETag", "")).strip('"'),
                                    item["LastModified"].timestamp()))  # fmt: skip
    return found


def run_meta(s3: Any, place: StoreURL) -> dict[str, Any]:
    """The run's run.json from its record in the bucket."""
    record = place.join(RECORD, "run.json")
    try:
        with _calling(record):
            body = s3.get_object(Bucket=record.bucket, Key=record.prefix)["Body"].read()
    except UsageError:
        parent = StoreURL(place.scheme, place.bucket, posixpath.dirname(place.prefix))
        raise UsageError(
            f"no run {posixpath.basename(place.prefix)} under {parent}",
            hint="the bucket holds the runs started with --store there",
            code="run-not-found",
        ) from None
    try:
        meta = json.loads(body)
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise RemoteError(f"{record} is not a run's record", code="store-copy-failed")
    return meta


def newest_run(s3: Any, store: StoreURL) -> str:
    """The run under `store` that started last (by its record's first object)."""
    runs = [(o.modified, o.key.split("/", 1)[0]) for o in objects(s3, store)
            if o.key.endswith(f"/{RECORD}/started") and o.key.count("/") == 2]  # fmt: skip
    if not runs:
        raise UsageError(f"no run under {store}", code="run-not-found")
    return max(runs)[1]


def fetch_run(
    s3: Any,
    place: StoreURL,
    items: list[str],
    dest: Path,
    progress: Progress,
    *,
    latest: int | None = None,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
) -> Report:
    """The run's files that `items` name (results, checkpoints, logs, metrics, or a path in
    its output folder) into dest/results/RUN_ID/."""
    rid = posixpath.basename(place.prefix)
    host = str(place)
    report = Report(host, engine="s3")
    began = time.monotonic()
    wanted = _wanted(objects(s3, place), rid, items, latest, include, exclude)
    if not wanted:
        report.missing = [f"{item} of run {rid}" for item in items]
        return report
    total = sum(o.size for o, _ in wanted)
    progress.begin(host, len(wanted), total, via="the bucket")
    for obj, local in wanted:
        target = dest / local
        if _same(target, obj):
            report.unchanged += 1
            progress.advance(host, obj.size)
            continue
        try:
            _download(s3, place, obj, target, progress)
        except (OSError, ValueError, RemoteError, UsageError) as exc:
            report.failed[local] = str(exc)[:300]
            if isinstance(exc, ValueError):
                report.mismatched.append(local)
            progress.file_end(host, local, False)
            continue
        report.fetched.append(local)
        report.fetched_bytes += obj.size
        report.wire_bytes += obj.size
        progress.file_end(host, local, True)
    report.seconds = time.monotonic() - began
    return report


def _wanted(
    found: list[Object],
    rid: str,
    items: list[str],
    latest: int | None,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
) -> list[tuple[Object, str]]:
    """(object, local path) for each object an item names, once each; the run's record
    lands beside its outputs, as a fetch from its hosts lays it out."""
    where = RunLocation(run_id=rid, host="", record_dir=RECORD, out_dir=".")
    specs: list[FetchSpec] = []
    for item in items:
        if item in WHATS:
            specs += resolve_what(item, where, include=include, exclude=exclude, latest=latest)
        else:
            rel = posixpath.normpath(item).strip("/")
            specs.append(FetchSpec(remote=".", local=posixpath.join("results", rid), label=item,
                                   select=(rel, f"{rel}/*"), include=include,
                                   exclude=exclude))  # fmt: skip
    chosen: dict[str, tuple[Object, str]] = {}
    for spec in specs:
        hits: list[tuple[Object, str]] = []
        for obj in found:
            in_record = obj.key.startswith(f"{RECORD}/")
            if in_record != (spec.remote == RECORD):
                continue
            rel = obj.key[len(RECORD) + 1 :] if in_record else obj.key
            if in_record and "/" in rel:
                continue
            if selected(rel, spec):
                hits.append((obj, posixpath.join(spec.local, rel)))
        if spec.latest is not None and spec.select == CHECKPOINTS:
            hits = sorted(hits, key=lambda h: h[0].modified)[-spec.latest :]
        for obj, local in hits:
            chosen.setdefault(obj.key, (obj, local))
    return list(chosen.values())


def _same(target: Path, obj: Object) -> bool:
    try:
        st = target.stat()
    except OSError:
        return False
    return st.st_size == obj.size and abs(st.st_mtime - obj.modified) < 1.0


def _download(s3: Any, place: StoreURL, obj: Object, target: Path, progress: Progress) -> None:
    """One object into target, via a temporary name beside it; checked before the rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.vmrun-part")
    key = place.join(obj.key)
    md5 = hashlib.md5(usedforsecurity=False)
    got = 0
    try:
        with _calling(key):
            body = s3.get_object(Bucket=key.bucket, Key=key.prefix)["Body"]
            with open(part, "wb") as fh:
                for chunk in iter(lambda: body.read(1 << 20), b""):
                    fh.write(chunk)
                    md5.update(chunk)
                    got += len(chunk)
                    progress.advance(str(place), len(chunk))
                fh.flush()
                os.fsync(fh.fileno())
        single = "-" not in obj.etag and len(obj.etag) == 32
        if got != obj.size or (single and md5.hexdigest() != obj.etag):
            raise ValueError(f"{obj.key}: what arrived is not what the bucket holds")
        os.utime(part, (obj.modified, obj.modified))
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
