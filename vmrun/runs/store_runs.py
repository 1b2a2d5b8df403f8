"""The runs a bucket holds (`train --store`), as `status --store` lists them: one listing of
the store, then each run's small record objects (run.json through the typed record, its end,
attempt, failure, versions, the last line of its metrics), read a few at a time. What the
bucket cannot know it does not say: a run whose copy has no end is running only while its
copy is recent; once the copy has been quiet for long, it is lost as far as the bucket
knows (its hosts, asked, say more: their view wins in `status`). One listing costs a
request per thousand objects (checkpoint shards too), fewer than listing each run's record
apart would for any but runs of thousands of objects; `StoreRuns` keeps what one read, for
a caller that lists again and again."""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vmrun.errors import RemoteError, UsageError, VmrunError
from vmrun.results.failure import WorkerFailure
from vmrun.results.record import RunRecord
from vmrun.results.stragglers import Slow, from_metrics, summary
from vmrun.runs.provenance import versions_of
from vmrun.runs.state import RunState
from vmrun.runs.unwatched import Unwatched
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
class BucketRun(Unwatched):
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

    # what a bucket's copy does not keep (the watchers' fields: Unwatched)
    @property
    def tasks(self) -> tuple[()]:
        return ()


Bodies = dict[tuple[str, str], tuple[tuple[str, int, float], bytes]]


def list_runs(
    s3: Any,
    store: StoreURL,
    shown: str = "",
    *,
    last: int = 0,
    bodies: Bodies | None = None,
    left_out: list[str] | None = None,
) -> list[BucketRun]:
    """Every run under `store` with a record (run.json) there, oldest first: one listing,
    then the record objects it shows, READERS at a time. `shown`: the store as the user
    named it (each run's `host`); `last`: only the newest N, by when each started (its
    `started` object), the others' ids in `left_out`, none of their objects read; `bodies`:
    objects read before, kept by (run, name) with their (ETag, size, time), so an
    unchanged object is not read again. An object gone between the listing and its
    reading is absent (a run whose run.json went, not there)."""
    now = time.time()
    by_run = _listed(s3, store, last, left_out)
    kept: Bodies = {} if bodies is None else bodies
    wanted = [
        (rid, name, found[name])
        for rid, found in by_run.items()
        for name in (*(f"{RECORD}/{n}" for n in _READ), "metrics.jsonl")
        if name in found
    ]

    def fetch(item: tuple[str, str, Object]) -> bytes | None:
        rid, name, obj = item
        version = (obj.etag, obj.size, obj.modified)
        had = kept.get((rid, name))
        if had is not None and had[0] == version:
            return had[1]
        tail = METRICS_TAIL if name == "metrics.jsonl" and obj.size > METRICS_TAIL else 0
        try:
            body = b"" if obj.size == 0 else read(s3, run_place(store, rid).join(name), tail)
        except UsageError as exc:
            if exc.code == "store-empty":
                return None  # gone since the listing
            raise
        kept[(rid, name)] = (version, body)
        return body

    with ThreadPoolExecutor(min(READERS, max(1, len(wanted)))) as pool:
        bodies_read = dict(
            zip(((r, n) for r, n, _ in wanted), pool.map(fetch, wanted), strict=True)
        )
    if bodies is not None:  # what is no longer listed is not kept
        listed = {(r, n) for r, n, _ in wanted}
        for gone in [k for k in bodies if k not in listed]:
            del bodies[gone]
    runs = []
    for rid, found in by_run.items():
        absent = {n for (r, n), b in bodies_read.items() if r == rid and b is None}
        if f"{RECORD}/run.json" in absent:
            continue  # removed since the listing
        found = {k: o for k, o in found.items() if k not in absent}
        texts = {
            n.removeprefix(f"{RECORD}/"): b.decode("utf-8", "replace")
            for (r, n), b in bodies_read.items()
            if r == rid and b is not None
        }
        runs.append(_run(rid, found, texts, store, shown or str(store), now))
    runs.sort(key=lambda r: (r.started, r.id))
    return runs


class StoreRuns:
    """A store's runs listed again and again (the dashboard's, every few seconds): one
    client for the process, its credentials found once; each record object read once
    while its ETag and size stay; and the listing itself kept `every` seconds (the rows
    stay, `age` old). A bucket that did not answer is not asked again sooner either."""

    def __init__(
        self, store: StoreURL, credentials: str = "auto", shown: str = "", every: float = 0.0
    ) -> None:
        self.store, self.credentials, self.shown, self.every = store, credentials, shown, every
        self._lock = threading.Lock()  # one listing at a time
        self._making = threading.Lock()  # the client, made once (a log read need not wait)
        self._s3: Any = None
        self._bodies: Bodies = {}
        self._at = 0.0
        self._found: list[BucketRun] | VmrunError | None = None

    def client(self) -> Any:
        from vmrun.stores.access import resolve
        from vmrun.stores.bucket import client

        with self._making:
            if self._s3 is None:
                self._s3 = client(resolve(self.credentials))
            return self._s3

    @property
    def age(self) -> float:
        """How long ago the rows `runs` gives were listed."""
        return max(0.0, time.time() - self._at) if self._found is not None else 0.0

    def runs(self, last: int = 0, left_out: list[str] | None = None) -> list[BucketRun]:
        with self._lock:
            if self._found is None or time.time() - self._at >= self.every:
                try:
                    self._found = list_runs(
                        self.client(),
                        self.store,
                        self.shown,
                        last=last,
                        bodies=self._bodies,
                        left_out=left_out,
                    )
                except VmrunError as exc:
                    self._found = exc
                self._at = time.time()
            if isinstance(self._found, VmrunError):
                raise self._found
            return list(self._found)


def _listed(
    s3: Any, store: StoreURL, last: int, left_out: list[str] | None
) -> dict[str, dict[str, Object]]:
    """The objects of each run with a record under `store` (the newest `last`, by when each
    started; the others' ids in `left_out`)."""
    by_run: dict[str, dict[str, Object]] = {}
    for obj in objects(s3, store):
        rid, sep, key = obj.key.partition("/")
        if sep and rid and not rid.startswith("."):
            by_run.setdefault(rid, {})[key] = obj
    by_run = {rid: found for rid, found in by_run.items() if f"{RECORD}/run.json" in found}
    if last and len(by_run) > last:
        order = sorted(by_run, key=lambda rid: (_began(by_run[rid]), rid))
        if left_out is not None:
            left_out += order[:-last]
        by_run = {rid: by_run[rid] for rid in order[-last:]}
    return by_run


def _began(found: Mapping[str, Object]) -> float:
    """When the run started, as its bucket says: its `started` object's arrival."""
    first = found.get(f"{RECORD}/started") or found[f"{RECORD}/run.json"]
    return first.modified


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
