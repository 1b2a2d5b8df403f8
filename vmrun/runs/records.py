"""Runs on a host: started detached, recorded in ~/.vmrun/runs/<id>/, followed, stopped.

A run is started with `setsid` so it outlives the SSH connection. Its record directory holds
run.json (what, where, when), pid, log (everything it printed), exit_code (written when
it ends) and first_started (the host's clock when the first attempt began: files in the
work directory newer than that are the run's outputs). Every process of a run carries
VMRUN_RUN_ID in its environment, inherited by torchrun's workers even though torchrun puts
each worker in a session of its own; that is how `stop` finds and kills all of them, and
proves none is left.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmrun.errors import RemoteError, UsageError
from vmrun.remote_paths import RUNS_DIR, run_dir
from vmrun.ssh import quoting
from vmrun.ssh.connection import Connection

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PROGRESS = re.compile(r"\bepoch[ :=]+(\d+)(?:\s*/\s*(\d+))?", re.IGNORECASE)

# sh -c START rec workdir run_id run_json mode CMD...   (env: the run's variables)
# mode "new" starts the log afresh; "resume" (another attempt of the same run) appends to it
# and clears the last attempt's pid/exit_code/stopped. Prints the log's line count before
# this attempt, then the pid of the run's supervising shell: a session leader (setsid), so
# its pid is the run's session id too; pid_start (its start time in /proc/PID/stat) tells
# that session from a later one that reuses the number.
_START = r"""rec=$1; wd=$2; id=$3; meta=$4; mode=$5; shift 5
case "$rec" in /*) ;; *) rec="$HOME/$rec" ;; esac
mkdir -p "$rec" || exit 125
lines=0
if [ "$mode" = resume ]; then
  rm -f "$rec/pid" "$rec/pid_start" "$rec/exit_code" "$rec/stopped"
  [ -f "$rec/log" ] && lines=$(wc -l < "$rec/log")
fi
printf '%s\n' "$meta" > "$rec/run.json.tmp" && mv "$rec/run.json.tmp" "$rec/run.json"
[ -f "$rec/first_started" ] || date +%s > "$rec/first_started"
cd "$wd" 2>/dev/null || { echo "vmrun: the work directory $wd is missing" >&2; exit 126; }
export VMRUN_RUN_ID="$id" VMRUN_RUN_DIR="$rec"
setsid -f sh -c '
  rec=$1; mode=$2; shift 2
  (read -r l < /proc/$$/stat; set -- ${l##*) }; echo "${20}") > "$rec/pid_start"
  echo $$ > "$rec/pid.tmp" && mv "$rec/pid.tmp" "$rec/pid"
  if [ "$mode" = resume ]; then exec >> "$rec/log"; else exec > "$rec/log"; fi
  "$@" 2>&1 < /dev/null
  rc=$?
  if [ ! -e "$rec/stopped" ]; then
    echo $rc > "$rec/exit_code.tmp" && mv "$rec/exit_code.tmp" "$rec/exit_code"
  fi
' vmrun-run "$rec" "$mode" "$@" < /dev/null > /dev/null 2>&1
i=0
while [ ! -s "$rec/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
echo "$lines"
cat "$rec/pid" 2>/dev/null || { echo "vmrun: the run did not start" >&2; exit 125; }
"""

# sh -c LIST runs_dir [ids...]: the host's clock, then one block per run, fields as KEY VALUE
# lines (times by the host's clock: FIRST the first attempt's start, BEGAN this attempt's)
_LIST = r"""base=$1; shift
cd "$HOME" 2>/dev/null
echo "NOW $(date +%s)"
[ -d "$base" ] || exit 0
if [ $# -eq 0 ]; then set -- $(ls -1 "$base" 2>/dev/null); fi
for id in "$@"; do
  d="$base/$id"
  [ -f "$d/run.json" ] || continue
  echo "RUN $id"
  echo "META $(base64 -w0 < "$d/run.json")"
  [ -f "$d/first_started" ] && echo "FIRST $(cat "$d/first_started")"
  [ -f "$d/pid" ] && echo "BEGAN $(stat -c %Y "$d/pid")"
  if [ -f "$d/exit_code" ]; then
    echo "EXIT $(cat "$d/exit_code")"; echo "ENDED $(stat -c %Y "$d/exit_code")"
  fi
  if [ -f "$d/stopped" ]; then echo "STOPPED $(stat -c %Y "$d/stopped")"; fi
  pid=$(cat "$d/pid" 2>/dev/null)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
     && tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "VMRUN_RUN_ID=$id"; then
    echo "ALIVE 1"
  else
    echo "ALIVE 0"
  fi
  if [ -f "$d/log" ]; then
    p=$(tail -c 65536 "$d/log" | grep -aiE 'epoch[ :=]+[0-9]+ */ *[0-9]' | tail -n1)
    [ -n "$p" ] || p=$(tail -c 65536 "$d/log" | grep -aiE 'epoch[ :=]+[0-9]' | tail -n1)
    echo "PROGRESS $p"
  fi
