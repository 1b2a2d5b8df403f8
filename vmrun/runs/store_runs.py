"""The runs a bucket holds (`train --store`), as `status --store` lists them: one listing of
the store, then each run's small record objects (run.json through the typed record, its end,
attempt, failure, versions, the last line of its metrics), read a few at a time. What the
bucket cannot know it does not say: a run whose copy has no end is running only while its
copy is recent; once the copy has been quiet for long, it is lost as far as the bucket
knows (its hosts, asked, say more: their view wins in `status`)."""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vmrun.errors import RemoteError, UsageError
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord
from vmrun.results.stragglers import Slow, from_metrics, summary
from vmrun.runs.provenance import versions_of
from vmrun.runs.state import RunState
from vmrun.store_url import StoreURL
from vmrun.stores.bucket import Object, objects, read
from vmrun.stores.sync import RECORD, StoreState, run_place

# a copy with no end and nothing new for this long: the run is lost, as far as the bucket
# knows (the copier sends the record every 30 s while the log grows; a run can be quiet
# for a while, an epoch's length, and still be running)
QUIET_S = 1800.0
READERS = 8  # objects read at once
METRICS_TAIL = 65536  # the end of metrics.jsonl read: its last line
LOG_TAIL = 1 << 20  # the end of a run's log read from its copy (the dashboard shows it)
# a run's record objects read (those the listing shows); each at most a few KiB
_READ = (
    "run.json",
    "exit_code",
    "stopped",
    "attempt",
    "failure.json",
    "versions.json",
    "hang",
    "budget",
    "recoveries",
)
_SLACK_S = 5.0  # an end copied this long before its attempt's record still counts as its own


@dataclass(frozen=True)
class BucketRun:
    """One run as its copy in the bucket says (a `RunRow`): times are the bucket's (when
    each object arrived), but `started`: run.json's."""

    id: str
    host: str  # the store, as given (`status` shows it where a host's run shows its host)
    place: StoreURL  # the run's own place: STORE/RUN_ID
    record: RunRecord
    copied: float  # the newest object's arrival: the copy's last word
    now: float  # when it was listed
    exit_code: int | None = None
    ended: float | None = None  # when its end (exit_code, stopped) arrived
    stopped_by: str | None = None  # `stopped`'s word (user, budget, ...): it was stopped
    attempts: int = 1
    progress: str | None = None  # "epoch 7/10" from its metrics' last line
    failure: WorkerFailure | None = None
    versions: Mapping[str, Any] | None = None
    hung: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    recoveries: int = 0
    recovery: str = ""
    gave_up: bool = False
    slow: str = ""
    slow_ranks: tuple[Slow, ...] = field(default_factory=tuple)

    @property
    def state(self) -> RunState:
        if self.stopped_by is not None:
            return RunState.STOPPED
        if self.exit_code is not None:
            return RunState.DONE if self.exit_code == 0 else RunState.FAILED
        return RunState.RUNNING if self.now - self.copied < QUIET_S else RunState.LOST

    @property
    def reason(self) -> str:
        """A run with no end in its copy: how old the copy's last word is."""
        if self.stopped_by is not None or self.exit_code is not None:
            return ""
        ago = _ago(self.now - self.copied)
        if self.state == RunState.RUNNING:
            return f"as its bucket copy said {ago} ago"
        return f"no end in its bucket copy, quiet for {ago}"

    @property
    def started(self) -> float:
        return self.record.started or 0.0

    @property
    def duration(self) -> float | None:
        end = self.ended
        if end is None and self.state == RunState.RUNNING:
            end = self.now
        return None if end is None or not self.started else max(0.0, end - self.started)

    @property
    def ran_s(self) -> float | None:
        now = self.duration
        return None if now is None else self.record.ran_before_s + now

    @property
    def store(self) -> StoreState:
        """The copy as the bucket holds it: `copied`, at its last object's arrival."""
        return StoreState(str(self.place), "copied", self.copied, synced=self.copied)

    @property
    def recovering(self) -> str:
        return ""  # a recovery under way is its supervisor's, on the hosts

    @property
    def tasks(self) -> tuple[()]:
        return ()


def list_runs(s3: Any, store: StoreURL, shown: str = "") -> list[BucketRun]:
    """Every run under `store` with a record (run.json) there, oldest first: one listing,
    then the record objects it shows, READERS at a time. `shown`: the store as the user
    named it (each run's `host`)."""
    now = time.time()
    by_run: dict[str, dict[str, Object]] = {}
    for obj in objects(s3, store):
        rid, sep, key = obj.key.partition("/")
        if sep and rid and not rid.startswith("."):
            by_run.setdefault(rid, {})[key] = obj
    wanted = [
        (rid, name, _size(found, name))
        for rid, found in by_run.items()
        if f"{RECORD}/run.json" in found
        for name in (*(f"{RECORD}/{n}" for n in _READ), "metrics.jsonl")
        if name in found
    ]

    def fetch(item: tuple[str, str, int]) -> bytes:
        rid, name, size = item
        tail = METRICS_TAIL if name == "metrics.jsonl" and size > METRICS_TAIL else 0
        return b"" if size == 0 else read(s3, run_place(store, rid).join(name), tail)

    with ThreadPoolExecutor(min(READERS, max(1, len(wanted)))) as pool:
        bodies = dict(zip(((r, n) for r, n, _ in wanted), pool.map(fetch, wanted), strict=True))
    runs = []
    for rid, found in by_run.items():
        if f"{RECORD}/run.json" not in found:
            continue  # its first copy not there yet: nothing to say of it
        texts = {
            n.removeprefix(f"{RECORD}/"): b.decode("utf-8", "replace")
            for (r, n), b in bodies.items()
            if r == rid
        }
        runs.append(_run(rid, found, texts, store, shown or str(store), now))
    runs.sort(key=lambda r: (r.started, r.id))
    return runs


