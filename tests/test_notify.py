"""Notifications: the URLs vmrun takes, the host's own sender (run here against a real HTTP
receiver on loopback: the claim that makes one message per event, the retries, a receiver
that is down), and, on real sshd test hosts with the receiver on the hosts' network, a run's
end and failure told once, also when the laptop's vmrun is killed, with the URL never on a
command line, in a log or in run.json."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, clean_host, run_id_of, run_pids, wait_for
from testbed import NetnsBed

from vmrun import hostside
from vmrun.errors import UsageError
from vmrun.notify.send import Charge, Notify, send
from vmrun.notify.targets import parse, redact

SENDER = hostside.HERE / "notify_send.py"
TOKEN = "s3cr3t-t0ken"


class Receiver:
    """A real HTTP server that keeps every POST (path, headers, body); `status` is what it
    answers; while `hold` is clear, its answer's headers come a byte a second (a sender held
    in its post for as long as the test needs, each byte within the sender's own timeout)."""

    def __init__(self, host: str = "127.0.0.1"):
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        self.hold = threading.Event()
        self.hold.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.posts.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body.decode(errors="replace"),
                    }
                )
                if outer.hold.is_set():
                    self.send_response(outer.status)
                    self.end_headers()
                    return
                self.wfile.write(f"HTTP/1.0 {outer.status} Held\r\nX-Held: ".encode())
                for _ in range(300):
                    if outer.hold.wait(1):
                        break
                    self.wfile.write(b".")
                self.wfile.write(b"\r\nContent-Length: 0\r\n\r\n")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str, path: str = f"/hook/{TOKEN}") -> str:
        return f"json://{host}:{self.port}{path}"

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(p["body"]) for p in self.posts]

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


# -- the URLs --------------------------------------------------------------------------


def test_urls_map_to_what_a_host_can_post_and_show_no_secret() -> None:
    ntfy = parse("ntfy://mytopic")
    assert ntfy.webhook and (ntfy.webhook.url, ntfy.webhook.kind) == (
        "https://ntfy.sh/mytopic",
        "ntfy",
    )
    own = parse("ntfys://user:pw@ntfy.example.org/alerts")
    assert own.webhook and own.webhook.url == "https://ntfy.example.org/alerts"
    assert own.webhook.auth.startswith("Basic ")
    slack = parse("slack://T000/B000/XXXX/#runs")
    assert slack.webhook and slack.webhook.url == "https://hooks.slack.com/services/T000/B000/XXXX"
    assert parse("json://10.0.0.1:8080/in").webhook.url == "http://10.0.0.1:8080/in"  # type: ignore[union-attr]
    assert parse("mailto://me:pw@gmail.com").webhook is None  # this machine only
    for url in ("ntfy://mytopic", "slack://T000/B000/XXXX", "mailto://me:pw@gmail.com"):
        shown = redact(url)
        assert "mytopic" not in shown and "XXXX" not in shown and "pw" not in shown, shown
    for bad in ("nothing", "foo://x", "slack://a/b", "ntfy://", "json:///path"):
        with pytest.raises(UsageError) as caught:
            parse(bad)
        assert caught.value.code == "notify-url-bad"


# -- the host's sender, here -------------------------------------------------------------


def _record(
    tmp_path: Path,
    receiver: Receiver,
    *,
    code: str = "0",
    on: tuple[str, ...] = ("end", "fail"),
    url: str = "",
    charge: Charge | None = None,
) -> Path:
    rec = tmp_path / "rec"
    out = tmp_path / "out"
    rec.mkdir(parents=True)
    out.mkdir(parents=True)
    notify = Notify((parse(url or receiver.url("127.0.0.1")),), on)
    facts = {
        "run": "r1",
        "where": "h1",
        "epochs_asked": "3",
        "fetch": "vmrun fetch results --run r1",
    }
    (rec / "notify.json").write_text(notify.host_config(facts, charge=charge))
    (rec / "exit_code").write_text(code + "\n")
    (rec / "first_started").write_text(f"{int(time.time()) - 75}\n")
    (rec / "out_dir").write_text(f"{out}\n")
    (out / "metrics.jsonl").write_text('{"epoch": 3, "loss": 0.1234567}\n')
    return rec


