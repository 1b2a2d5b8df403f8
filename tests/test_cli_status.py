"""`vmrun status` on a real sshd test host, over run records written straight into the host
user's ~/.vmrun/runs/ (as a run leaves them: run.json, pid, exit_code, log, log_start, with
host-clock mtimes): progress from the latest attempt, the 20-row cap, --all, --last."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, error_in
from testbed import NetnsBed, TestHost

T0 = 1_700_000_000


@pytest.fixture
def h1(bed: NetnsBed) -> Iterator[TestHost]:
    yield bed["h1"]
    shutil.rmtree(bed["h1"].home / ".vmrun" / "runs", ignore_errors=True)


def _record(host: TestHost, rid: str, started: int, **files: str) -> Path:
    """A finished run's record (exit 0, 90 s long), owned by the host user like a real one."""
    base = host.home / ".vmrun" / "runs"
    d = base / rid
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"id": rid, "started": started, "host": "h1"}))
    (d / "pid").write_text("1\n")  # never the run's: pid 1 has no VMRUN_RUN_ID
    (d / "exit_code").write_text("0\n")
    for name, text in files.items():
        (d / name).write_text(text)
    os.utime(d / "pid", (started, started))
    os.utime(d / "exit_code", (started + 90, started + 90))
    for path in (host.home / ".vmrun", base, d, *d.iterdir()):
        os.chown(path, host.uid, host.gid)
    return d


def _rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    assert lines and lines[0].split()[:3] == ["RUN", "HOST", "STATE"], stdout
    return {ln.split()[0]: ln.split() for ln in lines[1:]}


def test_progress_is_the_latest_attempts_own(bed_client: Client, h1: TestHost) -> None:
    """A run resumed at line 3 of its log shows that attempt's `epoch 43/60`, not the first
    attempt's `epoch 40/40`; one whose new attempt trained nothing yet shows `-`. Its state
    says which attempt it is, as a requeued job's does."""
    first = "epoch 39/40 loss 0.2\nepoch 40/40 loss 0.1\n"
    banner = "--- attempt 2, resumed from epoch 41 (snapshot.pt) ---\n"
    again = {"attempt": "2\n", "log_start": "2\n"}
    _record(h1, "res-1", T0, log=first + banner + "epoch 43/60 loss 0.1\n", **again)
    _record(h1, "res-2", T0 + 1, log=first + banner, **again)
    shown = bed_client.vmrun("status", "-H", "h1")
    assert shown.returncode == 0, shown.stderr
    rows = _rows(shown.stdout)
    assert rows["res-1"][2:6] == ["done,", "attempt", "2", "epoch"], shown.stdout
    assert rows["res-1"][6] == "43/60", shown.stdout
    assert rows["res-2"][2:6] == ["done,", "attempt", "2", "-"], shown.stdout
    assert "40/40" not in shown.stdout


def test_twenty_rows_by_default_the_rest_counted_all_and_last(
    bed_client: Client, h1: TestHost
) -> None:
    ids = [f"old-{i:02d}" for i in range(23)]
    for i, rid in enumerate(ids):
        _record(h1, rid, T0 + 100 * i, log=f"epoch {i + 1}/30 loss 0.5\n")
    capped = bed_client.vmrun("status", "-H", "h1")
    assert capped.returncode == 0, capped.stderr
    assert list(_rows(capped.stdout)) == ids[3:]  # the newest 20, oldest first
    assert "vmrun: 3 older run(s) not shown (--last N / --all)" in capped.stderr
    assert "older run" not in capped.stdout  # the note is on stderr, the table alone on stdout
    every = bed_client.vmrun("status", "-H", "h1", "--all")
    assert every.returncode == 0, every.stderr
    assert list(_rows(every.stdout)) == ids and "not shown" not in every.stderr
    newest = _rows(every.stdout)["old-22"]
    assert newest[3:5] == ["epoch", "23/30"] and newest[-2:] == ["1:30", "0"], every.stdout
    five = bed_client.vmrun("status", "-H", "h1", "--last", "5")
    assert list(_rows(five.stdout)) == ids[-5:]
    assert "vmrun: 18 older run(s) not shown" in five.stderr


def test_a_negative_last_is_refused_before_connecting(bed_client: Client) -> None:
    """Exit 2 naming --last, even with a host that could not be reached at all."""
    bad = bed_client.vmrun("status", "--last", "-1", "-H", "nowhere.invalid")
    assert bad.returncode == 2, bad.stderr
    code, said = error_in(bad.stderr)
    assert code == "usage" and said.startswith("--last") and said.endswith("-1"), bad.stderr
    assert "nowhere" not in bad.stderr


def test_json_names_a_host_whose_link_is_cut_by_its_code(
    bed: NetnsBed, bed_client: Client, h1: TestHost
) -> None:
    """h2 does not answer (its cable is out): stdout's JSON has h1's run and an object for
    h2 with its error's code, the one its stderr line prints; the exit is that code's."""
    _record(h1, "ok-1", T0)
    bed["h2"].cut_link()
    try:
        done = bed_client.vmrun(
            "status", "--json", "-H", "h1", "-H", "h2", "--connect-timeout", "2"
        )
    finally:
        bed["h2"].heal_link()
    assert done.returncode == 12, done.stderr
    run, place = json.loads(done.stdout)
    assert (run["run"], run["state"], run["error"]) == ("ok-1", "done", None)
    assert (place["run"], place["hosts"]) == (None, ["h2"])
    assert place["error"]["code"] == error_in(done.stderr)[0] == "host-unreachable"
    assert place["error"]["exit_status"] == 12 and "h2" in place["error"]["message"]