done
"""

# sh -c STOP runs_dir id grace: TERM every process of the run, KILL after the grace, verify.
_STOP = r"""base=$1; id=$2; grace=$3
d="$HOME/$base/$id"
[ -f "$d/run.json" ] || { echo "vmrun: no run $id on this host" >&2; exit 3; }
# The run's session: its leader's pid, unless that number now leads another session (a
# dead leader's number is not reused while its session has members).
sess=$(cat "$d/pid" 2>/dev/null); born=$(cat "$d/pid_start" 2>/dev/null)
if [ -n "$sess" ] && [ -r "/proc/$sess/stat" ]; then
  now=$(read -r l < "/proc/$sess/stat"; set -- ${l##*) }; echo "${20}")
  [ -n "$born" ] && [ "$now" = "$born" ] || sess=
fi
# Members: every process of the run's session, and every process carrying the run's id
# (torchrun's workers run in sessions of their own; a child that cleared its environment
# stays in the session).
members() {
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = "$$" ] && continue
    if [ -n "$sess" ] && [ "$(read -r l < "/proc/$p/stat"; set -- ${l##*) }; echo "$4")" = "$sess" ]
    then echo "$p"; continue; fi 2>/dev/null
    tr '\0' '\n' < "$e" 2>/dev/null | grep -qx "VMRUN_RUN_ID=$id" && echo "$p"
  done
}
alive() {  # members that are not zombies
  for p in $(members); do
    s=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$p/status" 2>/dev/null)
    [ -n "$s" ] && [ "$s" != Z ] && echo "$p"
  done
}
pids=$(alive)
[ -e "$d/exit_code" ] || touch "$d/stopped"
if [ -n "$pids" ]; then
  echo TERM $pids
  kill -TERM $pids 2>/dev/null
  i=0
  while [ -n "$(alive)" ] && [ $i -lt $((grace * 10)) ]; do sleep 0.1; i=$((i+1)); done
  left=$(alive)
  if [ -n "$left" ]; then echo KILL $left; kill -KILL $left 2>/dev/null; fi
  i=0
  while [ -n "$(alive)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
fi
left=$(alive)
echo LEFT $left
if [ ! -e "$d/exit_code" ]; then
  echo 143 > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
fi
"""

# sh -c FOLLOW runs_dir id lines: the log from line N (0: all) until the run ends.
_FOLLOW = r"""d="$HOME/$1/$2"
[ -f "$d/run.json" ] || { echo "vmrun: no run $2 on this host" >&2; exit 3; }
i=0
while [ ! -s "$d/pid" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
pid=$(cat "$d/pid" 2>/dev/null)
touch "$d/log"
if [ "$3" = 0 ]; then start=+1; else start=$3; fi
if [ -n "$pid" ] && [ ! -e "$d/exit_code" ]; then
  exec tail -n "$start" -F --pid="$pid" "$d/log" 2>/dev/null
else
  exec tail -n "$start" "$d/log"
fi
"""


@dataclass
class RunRecord:
    id: str
    host: str
    meta: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    ended: float | None = None
    stopped: bool = False
    alive: bool = False
    progress: str = ""
    first_started: float | None = None  # host clock, first attempt
    began: float | None = None  # host clock, this attempt
    host_now: float | None = None  # host clock when listed

    @property
    def state(self) -> str:
        if self.alive:
            return "running"
        if self.stopped:
            return "stopped"
        if self.exit_code is None:
            return "lost"  # killed hard, or the host rebooted
        return "done" if self.exit_code == 0 else "failed"

    @property
    def started(self) -> float:
        return float(self.meta.get("started", 0))

    @property
    def duration(self) -> float | None:
        """This attempt's run time, by the host's clock alone when it told (no skew)."""
        if self.began is not None:
            end = self.host_now if self.alive else self.ended
            return None if end is None else max(0.0, end - self.began)
        end = self.ended if not self.alive else time.time()
        return None if end is None or not self.started else max(0.0, end - self.started)


@dataclass(frozen=True)
class StopResult:
    host: str
    run_id: str
    signalled: tuple[int, ...]
    killed: tuple[int, ...]
    left: tuple[int, ...]


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"bad run id {run_id!r}: letters, digits, . _ - only")
    return run_id


def record_dir(run_id: str) -> str:
    return run_dir(check_run_id(run_id))


@dataclass(frozen=True)
class Started:
    pid: int  # the run's supervising shell
    log_lines: int  # lines the log already had (earlier attempts of a resumed run)


def start(
    conn: Connection,
    run_id: str,
    workdir: str,
    argv: Sequence[str],
    meta: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    resume: bool = False,
) -> Started:
    """Start argv detached in workdir. `resume`: another attempt of an existing run, whose
    log goes on (the record keeps the first attempt's start time as `first_started`)."""
    now = time.time()
    meta_text = json.dumps({**meta, "id": run_id, "started": now}, sort_keys=True)
    mode = "resume" if resume else "new"
    result = conn.run(
        ["sh", "-c", _START, "vmrun-start", record_dir(run_id), workdir, run_id, meta_text, mode,
         *argv],
        env=env,
    )
    if not result.ok:
        raise RemoteError(f"could not start run {run_id}: {result.output_tail(3)}", host=conn.label)
    try:
        lines, pid = result.stdout_tail.strip().splitlines()[-2:]
        return Started(int(pid), int(lines))
    except ValueError:
        raise RemoteError(f"run {run_id} did not report its pid", host=conn.label) from None


def list_runs(conn: Connection, run_ids: Sequence[str] = ()) -> list[RunRecord]:
    """Every run recorded on the host (or just these), oldest first, in one round trip."""
    from vmrun.transfer.streams import capture  # all of the output: a tail would drop old runs

    argv = ["sh", "-c", _LIST, "vmrun-list", RUNS_DIR, *(check_run_id(r) for r in run_ids)]
    status, out, err = capture(conn, quoting.plain_command(argv), what="the run listing")
    if status != 0:
        raise RemoteError(f"listing the runs failed: {err.strip()[-300:]}", host=conn.label)
    records: list[RunRecord] = []
    now: float | None = None
    for line in out.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "NOW":
            now = _number(value)
        elif key == "RUN":
            records.append(RunRecord(value, conn.label, host_now=now))
        elif not records:
            continue
        elif key == "FIRST":
            records[-1].first_started = _number(value)
        elif key == "BEGAN":
            records[-1].began = _number(value)
        elif key == "META":
            try:
                records[-1].meta = json.loads(base64.b64decode(value))
            except ValueError:
                records[-1].meta = {}
        elif key == "EXIT":
            records[-1].exit_code = int(value) if value.strip().lstrip("-").isdigit() else None
        elif key == "ENDED":
            records[-1].ended = float(value)
        elif key == "STOPPED":
            records[-1].stopped = True
            records[-1].ended = records[-1].ended or float(value)
        elif key == "ALIVE":
            records[-1].alive = value.strip() == "1"
        elif key == "PROGRESS":
            match = _PROGRESS.search(value)
            if match:
                total = f"/{match.group(2)}" if match.group(2) else ""
                records[-1].progress = f"epoch {match.group(1)}{total}"
    records.sort(key=lambda r: (r.started, r.id))
    return records


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def follow(
    conn: Connection,
    run_id: str,
    on_line: Callable[[bytes], None],
    *,
    last: int = 0,
    skip: int = 0,
) -> None:
    """Stream the run's log (from the start, its last N lines, or after its first `skip`
    lines) until the run ends."""
    lines = f"+{skip + 1}" if skip else str(last)
    result = conn.run(
        ["sh", "-c", _FOLLOW, "vmrun-follow", RUNS_DIR, check_run_id(run_id), lines],
        on_output=lambda stream, data: on_line(data),
    )
    if result.exit_status == 3:
        raise UsageError(f"no run {run_id} on this host", host=conn.label)


def stop(conn: Connection, run_id: str, *, grace: float = 10.0) -> StopResult:
    """TERM every process of the run, KILL what is left after the grace, and verify."""
    result = conn.run(
        ["sh", "-c", _STOP, "vmrun-stop", RUNS_DIR, check_run_id(run_id), str(max(1, int(grace)))]
    )
    if result.exit_status == 3:
        raise UsageError(f"no run {run_id} on this host", host=conn.label)
    if not result.ok:
        raise RemoteError(f"stopping {run_id} failed: {result.output_tail(3)}", host=conn.label)
    fields: dict[str, tuple[int, ...]] = {"TERM": (), "KILL": (), "LEFT": ()}
    for line in result.stdout_tail.splitlines():
        key, _, value = line.partition(" ")
        if key in fields:
            fields[key] = tuple(int(p) for p in value.split() if p.isdigit())
    outcome = StopResult(conn.label, run_id, fields["TERM"], fields["KILL"], fields["LEFT"])
    if outcome.left:
        raise RemoteError(
            f"processes {', '.join(map(str, outcome.left))} of run {run_id} survived SIGKILL",
            host=conn.label,
            hint="they may be stuck in the kernel (a hung GPU); check the host",
        )
    return outcome


# sh -c READ runs_dir id lines: the log, or its last N lines (0: all), once.
_READ = r"""d="$HOME/$1/$2"
[ -f "$d/run.json" ] || { echo "vmrun: no run $2 on this host" >&2; exit 3; }
[ -f "$d/log" ] || exit 0
if [ "$3" = 0 ]; then exec cat "$d/log"; else exec tail -n "$3" "$d/log"; fi
"""


def read_log(
    conn: Connection, run_id: str, on_line: Callable[[bytes], None], *, last: int = 0
) -> None:
    """The run's log as it is now (all of it, or its last N lines)."""
    result = conn.run(
        ["sh", "-c", _READ, "vmrun-read", RUNS_DIR, check_run_id(run_id), str(last)],
        on_output=lambda stream, data: on_line(data),
    )
    if result.exit_status == 3:
        raise UsageError(f"no run {run_id} on this host", host=conn.label)


def find_run(
    group: Any, run_id: str | None, *, running_only: bool = False
) -> tuple[str, list[tuple[Any, RunRecord]]]:
    """Which hosts of the group have the run (default: the newest, or newest running, run).

    Returns the run id and (entry, record) for each host that has it, in host order.
    """
    from vmrun.errors import HostsFailed

    outcomes = group.map(lambda entry, conn: list_runs(conn, [run_id] if run_id else []))
    by_host = {o.host: o.value or [] for o in outcomes if o.ok}
    if run_id is None:
        candidates = [
            r for recs in by_host.values() for r in recs if r.state == "running" or not running_only
        ]
        if not candidates:
            failures = {o.host: o.error for o in outcomes if not o.ok}
            if failures:
                raise HostsFailed(failures, total=len(outcomes))
            what = "running run" if running_only else "run"
            raise UsageError(f"no {what} recorded on {', '.join(by_host) or 'these hosts'}")
        run_id = max(candidates, key=lambda r: (r.started, r.id)).id
    found = [
        (entry, rec)
        for entry in group.entries
        for rec in by_host.get(entry.label, [])
        if rec.id == run_id
    ]
    if not found:
        failures = {o.host: o.error for o in outcomes if not o.ok}
        if failures:
            raise HostsFailed(failures, total=len(outcomes))
        raise UsageError(
            f"no run {run_id} on {', '.join(by_host)}", hint="`vmrun status` lists the runs"
        )
    return run_id, found
