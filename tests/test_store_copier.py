"""The copier of `train --store` (hostside/store_copier.py's loop of store_sync.sh passes,
a part of the run's agent) as it decides, run alone here
against a home of its own (quick tier), with a stand-in for rclone that copies into a
folder (the bucket) and can be made to refuse: what goes (a snapshot once renamed, never a
temporary name; only what changed since a run started when the run writes into its work
directory), a bucket that is down (one line in the run's log, store.json failing with what
waits, caught up after), the run's end (one last copy, the record with it, the config file
gone), and giving up when the bucket stays down. The real rclone against moto's S3 is in
tests/test_train_store.py."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
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
from vmrun.stores.sync import StoreState

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

FAKE_RCLONE = r"""#!/bin/sh
# rclone --config CFG copy SRC store:DEST [--files-from-raw LIST] ...: files into $BUCKET/DEST;
# rclone ... cat store:PATH / rcat store:PATH: one object out, or in from stdin;
# rclone ... lsjson store:DIR (or a file): its files, [{"Path", "Size", "Metadata"}] (the
# vmrun-attempt tag a copy with --metadata-set gave it); --immutable: a file there with
# other bytes stays, said as rclone says it ($BUCKET.hold: a file whose upload fails)
if [ -e "$BUCKET.down" ]; then
  echo refused >> "$BUCKET.refused"
  echo "2026/11/29 07:00:00 ERROR : dial tcp 10.9.9.9:9000: connect: connection refused" >&2
  exit 1