def run_record(s3: Any, place: StoreURL) -> RunRecord:
    """The run's record (its run.json, typed) from its place in the bucket."""
    where = place.join(RECORD, "run.json")
    try:
        body = read(s3, where)
    except UsageError:
        parent = StoreURL(place.scheme, place.bucket, posixpath.dirname(place.prefix))
        raise UsageError(
            f"no run {posixpath.basename(place.prefix)} under {parent}",
            hint="the bucket holds the runs started with --store there",
            code="run-not-found",
        ) from None
    return _record(body.decode("utf-8", "replace"), where)


def read_log(s3: Any, place: StoreURL) -> bytes:
    """The end of the run's log as its copy holds it (LOG_TAIL bytes at most, from a whole
    line); nothing where it has none yet."""
    try:
        body = read(s3, place.join(RECORD, "log"), LOG_TAIL)
    except UsageError:  # not there
        return b""
    return body if len(body) < LOG_TAIL else body[body.find(b"\n") + 1 :]


def _record(text: str, where: StoreURL) -> RunRecord:
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        raise RemoteError(f"{where} is not a run's record", code="store-copy-failed")
    return RunRecord.from_json(raw)


def _size(found: Mapping[str, Object], name: str) -> int:
    return found[name].size


def _run(
    rid: str,
    found: Mapping[str, Object],
    texts: Mapping[str, str],
    store: StoreURL,
    shown: str,
    now: float,
) -> BucketRun:
    place = run_place(store, rid)
    try:
        record = _record(texts.get("run.json", ""), place.join(RECORD, "run.json"))
    except RemoteError:
        record = RunRecord.from_json({})
    attempt = found.get(f"{RECORD}/attempt")
    since = attempt.modified - _SLACK_S if attempt is not None else float("-inf")

    def end(name: str) -> str | None:
        """An object of this attempt's (an earlier attempt's end, failure, hang stay in
        the bucket, never removed there)."""
        obj = found.get(f"{RECORD}/{name}")
        return texts.get(name, "") if obj is not None and obj.modified >= since else None

    code, stopped = end("exit_code"), end("stopped")
    ended = [
        found[f"{RECORD}/{n}"].modified for n in ("exit_code", "stopped") if end(n) is not None
    ]
    count, last, gave_up = _recoveries(texts.get("recoveries", ""))
    slow_ranks, progress = _metrics(texts.get("metrics.jsonl", ""), record)
    return BucketRun(
        id=rid,
        host=shown,
        place=place,
        record=record,
        copied=max(o.modified for o in found.values()),
        now=now,
        exit_code=_int(code) if code is not None else None,
        ended=min(ended, default=None),
        stopped_by=stopped.strip() if stopped is not None else None,
        attempts=_int(texts.get("attempt", "")) or 1,
        progress=progress,
        failure=WorkerFailure.parse(end("failure.json") or ""),
        versions=versions_of(texts["versions.json"]) if "versions.json" in texts else None,
        hung=_json_map(end("hang") or ""),
        budget=_json_map(end("budget") or ""),
        recoveries=count,
        recovery=last,
        gave_up=gave_up,
        slow=summary(slow_ranks),
        slow_ranks=slow_ranks,
    )


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _json_map(text: str) -> dict[str, Any] | None:
    try:
        raw = json.loads(text.splitlines()[0]) if text.strip() else None
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


def _recoveries(text: str) -> tuple[int, str, bool]:
    """The supervisor's lines (KIND<TAB>TIME<TAB>TEXT): how many, the last's text, gave up."""
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return 0, "", False
    kind, _, rest = lines[-1].partition("\t")
    return len(lines), rest.partition("\t")[2], kind == "gave-up"


def _metrics(text: str, record: RunRecord) -> tuple[tuple[Slow, ...], str | None]:
    """The last whole line of metrics.jsonl: its slow ranks, and `epoch N[/TOTAL]`."""
    lines = [x for x in text.splitlines() if x.strip()]
    try:
        line: Any = json.loads(lines[-1]) if lines else None
    except ValueError:
        line = None
    if not isinstance(line, dict):
        return (), None
    slow = tuple(from_metrics(line))
    epoch = line.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return slow, None
    args = record.launch.args or ()
    total = args[0] if record.launch.template and args and args[0].isdigit() else ""
    return slow, f"epoch {epoch}" + (f"/{total}" if total else "")


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"
