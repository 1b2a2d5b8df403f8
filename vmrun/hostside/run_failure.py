"""Which worker of a torchrun run failed first, and with what code, from torchrun's own
summary at the end of the run's log. torchrun exits 1 whenever a worker fails, so its status
hides the code the user's script returned; its summary (ChildFailedError's "Root Cause"
block) names it, with the worker's rank, local rank, host and pid.

    python3 run_failure.py REC LOG RC [SKIP]

Reads LOG past its first SKIP lines (this attempt's lines: a hosts run's log_start) and past
its last `\\035vmrun attempt` mark (a Slurm job's log of several attempts), at most its last
1 MiB. When torchrun's summary is there, writes REC/failure.json (atomically) and prints the
first failed worker's code, a signal N as 128+N the way a shell tells it; else prints RC and
removes a failure.json of an earlier attempt. Lines may carry srun's `--label` prefix (`0: `);
of several summaries (one per node of a Slurm job) the earliest failure counts.
Stdlib only, Python 3.8+; never fails: on any trouble it prints RC.
"""

import json
import os
import re
import signal
import sys

TAIL = 1 << 20
ROOT = "Root Cause (first observed failure):"
ATTEMPT = "\035vmrun attempt"
LABEL = re.compile(r"^\s*\d+: ")  # srun --label
FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
RANK = re.compile(r"^(-?\d+) \(local_rank: (-?\d+)\)")
EXITCODE = re.compile(r"^(-?\d+) \(pid: (\d+)\)")
BORDER = re.compile(r"^(=+|-+)$")


def this_attempt(path, skip):
    """LOG's text after its first `skip` lines and its last attempt mark (its last 1 MiB)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if skip > 0:
            fh.seek(0)
            for _ in range(skip):
                if not fh.readline():
                    break
            if size - fh.tell() > TAIL:
                fh.seek(size - TAIL)
        else:
            fh.seek(max(0, size - TAIL))
        text = fh.read().decode("utf-8", "replace")
    at = text.rfind(ATTEMPT)
    return text[at:] if at >= 0 else text


def blocks(text):
    """Every root-cause block's fields: {time, host, rank, exitcode, ...} as torchrun wrote them."""
    found = []
    lines = [LABEL.sub("", line, count=1) for line in text.splitlines()]
    for at, line in enumerate(lines):
        if line.strip() != ROOT:
            continue
        fields: dict = {}
        for later in lines[at + 1 : at + 40]:
            if BORDER.match(later.strip()):
                break
            match = FIELD.match(later)
            if match:
                fields.setdefault(match.group(1), match.group(2).strip())
        if "exitcode" in fields:
            found.append(fields)
    return found


def failure_of(fields, launcher_exit):
    """failure.json's object from one root-cause block; None when its exit code is unreadable."""
    code = EXITCODE.match(fields.get("exitcode", ""))
    if not code:
        return None
    raw, pid = int(code.group(1)), int(code.group(2))
    rank = RANK.match(fields.get("rank", ""))
    name = None
    if raw < 0:
        try:
            name = signal.Signals(-raw).name
        except ValueError:
            name = f"signal {-raw}"
    return {
        "launcher": "torchrun",
        "exit": 128 - raw if raw < 0 else raw,
        "signal": name,
        "rank": int(rank.group(1)) if rank else None,
        "local_rank": int(rank.group(2)) if rank else None,
        "host": fields.get("host") or None,
        "pid": pid,
        "time": fields.get("time") or None,
        "launcher_exit": launcher_exit,
    }


def said(failure):
    """`rank 3 (local rank 1) on gpu2 exited with 3`: the failure in words, kept in the
    record for what reads it on the host (notify_send.py's message); vmrun's own lines say
    it with the node's name (vmrun.results.failure)."""
    rank, local = failure["rank"], failure["local_rank"]
    who = "a worker" if rank is None else f"rank {rank}"
    if local is not None and local != rank:
        who += f" (local rank {local})"
    if failure["host"]:
        who += f" on {failure['host']}"
    if failure["signal"]:
        return f"{who} was killed by {failure['signal']}"
    return f"{who} exited with {failure['exit']}"


def first_failure(text, launcher_exit):
    """The earliest failure of the summaries in `text` (the first printed on a tie: the node
    that ended first), or None."""
    failures = [f for f in (failure_of(b, launcher_exit) for b in blocks(text)) if f]
    if not failures:
        return None
    return min(failures, key=lambda f: f["time"] or "")


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh)
        fh.write("\n")
    os.replace(tmp, path)


def main(argv):
    rec, log, rc = argv[1], argv[2], argv[3]
    skip = int(argv[4]) if len(argv) > 4 and argv[4].isdigit() else 0
    target = os.path.join(rec, "failure.json")
    launcher_exit = int(rc) if rc.lstrip("-").isdigit() else None
    failure = first_failure(this_attempt(log, skip), launcher_exit) if rc != "0" else None
    if failure is None:
        if os.path.exists(target):
            os.unlink(target)
        return rc
    write_json(target, {**failure, "said": said(failure)})
    return str(failure["exit"])


if __name__ == "__main__":
    try:
        print(main(sys.argv))
    except Exception:  # a failure's details never cost the run its code
        print(sys.argv[3] if len(sys.argv) > 3 else "")
