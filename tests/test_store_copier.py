"""The copier of `train --store` (hostside/store_sync.sh) as it decides, run by sh here
against a home of its own (quick tier), with a stand-in for rclone that copies into a
folder (the bucket) and can be made to refuse: what goes (a snapshot once renamed, never a
temporary name; only what changed since a run started when the run writes into its work
directory), a bucket that is down (one line in the run's log, store.json failing with what
waits, caught up after), the run's end (one last copy, the record with it, the config file
gone), and giving up when the bucket stays down. The real rclone against moto's S3 is in
tests/test_train_store.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

from vmrun.hostside import source

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

FAKE_RCLONE = r"""#!/bin/sh
# rclone --config CFG copy SRC store:DEST [--files-from-raw LIST] ...: files into $BUCKET/DEST;
# rclone ... cat store:PATH / rcat store:PATH: one object out, or in from stdin
if [ -e "$BUCKET.down" ]; then
  echo refused >> "$BUCKET.refused"
  echo "2026/11/29 07:00:00 ERROR : dial tcp 10.9.9.9:9000: connect: connection refused" >&2
  exit 1
fi
list=
while [ $# -gt 0 ]; do
  case $1 in
    cat) [ -e "$BUCKET.noread" ] && { echo "AccessDenied: no read" >&2; exit 1; }
         f=$BUCKET/${2#store:}; [ -f "$f" ] || exit 3; exec cat "$f" ;;
    rcat) f=$BUCKET/${2#store:}; mkdir -p "${f%/*}" && exec cat > "$f" ;;
    copy) src=$2 dest=$3; shift 3 ;;
    --files-from-raw) list=$2; shift 2 ;;
    --config) cat "$2" >> "$BUCKET.configs"; shift 2 ;;
    *) shift ;;
  esac
