"""`vmrun fetch --store`: a run's files straight from its bucket into results/RUN_ID/, laid
out as a fetch from its hosts (its record beside its outputs), each object verified on
arrival (size, and MD5 where its ETag is one) and renamed into place only when whole; an
object already here with the same size and time is left alone."""

from __future__ import annotations

import hashlib
import os
import posixpath
import time
from pathlib import Path
from typing import Any

from vmrun.errors import RemoteError, UsageError
from vmrun.runs.outputs import FETCHED_CHECKPOINTS, WHATS, RunLocation, resolve_what
from vmrun.store_url import StoreURL
from vmrun.stores.bucket import Object, calling, objects
from vmrun.stores.sync import RECORD
from vmrun.transfer.types import FetchSpec, Progress, Report, selected


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
            specs.append(
                FetchSpec(
                    remote=".",
                    local=posixpath.join("results", rid),
                    label=item,
                    select=(rel, f"{rel}/*"),
                    include=include,
                    exclude=exclude,
                )
            )
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
        if spec.latest is not None and spec.select == FETCHED_CHECKPOINTS:
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
        with calling(key):
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