fi
list= immutable= tag=
while [ $# -gt 0 ]; do
  case $1 in
    cat) [ -e "$BUCKET.noread" ] && { echo "AccessDenied: no read" >&2; exit 1; }
         f=$BUCKET/${2#store:}; [ -f "$f" ] || exit 3; exec cat "$f" ;;
    rcat) f=$BUCKET/${2#store:}; mkdir -p "${f%/*}" && exec cat > "$f" ;;
    lsjson) d=$BUCKET/${2#store:} m=$BUCKET.meta/${2#store:}
            [ -e "$d" ] || { echo "[]"; exit 0; }
            set --
            [ -d "$d" ] || { set -- -name "${d##*/}"; d=${d%/*} m=${m%/*}; }  # one file
            printf '['; sep=
            for f in $(find "$d" -mindepth 1 -maxdepth 1 -type f "$@" -printf '%f\n'); do
              printf '%s{"Path": "%s", "Size": %s' "$sep" "$f" "$(stat -c %s "$d/$f")"
              [ -f "$m/$f" ] && printf ', "Metadata": {"vmrun-attempt": "%s"}' "$(cat "$m/$f")"
              printf '}'; sep=', '
            done
            echo ']'
            exit 0 ;;
    --immutable) immutable=1; shift ;;
    --metadata-set) tag=${2#vmrun-attempt=}; shift 2 ;;
    copy) src=$2 dest=$3; shift 3 ;;
    --files-from-raw) list=$2; shift 2 ;;
    --config) cat "$2" >> "$BUCKET.configs"; shift 2 ;;
    *) shift ;;
  esac
done
to=$BUCKET/${dest#store:}
if [ -z "$list" ]; then list=$(mktemp); (cd "$src" && find . -type f | sed 's|^\./||') > "$list"; fi
rc=0
while IFS= read -r f; do
  if [ -e "$BUCKET.hold" ] && [ "${f##*/}" = "$(cat "$BUCKET.hold")" ]; then
    echo "2026/11/29 07:00:00 ERROR : $f: upload timed out" >&2; rc=1; continue
  fi
  if [ -n "$immutable" ] && [ -f "$to/$f" ] && ! cmp -s "$src/$f" "$to/$f"; then
    echo "2026/11/29 07:00:00 ERROR : $f: Source and destination exist but do not match:" \
      "immutable file modified" >&2
    rc=1
    continue
  fi
  meta=$BUCKET.meta/${dest#store:}/$f  # the object's tag, or none: in place before the
  # object, as one PUT of an object with its metadata is seen whole
  if [ -n "$tag" ]; then mkdir -p "${meta%/*}" && echo "$tag" > "$meta"; else rm -f "$meta"; fi
  mkdir -p "$(dirname "$to/$f")" && cp "$src/$f" "$to/$f" || exit 1
done < "$list"
exit $rc
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


def _node(tmp_path: Path, name: str, procs: list[subprocess.Popen[bytes]]) -> Any:
    """A home (tmp_path/name) with run r1 alive (a sleep in its own session) and its output
    folder, every node's copier writing into the one bucket; the copier is started by the
    test (`start(since=...)`). What it starts goes into `procs`, to be killed at the end."""
    home = tmp_path / name
    rec = home / ".vmrun" / "runs" / "r1"
    out = home / "work" / "results" / "r1"
    rec.mkdir(parents=True)
    out.mkdir(parents=True)
    (rec / "run.json").write_text('{"id": "r1"}\n')
    (rec / "log").write_text("epoch 1/2\n")
    run = subprocess.Popen(["sleep", "120"], start_new_session=True)
    procs.append(run)
    (rec / "pid_start").write_text(_start_time(run.pid) + "\n")
    (rec / "pid").write_text(f"{run.pid}\n")
    lib = tmp_path / "lib"  # as installed on a host: the copier stops a replaced run by path
    lib.mkdir(exist_ok=True)
    for script in ("store_sync.sh", "store_copier.py", "run_stop.sh", "checkpoint_layout.py"):
        (lib / script).write_text(source(script))
    fake = tmp_path / "rclone"
    fake.write_text(FAKE_RCLONE)
    fake.chmod(0o755)
    made = Copier(home, rec, out, tmp_path / "bucket", run)

    def start(
        since: str = "", final_wait: str = "60", role: str = "record", token: str = ""
    ) -> Copier:
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
        argv = [sys.executable, str(lib / "store_copier.py"), str(rec), str(out), "b/runs/r1"]
        argv += ["s3://b/runs/r1", since, str(cfg), str(fake), role, sys.executable, token]
        made.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        procs.append(made.proc)
        return made

    return start


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Any]:
    """`nodes(name)`: one more node of run r1 (a home of its own, the same bucket)."""
    procs: list[subprocess.Popen[bytes]] = []
    yield lambda name: _node(tmp_path, name, procs)
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def copier(nodes: Any) -> Any:
    """The one node of a run (its master: it copies the record too)."""
    return nodes("home")


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
    # of a resumed attempt sends only what changed since, its own files as its own
    assert left == [".store.logs", ".store.sent", ".store.synced", "store.json"], left


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


DCP = Path(__file__).parent / "fixtures" / "dcp" / "two-ranks"  # torch's 2-rank checkpoint
CKPT = "checkpoints/epoch-2"


def _shards_of(node: Copier, *names: str) -> None:
    """The checkpoint's files this node's ranks wrote (as FSDP on two hosts leaves them)."""
    folder = node.out / CKPT
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes((DCP / name).read_bytes())


def test_every_nodes_shards_arrive_and_the_metadata_only_once_all_it_names_is_there(
    nodes: Any,
) -> None:
    """Two nodes, one attempt (its id in the spec of both): the node that copies outputs
    only sends nothing before the master claims the attempt, and never claims it itself;
    then each sends its own shard; the master's .metadata waits, said once in its log,
    while the bucket lacks the other node's shard; temporary names never go, a hidden file
    in a checkpoint's folder does, one elsewhere does not."""
    a = nodes("a")
    b = nodes("b")
    other: Copier = b(role="outputs", token="t-1")
    _shards_of(other, "__1_0.distcp")
    wait_for(lambda: other.state().get("state") == "waiting", 20, "b to wait for its master")
    assert other.stored(f"{CKPT}/__1_0.distcp") is None
    assert other.stored(".vmrun/generation") is None and other.stored(".vmrun/log") is None
    Path(f"{other.bucket}.hold").write_text("__1_0.distcp")  # b's shard is slow to arrive

    master: Copier = a(token="t-1")
    _shards_of(master, "__0_0.distcp", ".metadata")
    folder = master.out / CKPT
    (folder / ".metadata.tmp").write_bytes(b"half")  # DCP's own, before its rename
    (folder / ".__0_0.distcp.tmp-9").write_bytes(b"half")
    (folder / "x.partial").write_bytes(b"half")
    (folder / ".extra").write_text("a hidden file of the checkpoint's\n")
    (master.out / ".env").write_text("TOKEN=s3cr3t\n")
    wait_for(lambda: master.stored(f"{CKPT}/__0_0.distcp") is not None, 20, "a's shard")
    wait_for(
        lambda: "waits until the bucket holds" in (master.rec / "log").read_text(),
        20,
        "the wait said",
    )
    wait_for(lambda: master.state().get("waits") == [f"{CKPT}/.metadata"], 20, "store.json")
    assert master.stored(f"{CKPT}/.metadata") is None
    assert "__1_0.distcp" in (master.rec / "log").read_text()
    assert master.stored(".vmrun/generation") == b"1\n"
    assert master.stored(".vmrun/generation.id") == b"t-1\n"

    Path(f"{other.bucket}.hold").unlink()
    wait_for(lambda: master.stored(f"{CKPT}/.metadata") is not None, 20, "the metadata")
    assert master.stored(f"{CKPT}/.metadata") == (DCP / ".metadata").read_bytes()
    assert master.stored(f"{CKPT}/__1_0.distcp") == (DCP / "__1_0.distcp").read_bytes()
    assert master.stored(f"{CKPT}/.extra") is not None
    for temporary in (".metadata.tmp", ".__0_0.distcp.tmp-9", "x.partial"):
        assert master.stored(f"{CKPT}/{temporary}") is None, temporary
    assert master.stored(".env") is None
    assert (master.rec / "log").read_text().count("waits until the bucket holds") == 1
    wait_for(lambda: master.state().get("waits") == [], 20, "nothing waits")
    assert other.state()["role"] == "outputs" and other.state()["state"] == "ok"
    assert other.stored(".vmrun/generation") == b"1\n"  # the master's claim, as it was
    assert not (other.rec / "generation").exists()


def test_the_end_waits_for_the_shards_the_metadata_names(nodes: Any) -> None:
    """The run ends while the bucket still lacks another node's shard: the last pass does
    not send .metadata, and the copier goes on (failing, said) until the shard is there."""
    master: Copier = nodes("a")(token="t-1")
    _shards_of(master, "__0_0.distcp", ".metadata")
    wait_for(lambda: master.stored(f"{CKPT}/__0_0.distcp") is not None, 20, "a's shard")
    master.end_run(0)
    wait_for(lambda: master.state().get("state") == "failing", 20, "the end to wait")
    assert master.stored(f"{CKPT}/.metadata") is None and master.proc is not None
    assert master.proc.poll() is None
    late = master.bucket / "b" / "runs" / "r1" / CKPT / "__1_0.distcp"
    late.write_bytes((DCP / "__1_0.distcp").read_bytes())  # the other node's copy arrives
    master.proc.wait(timeout=20)
    assert master.state()["state"] == "done"
    assert master.stored(f"{CKPT}/.metadata") == (DCP / ".metadata").read_bytes()


def test_a_path_two_nodes_wrote_with_other_bytes_is_said_and_not_overwritten(
    nodes: Any,
) -> None:
    """The node that copies outputs only sends a file it never sent before check-first:
    one the bucket holds with other bytes (the master's) stays, said once in the node's log
    and in its store.json; its own file, changed, goes again; the rest goes."""
    master: Copier = nodes("a")(token="t-1")
    (master.out / "metrics.jsonl").write_text('{"from": "a"}\n')
    wait_for(lambda: master.stored("metrics.jsonl") is not None, 20, "a's file")
    other: Copier = nodes("b")(role="outputs", token="t-1")
    (other.out / "metrics.jsonl").write_text('{"from": "b", "other": "bytes"}\n')
    (other.out / "b.txt").write_text("1\n")
    wait_for(lambda: other.stored("b.txt") == b"1\n", 20, "b's own file")
    wait_for(lambda: "metrics.jsonl" in other.state().get("conflicts", []), 20, "the clash")
    assert other.stored("metrics.jsonl") == b'{"from": "a"}\n'
    assert (
        "metrics.jsonl: the bucket already holds it with other bytes"
        in (other.rec / "log").read_text()
    )
    (other.out / "b.txt").write_text("2\n")
    (other.out / "metrics.jsonl").write_text('{"from": "b", "more": 1}\n')
    wait_for(lambda: other.stored("b.txt") == b"2\n", 20, "b's own file again")
    assert other.stored("metrics.jsonl") == b'{"from": "a"}\n'
    assert (other.rec / "log").read_text().count("already holds it") == 1
    assert other.state()["state"] == "ok"
    said = StoreState.parse((other.rec / "store.json").read_text())
    assert said is not None and said.role == "outputs" and said.conflicts == ("metrics.jsonl",)
    assert "not overwritten (another node's there): metrics.jsonl" in said.describe()


def test_the_master_never_overwrites_a_path_another_node_sent_first(nodes: Any) -> None:
    """The master too sends a path it never sent before check-first: one another node of
    this attempt sent first (tagged with the attempt's id) stays, said once in the master's
    log and in its store.json; what an earlier attempt left there (its master's, untagged,
    or another node's, tagged with its id) is sent over as it always was."""
    master: Copier = nodes("a")(token="t-1")
    run = master.bucket / "b" / "runs" / "r1"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text('{"attempt": 1}\n')  # attempt 1's master's
    (run / "b-old.txt").write_text("attempt 1's b\n")  # attempt 1's other node's
    tags = Path(f"{master.bucket}.meta") / "b" / "runs" / "r1"
    tags.mkdir(parents=True)
    (tags / "b-old.txt").write_text("t-0\n")
    (master.out / "first.txt").write_text("a\n")
    wait_for(lambda: master.stored("first.txt") == b"a\n", 20, "the master's claim and file")
    other: Copier = nodes("b")(role="outputs", token="t-1")
    (other.out / "shared.txt").write_text("from b\n")
    # the stand-in mover writes an object, then its metadata: both before the check
    wait_for(
        lambda: other.stored("shared.txt") == b"from b\n" and (tags / "shared.txt").exists(),
        20,
        "b's file and its tag",
    )
    assert (tags / "shared.txt").read_text() == "t-1\n"  # tagged with its attempt's id
    (master.out / "shared.txt").write_text("from a\n")
    (master.out / "metrics.jsonl").write_text('{"attempt": 2}\n')
    (master.out / "b-old.txt").write_text("attempt 2's a\n")
    wait_for(lambda: "shared.txt" in master.state().get("conflicts", []), 20, "the clash")
    wait_for(lambda: master.stored("metrics.jsonl") == b'{"attempt": 2}\n', 20, "attempt 2's")
    assert master.stored("b-old.txt") == b"attempt 2's a\n"
    assert master.stored("shared.txt") == b"from b\n"
    log = (master.rec / "log").read_text()
    assert "shared.txt: the bucket already holds it with other bytes" in log
    (master.out / "shared.txt").write_text("from a, again\n")
    (master.out / "metrics.jsonl").write_text('{"attempt": 2, "epoch": 2}\n')
    wait_for(lambda: b"epoch" in (master.stored("metrics.jsonl") or b""), 20, "its own again")
    assert master.stored("shared.txt") == b"from b\n"
    assert (master.rec / "log").read_text().count("already holds it") == 1
    said = StoreState.parse((master.rec / "store.json").read_text())
    assert said is not None and said.role == "record" and said.conflicts == ("shared.txt",)
    assert said.state == "ok"


def test_a_replaced_attempts_other_node_stops_copying(nodes: Any) -> None:
    """Once a newer attempt's id is in the bucket, the node that follows this attempt's id
    stops its run (`replaced`) and sends nothing more; it never wrote the generation."""
    master: Copier = nodes("a")(token="t-1")
    other: Copier = nodes("b")(role="outputs", token="t-1")
    (other.out / "b.txt").write_text("1\n")
    wait_for(lambda: other.stored("b.txt") == b"1\n", 20, "b's file")
    assert master.proc is not None
    master.proc.kill()  # a's host is gone; attempt 2 claims the run elsewhere
    ident = other.bucket / "b" / "runs" / "r1" / ".vmrun" / "generation.id"
    ident.write_text("t-2\n")
    (other.bucket / "b" / "runs" / "r1" / ".vmrun" / "generation").write_text("2\n")
    (other.out / "b.txt").write_text("2\n")
    assert other.proc is not None
    wait_for(lambda: other.proc.poll() is not None, 20, "b's copier to end")  # type: ignore[union-attr]
    wait_for(lambda: other.run.poll() is not None, 20, "b's run to be stopped")
    assert other.stored("b.txt") == b"1\n"
    assert (other.rec / "stopped").read_text().strip() == "replaced"
    assert other.state()["state"] == "replaced"
    assert "replaced by a newer attempt" in (other.rec / "log").read_text()
    assert other.stored(".vmrun/generation") == b"2\n"


def test_start_finds_the_mover_writes_the_config_and_the_passes_take_the_role_and_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's copier (run_agent.py's, from the launch spec's Store): `start` finds the
    mover beside the run's python and writes the config to a 0600 file of the record's,
    leaving nothing running; each pass then copies with the role and the attempt's id (a
    node that copies outputs only waits for its master's claim), and `close` removes the
    config."""
    home = tmp_path / "home"
    rec = home / ".vmrun" / "runs" / "r1"
    rec.mkdir(parents=True)
    fake = home / "env" / "bin" / "rclone"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\n[ "$1" = version ] && echo "rclone v1.66.0"\nexit 0\n')
    fake.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    lib = tmp_path / "lib"  # as installed on a host
    lib.mkdir()
    for script in ("store_sync.sh", "store_copier.py", "run_stop.sh", "checkpoint_layout.py"):
        (lib / script).write_text(source(script))
    found = importlib.util.spec_from_file_location("store_copier", lib / "store_copier.py")
    assert found is not None and found.loader is not None
    store_copier = importlib.util.module_from_spec(found)
    found.loader.exec_module(store_copier)
    python = str(fake.parent / "python")
    copier = store_copier.Copier(
        str(rec), str(tmp_path / "out"), "b/runs/r1", "s3://b/runs/r1", "", "outputs", "t-9", python
    )
    assert copier.start("[store]\nkey = s3cr3t\n")
    config = Path(copier.cfg)
    assert config.parent == rec and config.read_text() == "[store]\nkey = s3cr3t\n"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert (copier.rclone, copier.python) == (str(fake), python)
    assert not (rec / "store.pid").exists()  # nothing copies before the agent's loop
    (tmp_path / "out").mkdir()
    assert float(copier.one_pass(False)) > 0
    said = json.loads((rec / "store.json").read_text())
    assert (said["role"], said["state"]) == ("outputs", "waiting")
    copier.close()
    assert not config.exists()
