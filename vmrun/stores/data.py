"""A run's `--data` on a node (or a cluster's shared filesystem): local paths pushed from
here (vmrun.transfer.push), bucket prefixes copied there straight from the bucket (the
mover), each recorded in run.json: where it went and what it held."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path

from vmrun.errors import RemoteError, UsageError
from vmrun.reporting import Reporter
from vmrun.ssh.connection import Connection
from vmrun.store_url import StoreURL
from vmrun.stores.access import Access
from vmrun.transfer.types import Progress


def place_data(
    conn: Connection,
    data: Sequence[tuple[Path | StoreURL, str | None]],
    base: str,
    out: Reporter,
    progress: Progress | None = None,
    access: Access | None = None,
) -> list[dict[str, object]]:
    """Every --data item onto the host under `base` (the run's work directory; DIR/<its
    name> for one with a DIR); what run.json records of each."""
    from vmrun.transfer.manifest import normalize_remote
    from vmrun.transfer.push import push_data

    records: list[dict[str, object]] = []
    for source, where in data:
        if isinstance(source, Path):
            records += push_data(conn, [(source, where)], base, out, progress)
            continue
        dest = (
            normalize_remote(where, base=base, where="the project's work directory")
            if where
            else base
        )
        records.append(_from_store(conn, source, dest, out, progress, access))
    return records


def _from_store(
    conn: Connection,
    source: StoreURL,
    dest: str,
    out: Reporter,
    progress: Progress | None,
    access: Access | None,
) -> dict[str, object]:
    from vmrun.stores.mover import copy_from_store

    if access is None:
        raise UsageError(f"--data {source}: no access resolved for the bucket", code="bad-store")
    remote = posixpath.join(dest, source.name)
    got = copy_from_store(conn, source, remote, access, progress or Progress())
    report = got.report
    if report.failed:
        raise RemoteError(
            f"--data {source}: {len(report.failed)} object(s) did not arrive intact"
            f" ({', '.join(sorted(report.failed)[:3])})",
            host=conn.label,
            code="store-copy-failed",
        )
    if report.fetched:
        mib, took = report.wire_bytes / 2**20, report.seconds
        out.info(
            f"{conn.label}: copied {len(report.fetched)} object(s) of {source},"
            f" {mib:.1f} MiB ({took:.1f} s) to {remote}"
        )
    return {
        "store": str(source),
        "remote": remote,
        "files": got.objects,
        "bytes": got.nbytes,
        "copied": len(report.fetched),
    }