def _sender(rec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VMRUN_NOTIFY_PAUSE_S": "0.01"}
    return subprocess.run(
        [sys.executable, str(SENDER), str(rec), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_the_host_sender_tells_the_end_once(tmp_path: Path, receiver: Receiver) -> None:
    """The message: run, state, exit, where, duration, epochs done/asked, last loss, how to
    fetch; a second send (or the laptop's render) finds the event claimed."""
    rec = _record(tmp_path, receiver)
    assert _sender(rec, "send").returncode == 0
    (message,) = receiver.messages()
    assert message["title"] == "vmrun: run r1 done" and message["type"] == "success"
    body = message["message"]
    for fact in (
        "exit 0",
        "on h1",
        "duration 0:01:1",
        "epochs 3/3",
        "last loss 0.1235",
        "vmrun fetch results --run r1",
    ):
        assert fact in body, body
    assert receiver.posts[0]["path"] == f"/hook/{TOKEN}"
    assert "cost" not in body  # its machines' prices are unknown: no made-up figure
    assert _sender(rec, "send").returncode == 0
    rendered = json.loads(_sender(rec, "render").stdout)
    assert rendered["send"] == "local"  # the host sent: the laptop sends only what it cannot
    assert json.loads(_sender(rec, "render").stdout)["send"] == "none"
    assert len(receiver.posts) == 1


def test_the_end_says_what_the_run_cost_at_its_recorded_prices(
    tmp_path: Path, receiver: Receiver
) -> None:
    rec = _record(tmp_path, receiver, charge=Charge(7.2, "DKK"))
    (rec / "first_started").write_text(f"{int(time.time()) - 1800}\n")  # half an hour ago
    rendered = json.loads(_sender(rec, "render").stdout)
    assert re.search(r"duration 0:30:0\d, cost 3\.60 DKK, epochs 3/3", rendered["body"]), rendered


def test_a_resumed_runs_end_counts_its_attempts_not_the_time_between_them(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Attempt 1 ran 20 min (ran_before_s, which vmrun gave this attempt's notify.json),
    attempt 2 began 10 min ago (its pid file), the first start was 2 hours ago: 30 min
    charged, the gap is not."""
    rec = _record(tmp_path, receiver, charge=Charge(7.2, "DKK", ran_before_s=1200))
    (rec / "first_started").write_text(f"{int(time.time()) - 7200}\n")
    (rec / "pid").write_text("1\n")
    began = time.time() - 600
    os.utime(rec / "pid", (began, began))
    rendered = json.loads(_sender(rec, "render").stdout)
    assert re.search(r"duration 0:30:0\d, cost 3\.60 DKK", rendered["body"]), rendered


def test_a_jobs_sender_finds_its_metrics_and_prices_in_notify_json(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A Slurm job's record has no out_dir file and no pid: its outputs' folder and prices
    come with notify.json (vmrun.backends.slurm.records.charge), its time from the job's
    first start."""
    from vmrun.backends.slurm.records import charge
    from vmrun.results.record import CLUSTER, Launch, Prices, RunRecord

    out = tmp_path / "out"
    record = RunRecord(
        run_id="r1",
        where=CLUSTER,
        launch=Launch(out_dir=str(out)),
        prices=Prices({"n": 7.2}, 7.2, "DKK"),
    )
    rec = _record(tmp_path, receiver, charge=charge(record))
    (rec / "out_dir").unlink()
    (rec / "first_started").unlink()
    (rec / "starts").write_text(f"1 {int(time.time()) - 1800}\n")
    rendered = json.loads(_sender(rec, "render").stdout)
    assert re.search(r"duration 0:30:0\d, cost 3\.60 DKK, epochs 3/3", rendered["body"]), rendered
    assert "last loss 0.1235" in rendered["body"]


def test_a_jobs_agent_tells_its_end_once_from_the_record(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A Slurm job's agent (run_agent.py tell, as slurm_job.bash runs it): the spec's
    notify part has no secret; the record's notify.json has the webhooks."""
    from vmrun.runs.launch_spec import LaunchSpec, Watchers
    from vmrun.runs.launch_spec import Notify as Told

    rec = _record(tmp_path, receiver)
    spec = LaunchSpec(
        rec=str(rec),
        workdir=str(tmp_path),
        run_id="r1",
        argv=("t.py",),
        watchers=Watchers(notify=Told()),
    )
    assert TOKEN not in spec.to_json()
    agent = [sys.executable, str(hostside.HERE / "run_agent.py"), "tell", "", "0"]
    for _ in range(2):
        subprocess.run(agent, input=spec.to_json(), text=True, timeout=60, check=True)
    (message,) = receiver.messages()
    assert message["title"] == "vmrun: run r1 done"


def test_a_failure_names_the_worker_that_failed_first(tmp_path: Path, receiver: Receiver) -> None:
    """The record's failure.json (hostside/run_failure.py): the message gives the worker's
    own code and says which rank failed, where."""
    rec = _record(tmp_path, receiver, code="3")
    log = Path(__file__).parent / "fixtures" / "torchrun" / "exit3.log"  # torch 2.13's own
    subprocess.run(
        [sys.executable, str(hostside.HERE / "run_failure.py"), str(rec), str(log), "1"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    assert _sender(rec, "send").returncode == 0
    (message,) = receiver.messages()
    assert "exit 3" in message["message"]
    assert "first to fail: rank 1 on localhost exited with 3" in message["message"]


def test_an_ntfy_server_gets_ntfys_own_form(tmp_path: Path, receiver: Receiver) -> None:
    """ntfy://HOST:PORT/TOPIC (a server of one's own, here a real HTTP server): the message
    as the body, its title in ntfy's Title header, user:password as Basic auth."""
    url = f"ntfy://me:pw@127.0.0.1:{receiver.port}/{TOKEN}"
    rec = _record(tmp_path, receiver, code="2", url=url)
    assert _sender(rec, "send").returncode == 0
    (post,) = receiver.posts
    assert post["path"] == f"/{TOKEN}" and post["headers"]["Title"] == "vmrun: run r1 failed"
    assert post["body"].startswith("run r1 failed (exit 2) on h1")
    assert post["headers"]["Authorization"] == "Basic bWU6cHc="


def test_the_laptop_first_claims_and_the_host_stays_silent(
    tmp_path: Path, receiver: Receiver
) -> None:
    rec = _record(tmp_path, receiver, code="3")
    rendered = json.loads(_sender(rec, "render").stdout)
    assert (rendered["send"], rendered["event"]) == ("all", "fail")
    assert "failed (exit 3)" in rendered["body"]
    assert _sender(rec, "send").returncode == 0 and receiver.posts == []


def test_events_not_wanted_are_not_told(tmp_path: Path, receiver: Receiver) -> None:
    rec = _record(tmp_path, receiver, on=("fail",))
    assert _sender(rec, "send").returncode == 0
    assert json.loads(_sender(rec, "render").stdout)["send"] == "none"
    assert receiver.posts == []


def test_a_receiver_that_is_down_costs_a_bounded_time_and_one_line(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Three tries (1 s, then 2 s apart; shortened here), then one line on stderr (the run's
    log), exit 0: refused connections, and a receiver answering 503; a 4xx answer is a
    refusal, not asked again."""
    receiver.status = 503
    rec = _record(tmp_path / "a", receiver)
    done = _sender(rec, "send")
    assert done.returncode == 0 and len(receiver.posts) == 3
    (line,) = done.stderr.splitlines()
    assert "end notification to json://127.0.0.1/... was not sent: HTTP 503" in line
    assert TOKEN not in line
    receiver.status = 403
    done = _sender(_record(tmp_path / "b", receiver), "send")
    assert "HTTP 403" in done.stderr and len(receiver.posts) == 4
    rec = _record(tmp_path / "c", receiver)
    receiver.close()
    done = _sender(rec, "send")
    assert done.returncode == 0 and "was not sent" in done.stderr


def test_this_machine_sends_through_apprise(receiver: Receiver) -> None:
    pytest.importorskip("apprise")
    sent = send([parse(receiver.url("127.0.0.1"))], "vmrun: test", "hello", "test")
    assert sent.ok and not sent.failed
    (message,) = receiver.messages()
    assert (message["title"], message["message"]) == ("vmrun: test", "hello")


def test_notify_test_says_what_arrived(client: Client, receiver: Receiver) -> None:
    good = client.vmrun("notify", "--test", receiver.url("127.0.0.1"))
    assert good.returncode == 0 and "sent: json://127.0.0.1/..." in good.stdout, good.stderr
    assert len(receiver.posts) == 1
    receiver.status = 500
    bad = client.vmrun("notify", "--test", receiver.url("127.0.0.1"), timeout=60)
    assert bad.returncode == 1 and "notify-failed" in bad.stderr
    assert TOKEN not in bad.stderr + bad.stdout
    wrong = client.vmrun("notify", "--test", "slack://only-one")
    assert wrong.returncode == 2 and "notify-url-bad" in wrong.stderr


# -- on real hosts -----------------------------------------------------------------------


@pytest.fixture
def project(bed: NetnsBed, bed_client: Client, host_python: Path) -> Iterator[Client]:
    (bed_client.cwd / "vmrun.toml").write_text(
        f'[[hosts]]\naddress = "h1"\npython = "{host_python}"\n'
    )
    bed_client.extra_env["OMP_NUM_THREADS"] = "1"
    yield bed_client
    clean_host(bed["h1"])


@pytest.fixture
def bed_receiver(bed: NetnsBed) -> Iterator[Receiver]:
    """The receiver on the hosts' network (the root namespace's address there)."""
    r = Receiver(bed.root_addr)
    yield r
    r.close()


def _settled(host: Any, rid: str) -> None:
    """The run's shell and its sender have ended (nothing of the run is left)."""
    wait_for(lambda: not run_pids(host, rid), 60, "the run's shell and its sender to end")


def test_a_followed_run_is_told_once_with_no_secret_anywhere(
    bed: NetnsBed, project: Client, bed_receiver: Receiver
) -> None:
    url = bed_receiver.url(bed.root_addr)
    done = project.vmrun(
        "train", "-H", "h1", "--epochs", "2", "--save-every", "1", "--notify", url, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    _settled(bed["h1"], rid)
    (message,) = bed_receiver.messages()
    assert message["title"] == f"vmrun: run {rid} done"
    assert "epochs 2/2" in message["message"] and "on h1" in message["message"]
    rec = bed["h1"].home / ".vmrun" / "runs" / rid
    assert TOKEN not in (rec / "run.json").read_text() + (rec / "log").read_text()
    assert TOKEN not in done.stdout + done.stderr
    assert (rec / "notify.json").stat().st_mode & 0o077 == 0


def test_a_failure_is_told_once_with_why(
    bed: NetnsBed, project: Client, bed_receiver: Receiver
) -> None:
    (project.cwd / "fails.py").write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    done = project.vmrun(
        "train",
        "fails.py",
        "-H",
        "h1",
        "--launcher",
        "python",
        "--notify",
        bed_receiver.url(bed.root_addr),
        timeout=300,
    )
    assert done.returncode == 3, done.stderr
    rid = run_id_of(done.stderr)
    _settled(bed["h1"], rid)
    (message,) = bed_receiver.messages()
    assert message["title"] == f"vmrun: run {rid} failed" and message["type"] == "failure"
    assert "exit 3" in message["message"]


def test_the_recorded_code_is_read_while_the_host_still_tells_the_end(
    bed: NetnsBed, project: Client, bed_receiver: Receiver
) -> None:
    """The run's shell writes exit_code, then tells the end; here its post is held, so the
    follower and `status` find that shell alive with the code recorded: both say exit 3
    (they said 1: a live shell counted as a running run), and so does the message."""
    bed_receiver.hold.clear()
    (project.cwd / "fails.py").write_text("import sys\nsys.exit(3)\n")
    done = project.vmrun(
        "train",
        "fails.py",
        "-H",
        "h1",
        "--launcher",
        "python",
        "--notify",
        bed_receiver.url(bed.root_addr),
        timeout=300,
    )
    rid = run_id_of(done.stderr)
    try:
        assert done.returncode == 3, done.stderr
        assert f"run {rid} exited with 3" in done.stderr
        status = project.vmrun("status", "-H", "h1", "--json", timeout=120)
        assert bed_receiver.posts and run_pids(bed["h1"], rid), "the sender was not held"
        (row,) = [r for r in json.loads(status.stdout) if r["run"] == rid]
        assert (row["state"], row["exit"]) == ("failed", 3), row
    finally:
        bed_receiver.hold.set()
    _settled(bed["h1"], rid)
    assert {p["body"] for p in bed_receiver.posts} == {bed_receiver.posts[0]["body"]}
    assert "exit 3" in bed_receiver.messages()[0]["message"]


def test_the_host_tells_the_end_when_the_laptop_is_gone(
    bed: NetnsBed, project: Client, bed_receiver: Receiver
) -> None:
    """vmrun following the run is killed (the laptop closed): the run goes on and its
    host tells its end, once; no process on the host ever had the URL on its command line."""
    flag = bed["h1"].home / "go-on"
    (project.cwd / "waits.py").write_text(
        "import pathlib, time\nprint('waiting', flush=True)\n"
        f"while not pathlib.Path({str(flag)!r}).exists():\n    time.sleep(0.2)\n"
    )
    follower = project.popen(
        "train",
        "waits.py",
        "-H",
        "h1",
        "--launcher",
        "python",
        "--notify",
        bed_receiver.url(bed.root_addr),
    )
    try:
        assert follower.stdout is not None
        for _, line in zip(range(200), follower.stdout, strict=False):  # the run's first line
            if "waiting" in line:
                break
        rids = [p.name for p in (bed["h1"].home / ".vmrun" / "runs").iterdir() if p.is_dir()]
        assert len(rids) == 1
        for pid in bed["h1"].user_pids():
            try:
                assert TOKEN.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
        os.kill(follower.pid, signal.SIGKILL)
        follower.wait(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    flag.touch()
    wait_for(lambda: len(bed_receiver.posts) >= 1, 60, "the host's message")
    _settled(bed["h1"], rids[0])
    (message,) = bed_receiver.messages()
    assert message["title"] == f"vmrun: run {rids[0]} done"


def test_a_receiver_down_does_not_hold_the_run(bed: NetnsBed, project: Client) -> None:
    """Nothing listens at the URL: the run ends as it would, and its log says in one line
    that the message was not sent."""
    down = Receiver(bed.root_addr)
    url = down.url(bed.root_addr)
    down.close()
    started = time.monotonic()
    done = project.vmrun(
        "train", "-H", "h1", "--epochs", "1", "--save-every", "1", "--notify", url, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rid = run_id_of(done.stderr)
    _settled(bed["h1"], rid)
    assert time.monotonic() - started < 120
    log = (bed["h1"].home / ".vmrun" / "runs" / rid / "log").read_text()
    said = [ln for ln in log.splitlines() if "notification" in ln]
    laptop = [ln for ln in done.stderr.splitlines() if "notification" in ln]
    assert len(said) + len(laptop) == 1, (said, laptop)
    assert TOKEN not in log + done.stderr


# -- on the bed's Slurm ------------------------------------------------------------------


@pytest.fixture
def slurm_receiver(slurm_cluster: Any) -> Iterator[Receiver]:
    """The receiver on the cluster's network, where its compute nodes post."""
    r = Receiver(slurm_cluster.bed.root_addr)
    yield r
    r.close()


def _cluster_toml(client: Client, python: Path) -> None:
    (client.cwd / "vmrun.toml").write_text(
        '[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'python = "{python}"\nenv = {{ OMP_NUM_THREADS = "1" }}\n'
    )


def test_a_detached_slurm_job_tells_its_own_end(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, slurm_receiver: Receiver
) -> None:
    """`train -C --detach`: nothing of vmrun follows the job; its batch script tells the
    end from the compute node, once; the URL is nowhere in the job's script or log."""
    _cluster_toml(slurm_client, host_python)
    url = slurm_receiver.url(slurm_cluster.bed.root_addr)
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--epochs",
        "1",
        "--save-every",
        "1",
        "--detach",
        "--notify",
        url,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rid = done.stderr.split("run ", 1)[1].split()[0]
    wait_for(lambda: slurm_receiver.posts, 180, "the job's own message")
    wait_for(lambda: not slurm_cluster.squeue_ids(), 60, "the job to leave the queue")
    (message,) = slurm_receiver.messages()
    assert message["title"] == f"vmrun: run {rid} done"
    assert "on cluster bed" in message["message"] and "epochs 1/1" in message["message"]
    rec = Path(slurm_cluster.login.home) / ".vmrun" / "runs" / rid
    assert TOKEN not in (rec / "job.sh").read_text() + (rec / "job.log").read_text()
    assert (rec / "notify.json").stat().st_mode & 0o077 == 0


def test_a_followed_slurm_run_and_a_submitted_script_are_told_once(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, slurm_receiver: Receiver
) -> None:
    """`train -C` followed: one message (the job's sender or the follower, whichever
    claimed it). `submit` of the user's own script, which vmrun does not change: the
    follower tells its failure, with the failing task."""
    _cluster_toml(slurm_client, host_python)
    url = slurm_receiver.url(slurm_cluster.bed.root_addr)
    done = slurm_client.vmrun(
        "train", "-C", "bed", "--epochs", "1", "--save-every", "1", "--notify", url, timeout=300
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not slurm_cluster.squeue_ids(), 60, "the job to leave the queue")
    assert [m["type"] for m in slurm_receiver.messages()] == ["success"]
    (slurm_client.cwd / "fails.sh").write_text("#!/bin/bash\necho failing\nexit 4\n")
    failed = slurm_client.vmrun("submit", "fails.sh", "-C", "bed", "--notify", url, timeout=300)
    assert failed.returncode == 4, failed.stderr
    wait_for(lambda: len(slurm_receiver.posts) == 2, 30, "the failure's message")
    message = slurm_receiver.messages()[1]
    assert message["type"] == "failure" and "exit 4" in message["message"]
    assert "why: " in message["message"]
    # detached and never followed: `status`, seeing it end first, has the login node tell it
    detached = slurm_client.vmrun("submit", "fails.sh", "-C", "bed", "--detach", "--notify", url)
    assert detached.returncode == 0, detached.stderr
    rid = detached.stderr.split("run ", 1)[1].split()[0]

    def ended() -> bool:
        listed = json.loads(slurm_client.vmrun("status", "-C", "bed", "--json").stdout)
        return any(o["run"] == rid and o["state"] == "failed" for o in listed)

    wait_for(ended, 60, "status to see the job fail")
    wait_for(lambda: len(slurm_receiver.posts) == 3, 30, "the login node's message")
    third = slurm_receiver.messages()[2]
    assert third["title"] == f"vmrun: run {rid} failed" and "exit 4" in third["message"]
    slurm_client.vmrun("status", "-C", "bed")  # told once: a later listing tells nothing more
    assert len(slurm_receiver.posts) == 3


def test_a_requeue_and_the_end_are_told_once_each(
    slurm_cluster: Any,
    slurm_client: Client,
    host_python: Path,
    trainer_hooks: Path,
    slurm_receiver: Receiver,
) -> None:
    """`--notify-on all`: the warning signal makes the template save, the batch script
    requeues the job and tells it; the second attempt finishes and tells its end: two
    messages, from the node, nothing following the job."""
    from train_helpers import hook_env

    env = {"OMP_NUM_THREADS": "1", **hook_env(trainer_hooks, EPOCH_DELAY="0.5")}
    extra = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    (slurm_client.cwd / "vmrun.toml").write_text(
        '[[clusters]]\nname = "bed"\nlogin = "login"\npartition = "debug"\n'
        f'python = "{host_python}"\nenv = {{ {extra} }}\n'
    )
    url = slurm_receiver.url(slurm_cluster.bed.root_addr)
    done = slurm_client.vmrun(
        "train",
        "-C",
        "bed",
        "--epochs",
        "8",
        "--save-every",
        "100",
        "--detach",
        "--notify",
        url,
        "--notify-on",
        "all",
    )
    assert done.returncode == 0, done.stderr
    rid = done.stderr.split("run ", 1)[1].split()[0]
    job = done.stderr.split(" as job ", 1)[1].split()[0]
    metrics = slurm_cluster.login.home / ".vmrun" / "runs" / rid
    out = json.loads((metrics / "run.json").read_text())["out_dir"]
    wait_for(lambda: Path(out, "metrics.jsonl").exists(), 120, "a first epoch")
    signalled = slurm_cluster.run_on_login(["scancel", "--signal=USR2", job])
    assert signalled.returncode == 0, signalled.stderr
    wait_for(lambda: len(slurm_receiver.posts) >= 2, 240, "the requeue's and the end's messages")
    wait_for(lambda: not slurm_cluster.squeue_ids(), 60, "the job to leave the queue")
    titles = [m["title"] for m in slurm_receiver.messages()]
    assert titles == [f"vmrun: run {rid} requeued", f"vmrun: run {rid} done"], titles


def test_a_submitted_scripts_own_recovery_tells_its_requeue(
    slurm_cluster: Any, slurm_client: Client, host_python: Path, slurm_receiver: Receiver
) -> None:
    """`submit --recover --detach`: the job's copy of the user's script brings the job back
    after a failure and tells the requeue itself, from the node (its agent's `tell`, from
    the launch spec in the copy), nothing of vmrun following it; no webhook in the copy."""
    from test_cli_slurm import run_id_of as submitted_id
    from test_cli_slurm import use_cluster

    use_cluster(slurm_client, host_python)
    (slurm_client.cwd / "again.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --output=again-%j.out\n\n"
        '"$1" fails_times.py "$2" 1\n'
    )
    url = slurm_receiver.url(slurm_cluster.bed.root_addr)
    times = slurm_cluster.shared / "told-times"
    done = slurm_client.vmrun(
        "submit",
        "again.sh",
        "-C",
        "bed",
        "--recover",
        "--detach",
        "--notify",
        url,
        "--notify-on",
        "all",
        "--",
        str(host_python),
        str(times),
    )
    assert done.returncode == 0, done.stderr
    rid = submitted_id(done.stderr)
    wait_for(lambda: slurm_receiver.posts, 180, "the requeue's message")
    wait_for(lambda: not slurm_cluster.squeue_ids(), 120, "the job to leave the queue")
    assert slurm_receiver.messages()[0]["title"] == f"vmrun: run {rid} requeued"
    ran = (slurm_cluster.login.home / ".vmrun" / "runs" / rid / "batch.sh").read_text()
    assert "VMRUN_LAUNCH=" in ran and TOKEN not in ran and url not in ran


def test_a_local_run_is_told_from_here(client: Client, receiver: Receiver) -> None:
    done = client.vmrun(
        "train",
        "--local",
        "--epochs",
        "1",
        "--save-every",
        "1",
        "--nproc-per-node",
        "1",
        "--notify",
        receiver.url("127.0.0.1"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (message,) = receiver.messages()
    assert message["title"].startswith("vmrun: run template-") and message["title"].endswith(
        " done"
    )
    assert "(--local)" in message["message"] and "epochs 1," in message["message"]
