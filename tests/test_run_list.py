"""The host's run listing (hostside/run_list.sh), run here by sh against a home of its own:
it starts few processes a run (starting them was most of a listing's time), and what it
reads with the shell's own `read` and one awk says what cat, head, tail and grep said
(quick tier)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vmrun.backends.hosts.records import parse_listing
from vmrun.hostside import source

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="GNU tools, /proc")

TOOLS = ("awk", "base64", "basename", "cat", "date", "grep", "head", "stat", "tail", "wc")


def _listing(home: Path, *ids: str, path: str = "/usr/bin:/bin") -> str:
    return subprocess.run(
        ["sh", "-c", source("run_list.sh"), "vmrun-list", ".vmrun/runs", *ids],
        env={"HOME": str(home), "PATH": path},
        cwd=home,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()  # as bytes: a line's carriage return kept


def _run(home: Path, run_id: str, log: str, **files: str) -> Path:
    rec = home / ".vmrun" / "runs" / run_id
    rec.mkdir(parents=True)
    (rec / "run.json").write_text(json.dumps({"id": run_id}) + "\n")
    for name, text in {"pid": "999999999\n", "first_started": "1700000000\n", **files}.items():
        (rec / name).write_text(text)
    (rec / "log").write_text(log)
    return rec


def _lines(text: str, key: str) -> list[str]:
    return [line[len(key) + 1 :] for line in text.split("\n") if line.startswith(key + " ")]


def test_a_listing_starts_few_processes_a_run(tmp_path: Path) -> None:
    """Twelve ended runs: at most three processes each (base64, stat, awk) and the clock."""
    home, shims, calls = tmp_path / "home", tmp_path / "shims", tmp_path / "calls"
    shims.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool, path="/usr/bin:/bin")
        assert real is not None
        shim = shims / tool
        shim.write_text(f'#!/bin/sh\necho {tool} >> "{calls}"\nexec {real} "$@"\n')
        shim.chmod(0o755)
    for n in range(12):
        log = "starting\n" + "".join(f"epoch {e}/10 loss 0.{e}\n" for e in range(1, 4))
        _run(home, f"r{n:02d}", log + "snapshot saved at epoch 3\n", exit_code="0\n")
    text = _listing(home, path=f"{shims}:/usr/bin:/bin")
    records = parse_listing(text, "h1")
    assert [r.id for r in records] == [f"r{n:02d}" for n in range(12)]
    assert {r.progress for r in records} == {"epoch 3/10"}
    assert _lines(text, "SAVED") == ["snapshot saved at epoch 3"] * 12
    started = calls.read_text().split()
    assert len(started) <= 3 * 12 + 1, sorted(started)


def test_a_small_log_and_a_large_one_say_the_same(tmp_path: Path) -> None:
    """A log under 64 KiB is searched in one pass, a larger one by tail and grep as before:
    the same lines found (this attempt's last `epoch N/M`, past log_start's lines; the last
    saved snapshot), whichever way."""
    home = tmp_path / "home"
    earlier = "epoch 9/9 of the attempt before\n"
    tail = "Epoch: 4 / 10 back\\slash\nsaved a Snapshot\nplain\nepoch 5 /10\r\ntail no newline"
    filler = "".join(f"line {n} with nothing to find\n" for n in range(4000))  # > 64 KiB
    _run(home, "small", earlier + tail, log_start="1\n")
    _run(home, "large", filler + earlier + tail, log_start=f"{4001}\n")
    _run(home, "skipped", earlier + "saved snapshot\n", log_start="1\n")
    text = _listing(home, "small", "large", "skipped")
    assert _lines(text, "PROGRESS") == ["epoch 5 /10\r", "epoch 5 /10\r", ""]
    assert _lines(text, "SAVED") == ["saved a Snapshot", "saved a Snapshot", "saved snapshot"]


def test_files_read_by_the_shell_say_what_cat_and_head_said(tmp_path: Path) -> None:
    """A file of several lines is read whole (as `$(cat FILE)`); a first line is cut at its
    byte limit (as `head -n 1 | head -c N`), a long line of wide characters included."""
    home = tmp_path / "home"
    wide = "é" * 1500  # 3000 bytes: kept whole
    _run(
        home,
        "r1",
        "",
        attempt="2\n\n",
        exit_code="3",
        stopped="budget reached, and more words than 32 bytes\n",
        hang="h" * 5000 + "\nsecond\n",
    )
    (home / ".vmrun/runs/r1/versions.json").write_text(wide + "\nnext\n")
    (home / ".vmrun/runs/r1/failure.json").write_text('{"rank": 1}')
    text = _listing(home, "r1")
    assert _lines(text, "ATTEMPT") == ["2"]
    assert _lines(text, "EXIT") == ["3"]
    assert _lines(text, "VERSIONS") == [wide]
    assert _lines(text, "FAILURE") == ['{"rank": 1}']
    assert _lines(text, "HANG") == ["h" * 4096]
    (stopped,) = _lines(text, "STOPPED")
    assert stopped.split(" ", 1)[1] == "budget reached, and more words t"