done
to=$BUCKET/${dest#store:}
if [ -z "$list" ]; then list=$(mktemp); (cd "$src" && find . -type f | sed 's|^\./||') > "$list"; fi
while IFS= read -r f; do
  mkdir -p "$(dirname "$to/$f")" && cp "$src/$f" "$to/$f" || exit 1
done < "$list"
"""


@dataclass
class Copier:
    home: Path
    rec: Path
    out: Path
    bucket: Path
    run: subprocess.Popen[bytes]
    proc: subprocess.Popen[bytes] | None = None

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.rec / "store.json").read_text()))
        except (OSError, ValueError):
            return {}

    def stored(self, name: str) -> bytes | None:
        path = self.bucket / "b" / "runs" / "r1" / name
        return path.read_bytes() if path.is_file() else None

    def end_run(self, code: int = 0) -> None:
        (self.rec / "exit_code").write_text(f"{code}\n")
        self.run.kill()
        self.run.wait()


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def copier(tmp_path: Path) -> Iterator[Any]:
    """A home with run r1 alive (a sleep in its own session) and its output folder; the
    copier is started by the test (`start(since=...)`), and killed by its pid at the end."""
    home = tmp_path / "home"
    rec = home / ".vmrun" / "runs" / "r1"
    out = home / "work" / "results" / "r1"
    rec.mkdir(parents=True)
    out.mkdir(parents=True)
    (rec / "run.json").write_text('{"id": "r1"}\n')
    (rec / "log").write_text("epoch 1/2\n")
    run = subprocess.Popen(["sleep", "120"], start_new_session=True)
    (rec / "pid_start").write_text(_start_time(run.pid) + "\n")
    (rec / "pid").write_text(f"{run.pid}\n")
    lib = tmp_path / "lib"  # as installed on a host: the copier stops a replaced run by path
    lib.mkdir()
    for name in ("store_sync.sh", "run_stop.sh"):
        (lib / name).write_text(source(name))
    fake = tmp_path / "rclone"
    fake.write_text(FAKE_RCLONE)
    fake.chmod(0o755)
    made = Copier(home, rec, out, tmp_path / "bucket", run)

    def start(since: str = "", final_wait: str = "60") -> Copier:
        cfg = rec / "store.abc123"
        cfg.write_text("[store]\nsecret_access_key = s3cr3t\n")
        cfg.chmod(0o600)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "BUCKET": str(made.bucket),
            "VMRUN_STORE_EVERY": "0.1",
            "VMRUN_STORE_LOGS_EVERY": "1",
            "VMRUN_STORE_BACKOFF": "1",
            "VMRUN_STORE_FINAL_WAIT": final_wait,
        }
        made.proc = subprocess.Popen(
            [
                "sh",
                str(lib / "store_sync.sh"),
                "watch",
                str(rec),
                str(out),
                "b/runs/r1",
                "s3://b/runs/r1",
                since,
                str(cfg),
                str(fake),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        return made

    yield start
    for proc in (made.proc, run):
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def test_snapshots_go_once_whole_a_bucket_down_is_said_once_and_the_end_takes_the_record(
    copier: Any,
) -> None:
    c: Copier = copier()
    (c.out / "snapshot.pt").write_bytes(b"1" * 1000)
    (c.out / ".snapshot.pt.tmp-77").write_bytes(b"half")  # the trainer's, before its rename
    (c.out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    wait_for(lambda: c.stored("snapshot.pt") == b"1" * 1000, 20, "the snapshot in the bucket")
    wait_for(lambda: c.state().get("state") == "ok", 20, "the copier to say it is up to date")
    assert c.stored(".snapshot.pt.tmp-77") is None and c.stored("metrics.jsonl") is not None

    Path(f"{c.bucket}.down").touch()
    (c.out / "snapshot.pt").write_bytes(b"2" * 2000)
    wait_for(lambda: c.state().get("state") == "failing", 20, "the copier to find it down")
    state = c.state()
    assert state["files"] >= 1 and state["bytes"] >= 2000, state
    assert "connection refused" in state["error"] and "ERROR" not in state["error"], state
    refused = Path(f"{c.bucket}.refused")
    wait_for(
        lambda: refused.is_file() and len(refused.read_text().split()) >= 3,
        20,
        "two tries more while the bucket is down",
    )
    Path(f"{c.bucket}.down").unlink()
    wait_for(lambda: c.stored("snapshot.pt") == b"2" * 2000, 20, "the copy to catch up")
    wait_for(lambda: "caught up" in (c.rec / "log").read_text(), 20, "the catching up said")
    log = (c.rec / "log").read_text()
    assert log.count("vmrun: the copy to s3://b/runs/r1 failed (") == 1, log

    c.end_run(0)
    assert c.proc is not None
    c.proc.wait(timeout=20)
    assert c.state()["state"] == "done"
    assert c.stored(".vmrun/exit_code") == b"0\n"
    assert b"caught up" in (c.stored(".vmrun/log") or b"")
    assert c.stored(".vmrun/pid") is None and c.stored(".vmrun/store.json") is None
    left = sorted(p.name for p in c.rec.iterdir() if p.name.startswith(("store.", ".store")))
    # the config (credentials) and the work files are gone; the marks stay, so the copier
    # of a resumed attempt sends only what changed since
    assert left == [".store.logs", ".store.synced", "store.json"], left


def test_a_run_in_its_work_directory_has_only_what_changed_since_it_started(
    copier: Any,
) -> None:
    c: Copier = copier(since=str(int(time.time()) - 5))
    old = c.out / "train.py"  # synced code: its mtime is the project's, from before the run
    old.write_text("print(1)\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    (c.out / "ckpt").mkdir()
    (c.out / "ckpt" / "model.pt").write_bytes(b"m")
    (c.out / ".git").mkdir()
    (c.out / ".git" / "index").write_bytes(b"i")
    c.end_run(0)
    assert c.proc is not None
    c.proc.wait(timeout=20)
    assert c.stored("ckpt/model.pt") == b"m"
    assert c.stored("train.py") is None and c.stored(".git/index") is None


def test_a_bucket_that_stays_down_after_the_end_is_given_up_and_said(copier: Any) -> None:
    c: Copier = copier(final_wait="1")
    (c.out / "snapshot.pt").write_bytes(b"s")
    Path(f"{c.bucket}.down").touch()
    c.end_run(0)
    assert c.proc is not None
    c.proc.wait(timeout=30)
    assert c.state()["state"] == "gave-up"
    assert "gave up copying to s3://b/runs/r1" in (c.rec / "log").read_text()
    assert not (c.rec / "store.abc123").exists()


def test_an_attempt_a_newer_one_replaced_is_stopped_and_copies_nothing_more(
    copier: Any,
) -> None:
    """The copier claims its attempt's generation before its first copy (a copy of the
    bucket's, restored into the record, is never sent back over it); once a newer attempt
    claims the run, this one's run is stopped as `replaced`, and nothing more is sent, the
    last pass included."""
    started: Copier = copier()
    (started.rec / "attempt").write_text("1\n")
    (started.rec / "generation").write_text("9\n")  # as a restore from the bucket brings it
    (started.out / "snapshot.pt").write_bytes(b"1" * 100)
    wait_for(lambda: started.stored("snapshot.pt") == b"1" * 100, 20, "the first snapshot")
    wait_for(lambda: started.stored(".vmrun/log") is not None, 20, "the record")
    assert started.stored(".vmrun/generation") == b"1\n"

    claimed = started.bucket / "b" / "runs" / "r1" / ".vmrun" / "generation"
    claimed.write_text("2\n")  # a newer attempt elsewhere took the run over
    (started.out / "snapshot.pt").write_bytes(b"2" * 100)
    assert started.proc is not None
    wait_for(lambda: started.proc.poll() is not None, 20, "the replaced copier to end")  # type: ignore[union-attr]
    wait_for(lambda: started.run.poll() is not None, 20, "the replaced run to be stopped")
    assert started.stored("snapshot.pt") == b"1" * 100  # the newer attempt's to write
    assert (started.rec / "stopped").read_text().strip() == "replaced"
    assert "replaced by attempt 2" in (started.rec / "log").read_text()
    assert started.state()["state"] == "replaced"
    assert not (started.rec / "store.pid").exists()


def test_a_generation_it_cannot_read_holds_the_copy_and_one_as_new_fences_it_at_once(
    copier: Any,
) -> None:
    """A bucket that takes writes but answers no read: nothing is sent (the fence cannot be
    read, so it is not taken for none), said as the mover's words. Then, readable, it holds
    this attempt's own number claimed by another node: this attempt is not the newest, so
    it stops before its first copy. An output named `generation` is no record file."""
    started: Copier = copier()
    Path(f"{started.bucket}.noread").touch()
    (started.out / "generation").write_text("an output of the run's own\n")
    (started.out / "snapshot.pt").write_bytes(b"1" * 100)
    wait_for(lambda: started.state().get("state") == "failing", 20, "the copy to wait")
    assert "AccessDenied" in started.state()["error"] and started.stored("snapshot.pt") is None
    claimed = started.bucket / "b" / "runs" / "r1" / ".vmrun" / "generation"
    claimed.parent.mkdir(parents=True, exist_ok=True)
    claimed.write_text("1\n")  # attempt 1, claimed by another node first
    Path(f"{started.bucket}.noread").unlink()
    assert started.proc is not None
    wait_for(lambda: started.proc.poll() is not None, 20, "the copier to stop")  # type: ignore[union-attr]
    assert started.stored("snapshot.pt") is None and started.state()["state"] == "replaced"
    assert (started.rec / "stopped").read_text().strip() == "replaced"


def test_an_output_named_generation_is_sent_like_any_other(copier: Any) -> None:
    started: Copier = copier()
    (started.out / "generation").write_text("an output of the run's own\n")
    wait_for(lambda: started.stored("generation") is not None, 20, "the output")
    assert started.stored(".vmrun/generation") == b"1\n"
