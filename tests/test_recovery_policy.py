"""What a run's supervisor decides when the run fails (vmrun.recovery.policy), and what it
keeps of it (vmrun.recovery.journal), quick: a crash on nodes that answer is run again
there, a lost node takes a spare, a lost master needs the bucket, the same failure at the
same epoch three times is a crash loop, and the recoveries end at --max-recoveries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vmrun.errors import UsageError
from vmrun.operations import refusals
from vmrun.recovery.journal import Event, Journal, Spec, failures_of
from vmrun.recovery.policy import Failure, decide

NODES = ("h1", "h2")


def test_a_crash_where_every_node_answers_runs_again_there() -> None:
    got = decide(Failure(NODES, exit_code=3, where="rank 1 on h2", epoch=4), [], ["s1"])
    assert got.action == "restart" and got.nodes == NODES and not got.swap


def test_a_lost_node_takes_a_spare_and_keeps_its_place() -> None:
    got = decide(Failure(NODES, lost=("h2",), epoch=4), [], ["h2", "s1", "s2"])
    assert got.action == "replace" and got.swap == {"h2": "s1"} and got.nodes == ("h1", "s1")


def test_a_lost_master_needs_the_bucket_and_a_lost_node_a_spare() -> None:
    lost_master = Failure(NODES, lost=("h1",), epoch=4)
    assert decide(lost_master, [], ["s1"]).gives_up
    moved = decide(lost_master, [], ["s1"], has_store=True)
    assert moved.nodes == ("s1", "h2")  # the spare is the new master
    none_left = decide(Failure(NODES, lost=("h2",)), [], [])
    assert none_left.gives_up and "no spare" in none_left.why


def test_a_node_silent_for_a_while_that_answers_again_runs_again_on_the_same_nodes() -> None:
    """A blip: h2 was found silent (the others stopped by vmrun for it, exit 143), then
    answered again before the supervisor looked: the same nodes, the spare kept for a node
    that stays gone; the same blip again and again without progress is a crash loop."""
    blip = Failure(NODES, exit_code=143, epoch=4, returned=("h2",))
    got = decide(blip, [], ["s1"])
    assert got.action == "restart" and got.nodes == NODES and not got.swap, got
    assert got.why.startswith("h2 stopped answering, then answered again")
    assert decide(blip, [blip, blip], ["s1"]).gives_up
    assert not decide(
        blip, [Failure(NODES, exit_code=143, epoch=2, returned=("h2",))] * 2, ["s1"]
    ).gives_up  # it got further each time
    still = decide(Failure(NODES, lost=("h2",), epoch=4, returned=()), [], ["s1"])
    assert still.swap == {"h2": "s1"}  # silent and still silent: lost, a spare takes it


def test_only_the_users_stop_or_the_runs_budget_ends_a_supervised_run() -> None:
    """run_list.sh says who stopped a run (run_stop.sh's WHY): the follower's own stop of
    the other nodes after a failure is not the user's, however the failed node answers."""
    from vmrun.backends.hosts.records import parse_listing

    def listed(stopped: str) -> bool:
        text = f"NOW 100\nRUN r1\nEXIT 143\nENDED 90\n{stopped}\nALIVE 0\n"
        (rec,) = parse_listing(text, "h1")
        return rec.meant_to_end

    assert listed("STOPPED 90 user") and listed("STOPPED 90 budget")
    assert listed("STOPPED 90 ")  # an older vmrun's stop, reason unrecorded: as before
    for vmrun_own in ("failure", "start", "resume", "replaced"):
        assert not listed(f"STOPPED 90 {vmrun_own}"), vmrun_own


def _listing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, listing: dict[str, str]) -> None:
    """The supervisor's look at the nodes (supervise._failure) on tests/fake_group.py's hosts,
    each answering run_list.sh's `listing` of it."""
    from fake_group import FakeGroup

    from vmrun.backends.hosts import records

    def listed(conn: Any, ids: object = ()) -> list[Any]:
        return records.parse_listing(listing[conn.label], conn.label)

    monkeypatch.setattr("vmrun.ssh.group.Group", lambda nodes, settings: FakeGroup(nodes, tmp_path))
    monkeypatch.setattr("vmrun.ssh.inventory.select_hosts", lambda nodes, settings: list(nodes))
    monkeypatch.setattr(records, "list_runs", listed)


def test_the_supervisor_takes_a_followers_stop_after_a_blip_for_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blip as the supervisor met it: h2 silent, its follower stopped h1 (`failure`),
    then h2 answered again. What it finds is a failure to bring back, not the user's stop,
    and h2 is named as back."""
    from vmrun.operations import supervise

    listing = {
        "h1": "NOW 100\nRUN r1\nEXIT 143\nENDED 90\nSTOPPED 90 failure\nALIVE 0\n",
        "h2": "NOW 100\nRUN r1\nALIVE 1\n",
    }

    _listing(monkeypatch, tmp_path, listing)
    got = supervise._failure("r1", ["h1", "h2"], object(), silent="h2")  # type: ignore[arg-type]
    assert not got.stopped and got.returned == ("h2",) and not got.lost, got
    assert decide(got, [], []).action == "restart"


def test_a_node_with_a_spot_notice_is_moved_off_though_it_still_answers() -> None:
    """The run stopped after its snapshot because h2 goes soon: a spare takes h2's place
    (not a restart on the node about to vanish); the master noticed moves with the bucket."""
    noticed = Failure(NODES, exit_code=75, epoch=6, noticed=("h2",))
    got = decide(noticed, [], ["s1"], has_store=True)
    assert got.action == "replace" and got.swap == {"h2": "s1"}, got
    assert got.why.startswith("spot notice on h2")
    master = decide(Failure(NODES, exit_code=75, epoch=6, noticed=("h1",)), [], ["s1"])
    assert master.gives_up and "no --store" in master.why
    assert decide(noticed, [], []).gives_up  # nowhere to go


def test_a_lost_vm_of_an_up_cluster_gets_a_new_one_once_the_spares_are_spent() -> None:
    lost = Failure(("c-0", "c-1", "c-2"), lost=("c-1", "c-2"), epoch=4)
    got = decide(lost, [], ["s1"], renewable=["c-0", "c-1", "c-2"])
    assert got.swap == {"c-1": "s1", "c-2": "c-2"} and got.renew == ("c-2",), got
    assert got.nodes == ("c-0", "s1", "c-2") and "c-2 by a new VM" in got.why
    master = decide(Failure(("c-0", "c-1"), lost=("c-0",)), [], [], renewable=["c-0", "c-1"])
    assert master.gives_up  # its snapshots went with it: no --store
    stored = decide(
        Failure(("c-0", "c-1"), lost=("c-0",)), [], [], has_store=True, renewable=["c-0", "c-1"]
    )
    assert stored.renew == ("c-0",) and stored.nodes == ("c-0", "c-1")
    assert decide(Failure(("h1", "h2"), lost=("h2",)), [], [], renewable=["c-0"]).gives_up


def test_the_epochs_redone_are_those_past_the_newest_snapshot() -> None:
    assert Failure(NODES, exit_code=3, epoch=5, reached=9).redone == 4
    assert Failure(NODES, exit_code=75, epoch=9, reached=9, noticed=("h2",)).redone == 0
    assert Failure(NODES, lost=("h2",), reached=2).redone == 2  # no snapshot yet
    assert Failure(NODES, lost=("h2",)).redone is None


def test_the_same_failure_at_the_same_epoch_three_times_is_a_crash_loop() -> None:
    crash = Failure(NODES, exit_code=3, where="rank 0", epoch=2)
    assert decide(crash, [crash], []).action == "restart"
    looped = decide(crash, [crash, crash], [])
    assert looped.gives_up and "crash loop" in looped.why
    further = Failure(NODES, exit_code=3, where="rank 0", epoch=5)  # it got further
    assert decide(further, [crash, crash], []).action == "restart"


def test_the_recoveries_end_at_the_limit() -> None:
    earlier = [Failure(NODES, exit_code=1, epoch=n) for n in range(3)]
    got = decide(Failure(NODES, exit_code=1, epoch=9), earlier, [], max_recoveries=3)
    assert got.gives_up and "--max-recoveries" in got.why


def test_what_was_done_is_read_back_after_a_restart(tmp_path: Path) -> None:
    spec = Spec(run_id="r1", nodes=["h1", "h2"], spares=["s1"], store="s3://bkt/runs")
    spec.save(tmp_path / "spec.json")
    assert Spec.load(tmp_path / "spec.json") == spec
    journal = Journal(tmp_path / "events.jsonl")
    failure = {"nodes": ["h1", "h2"], "lost": ["h2"], "exit_code": None, "where": "", "epoch": 4}
    journal.add(Event(1.0, failure, "replace", "lost h2", ["h1", "s1"], {"h2": "s1"}))
    (back,) = Journal(tmp_path / "events.jsonl").events()
    assert back.nodes == ["h1", "s1"] and back.swap == {"h2": "s1"}
    assert failures_of([back]) == [Failure(("h1", "h2"), ("h2",), None, "", 4)]


@pytest.mark.parametrize(
    ("flags", "code"),
    [
        ({"--spare": ["s1"]}, "flags-conflict"),  # without --recover
        ({"--recover": True, "--local": True}, "flags-conflict"),
        ({"--recover": True, "--resume": "r1"}, "resume-conflict"),
        ({"--recover": True, "--spare": ["s1"], "-C": "della"}, "flags-conflict"),
        ({"--recover": True, "--supervisor": "w", "-C": "della"}, "flags-conflict"),
    ],
)
def test_recover_flags_that_do_not_go_together_are_refused(flags: dict, code: str) -> None:
    with pytest.raises(UsageError) as caught:
        refusals.check("train", flags)
    assert caught.value.code == code


def test_a_cluster_run_may_recover_within_a_limit() -> None:
    """Slurm picks the nodes (no --spare, no --supervisor); the job brings itself back."""
    refusals.check("train", {"--recover": True, "--max-recoveries": 2, "-C": "della"})
    with pytest.raises(UsageError) as caught:  # submit's limit is --recover's too
        refusals.check("submit", {"--recover": False, "--max-recoveries": 2})
    assert caught.value.code == "flags-conflict" and "--recover" in caught.value.message


def test_a_limit_of_zero_is_refused_not_taken_for_the_default() -> None:
    assert refusals.recovery_limit(None, 5) == 5 and refusals.recovery_limit(2, 5) == 2
    with pytest.raises(UsageError) as caught:
        refusals.recovery_limit(0, 5)
    assert caught.value.code == "flags-conflict" and "got 0" in caught.value.message


def test_each_recovery_and_giving_up_is_told_once_where_failures_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vmrun.notify.send as sending
    from vmrun.config import load_settings
    from vmrun.operations import supervise
    from vmrun.reporting import Recorder

    told: list[tuple[str, str]] = []

    def send(targets: object, title: str, body: str, event: str = "end") -> sending.Sent:
        told.append((title, event))
        return sending.Sent()

    monkeypatch.setattr(sending, "send", send)
    home = {"HOME": str(tmp_path)}
    url = ["json://127.0.0.1:9/hook"]
    settings = load_settings({"notify": url}, cwd=tmp_path, environ=home)
    supervise._tell(settings, "r1", "requeue", "recovered (recovery 1 of 5)", ["h1"], Recorder())
    supervise._tell(settings, "r1", "fail", "failed: a crash loop", ["h1"], Recorder())
    assert told == [
        ("vmrun: run r1 recovered (recovery 1 of 5)", "requeue"),
        ("vmrun: run r1 failed: a crash loop", "fail"),
    ]
    ends_only = load_settings({"notify": url, "notify_on": ["end"]}, cwd=tmp_path, environ=home)
    supervise._tell(ends_only, "r1", "requeue", "recovered", ["h1"], Recorder())
    assert len(told) == 2


def test_recover_without_a_bucket_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from vmrun.config import load_settings
    from vmrun.recovery.deploy import Supervised
    from vmrun.runs.plan import make_plan

    (tmp_path / "vmrun.toml").write_text("recover = true\nmax_recoveries = 3\n")
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert settings.recover and settings.max_recoveries == 3
    plan = make_plan(
        script=None,
        user_args=None,
        epochs=2,
        save_every=1,
        nproc_per_node=None,
        max_restarts=0,
        env=None,
        name=None,
        batch_size=None,
        lr=None,
        launcher="torchrun",
    )
    with pytest.raises(UsageError) as caught:
        Supervised.check(plan, [], settings)
    assert caught.value.code == "flags-conflict" and "--store" in (caught.value.hint or "")


def test_a_report_row_says_what_the_supervisor_did(tmp_path: Path) -> None:
    from vmrun.results.history import load_runs
    from vmrun.results.report import report_rows, rows_json, table

    run = tmp_path / "results" / "r1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"epoch": 1, "loss": 1.0}\n{"epoch": 2, "loss": 0.5}\n')
    plain = tmp_path / "results" / "r2"
    plain.mkdir()
    (plain / "metrics.jsonl").write_text('{"epoch": 1, "loss": 1.0}\n')
    facts = {"downtime_s": 21.4, "epochs_redone": 3, "swap": {"h2": "s1"}, "action": "replace"}
    (run / "recoveries").write_text(
        "recovery\t100\trecovery 1 of 5: lost h2: replaced h2 by s1 (21 s down)\t"
        + json.dumps(facts)
        + "\n"
        "recovery\t200\trecovery 2 of 5: exit 3: again on the same nodes\n"  # an older line
    )
    rows = report_rows(load_runs([run, plain]))
    first, second = rows[0].recoveries or []
    assert first["text"].startswith("recovery 1 of 5: lost h2") and first["at"] == 100
    assert (first["downtime_s"], first["epochs_redone"], first["swap"]) == (21.4, 3, {"h2": "s1"})
    assert second["downtime_s"] is None and second["kind"] == "recovery"
    assert rows[1].recoveries is None
    assert [r["recoveries"] for r in json.loads(rows_json(rows))] == [rows[0].recoveries, None]
    heads, _, shown = table(rows)
    assert heads[-1] == "RECOVERIES" and shown[0][-1] == "2 (21.4 s down, 3 redone)"
    assert shown[1][-1] == ""
    assert table([rows[1]])[0][-1] == "FINAL ACC"  # no column where no run had one


def test_the_runs_env_goes_with_each_resume_and_a_refused_resume_gives_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--env values are never recorded, so a resume needs them again: the supervisor gets
    them with its secrets and passes them; a resume refused outright (bad input) is not
    asked again and again: one gave-up line with why."""
    from vmrun.config import load_settings
    from vmrun.operations import supervise
    from vmrun.operations import train as training
    from vmrun.recovery.deploy import RUN_ENV, run_env
    from vmrun.reporting import Recorder

    state = tmp_path / "state"
    state.mkdir()
    Spec(run_id="r1", nodes=["h1"], store="s3://b/runs").save(state / "spec.json")
    monkeypatch.setenv(RUN_ENV, run_env({"A": "x y", "B": "=="}))
    failures = iter(
        [Failure(("h1",), exit_code=3, epoch=1), Failure(("h1",), exit_code=3, epoch=2)]
    )
    monkeypatch.setattr(supervise, "_follow", lambda *args: next(failures))
    asked: list[list[str] | None] = []

    def train(options: training.RunOptions, settings: object, **kw: object) -> int:
        asked.append(options.env)
        if len(asked) > 1:
            raise UsageError("run r1 is busy on h1", code="host-busy")
        return 0

    monkeypatch.setattr(training, "train", train)
    notes: list[tuple[str, str, dict[str, Any] | None]] = []
    monkeypatch.setattr(
        supervise,
        "_note",
        lambda r, n, s, kind, text, facts=None: notes.append((kind, text, facts)),
    )
    monkeypatch.setattr(supervise, "_tell", lambda *args: None)
    monkeypatch.setattr(supervise, "_finish", lambda st, sp, se, nodes, out, code: code)
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert supervise.supervise(state, settings, Recorder()) == 1
    assert asked == [["A=x y", "B==="], ["A=x y", "B==="]]  # once each: refused is final
    # each recovery is said under way first (`status`: recovering), then done or given up
    assert [kind for kind, _, _ in notes] == ["recovering", "recovery", "recovering", "gave-up"]
    assert notes[0][1].startswith("1 of 5: exit 3")
    assert "its resume was refused (run r1 is busy on h1" in notes[-1][1]
    facts = notes[1][2]  # the first recovery's cost: its failure had no time or epoch reached
    assert facts is not None and facts["epochs_redone"] is None and facts["action"] == "restart"


def test_a_lost_vm_of_an_up_cluster_is_made_again_before_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spare: the supervisor has the cloud make a new VM in the lost one's place (its
    own key allowed there), reads the settings again, and resumes with the node renamed to
    itself (the new VM gets the snapshot as a spare would)."""
    from vmrun.config import load_settings
    from vmrun.operations import cloud, supervise
    from vmrun.operations import train as training
    from vmrun.reporting import Recorder

    state = tmp_path / "state"
    state.mkdir()
    (state / "id_ed25519.pub").write_text("ssh-ed25519 AAAAkey vmrun-supervisor:r1\n")
    spec = Spec(
        run_id="r1",
        nodes=["c-0", "c-1"],
        store="s3://b/runs",
        cluster="c",
        renewable=["c-0", "c-1"],
    )
    spec.save(state / "spec.json")
    failures = iter([Failure(("c-0", "c-1"), lost=("c-1",), epoch=3, reached=4), None])
    monkeypatch.setattr(supervise, "_follow", lambda *args: next(failures))
    made: list[tuple[str, str, tuple[str, ...]]] = []

    def replace_node(
        settings: object, name: str, label: str, out: object, *, extra_keys: tuple[str, ...] = ()
    ) -> object:
        made.append((name, label, extra_keys))

        class Made:
            new_instance, old_instance, address = "i-new", "i-old", "203.0.113.9"

        return Made()

    resumed: list[training.HostOptions] = []

    def train(
        options: object, settings: object, *, hosts: training.HostOptions, **kw: object
    ) -> int:
        resumed.append(hosts)
        return 0

    set_up: list[str] = []
    monkeypatch.setattr(cloud, "replace_node", replace_node)
    monkeypatch.setattr(
        supervise, "_set_up", lambda settings, spec, label, out: set_up.append(label)
    )
    confirmed: list[tuple[str, ...]] = []
    monkeypatch.setattr(supervise, "_confirm_lost", lambda sp, labels, se: confirmed.append(labels))
    monkeypatch.setattr(training, "train", train)
    monkeypatch.setattr(supervise, "_note", lambda *args: None)
    monkeypatch.setattr(supervise, "_tell", lambda *args: None)
    monkeypatch.setattr(supervise, "_finish", lambda st, sp, se, nodes, out, code: code)
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert supervise.supervise(state, settings, Recorder()) == 0
    assert made == [("c", "c-1", ("ssh-ed25519 AAAAkey vmrun-supervisor:r1",))]
    assert set_up == ["c-1"] and confirmed == [("c-1",)]  # asked again, set up, resumed
    (hosts,) = resumed
    assert hosts.hosts == ["c-0", "c-1"] and hosts.replace == {"c-1": "c-1"}
    assert not hosts.from_store  # the master answers: it gives the new VM the snapshot
    (event,) = Journal(state / "events.jsonl").events()
    assert event.action == "replace" and "c-1 by a new VM" in event.why


def test_the_supervisors_settings_keep_the_cluster_it_may_make_vms_of() -> None:
    from vmrun.config import tomllib
    from vmrun.recovery.deploy import Reached, supervisor_toml

    spec = Spec(run_id="r1", nodes=["c-0"], store="s3://b/runs", cluster="c", renewable=["c-0"])
    node = Reached(
        "c-0",
        "203.0.113.7",
        22,
        "ubuntu",
        "203.0.113.7",
        {},
        {"groups": ["c"], "instance": "i-1", "python": "/p"},
    )
    spare = Reached("s1", "10.0.0.5", 22, "me", "10.0.0.5", {}, {})
    table = {"name": "c", "cloud": "aws", "type": "g4dn.xlarge", "profile": "lab"}
    doc = tomllib.loads(supervisor_toml(spec, [node, spare], table))
    assert doc["clouds"] == [{"name": "c", "cloud": "aws", "type": "g4dn.xlarge"}]  # no profile
    first, second = doc["hosts"]
    assert first["groups"] == ["c"] and first["instance"] == "i-1" and "groups" not in second
    assert "clouds" not in tomllib.loads(supervisor_toml(spec, [node], None))


def test_setup_on_a_clusters_vms_keeps_what_a_new_vm_is_set_up_with(tmp_path: Path) -> None:
    """`vmrun setup @c` keeps its request in c's [[clouds]] table (what the supervisor
    replays on a new VM); one that needs this machine's files is not kept."""
    from vmrun.config import load_settings
    from vmrun.operations.setup import SetupRequest, _record_for_clusters, replay, replayable
    from vmrun.ssh.inventory import project_hosts

    (tmp_path / "vmrun.toml").write_text(
        '[[clouds]]\nname = "c"\ncloud = "aws"\ntype = "g4dn.xlarge"\n\n'
        '[[hosts]]\nname = "c-0"\naddress = "ubuntu@203.0.113.7"\ngroups = ["c"]\n'
        'instance = "i-1"\n\n[[hosts]]\naddress = "me@lab1"\n'
    )
    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    asked = SetupRequest(python="/usr/bin/python3.11", torch="2.13.0", params=["pip=einops"])
    _record_for_clusters(settings, tmp_path, asked, project_hosts(settings))
    again = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    (table,) = again.project_data["clouds"]
    assert table["setup"] == {
        "python": "/usr/bin/python3.11",
        "torch": "2.13.0",
        "params": ["pip=einops"],
    }
    assert replay(table["setup"]).torch == "2.13.0"
    assert replayable(SetupRequest(playbook=tmp_path / "mine.yaml")) is None


def test_recover_puts_a_fit_spare_in_place_of_a_node_whose_gpu_is_unfit() -> None:
    """--recover: the unfit node (its GPU health check fails) is replaced by the first fit
    spare, in its place in the node order; with no fit spare left it stays (the run's
    preflight then refuses it by name)."""
    from pathlib import Path

    from vmrun.config import load_settings
    from vmrun.operations.train import swap_unfit
    from vmrun.reporting import Recorder
    from vmrun.ssh.hosts import parse_host
    from vmrun.ssh.inventory import HostEntry

    settings = load_settings({}, cwd=Path("/"), environ={"HOME": "/nonexistent"})
    entries = [HostEntry(parse_host(h)) for h in ("u@a", "u@b", "u@c")]
    sick = {
        "u@a": "GPU 0000:07:00: a row remapping is pending",
        "u@s1": "GPU x: Xid 79",
        "u@c": "GPU 0000:19:00: 3 uncorrectable ECC error(s)",
    }
    said = Recorder()
    nodes, left = swap_unfit(
        entries, ["u@s1", "u@s2", "u@s3"], settings, said, unfit=lambda e: sick.get(e.label, "")
    )
    assert [n.label for n in nodes] == ["u@s2", "u@b", "u@s3"]
    assert left == ["u@s1"]  # the unfit spare is no help, and stays a spare
    assert [t for _, t in said.said] == [
        "u@a: GPU 0000:07:00: a row remapping is pending; --recover puts the spare u@s2 in its"
        " place",
        "u@c: GPU 0000:19:00: 3 uncorrectable ECC error(s); --recover puts the spare u@s3 in its"
        " place",
    ]
    nodes, left = swap_unfit(
        entries, ["u@s1"], settings, Recorder(), unfit=lambda e: sick.get(e.label, "")
    )
    assert [n.label for n in nodes] == ["u@a", "u@b", "u@c"] and left == ["u@s1"]


def test_the_supervisors_host_is_prepared_beside_the_staging_and_its_failure_told_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Ahead` runs `prepare` in a thread of its own (the run's staging goes on meanwhile);
    `wait` gives what it made, or raises its failure in the caller's thread."""
    import threading

    from vmrun.config import load_settings
    from vmrun.errors import RemoteError
    from vmrun.recovery import deploy
    from vmrun.ssh.hosts import parse_host
    from vmrun.ssh.inventory import HostEntry

    settings = load_settings({}, cwd=tmp_path, environ={"HOME": str(tmp_path)})
    entry = HostEntry(parse_host("u@192.0.2.1"), vars={"python": "/opt/py/bin/python3"})
    release, seen = threading.Event(), []

    def prepare(conn: Any, python: str, *, store: bool, tools: bool) -> deploy.Prepared:
        seen.append((threading.current_thread().name, python, store, tools))
        assert release.wait(10)
        if tools:
            raise RemoteError("could not send py-spy's wheel", code="supervisor-failed")
        return deploy.Prepared("/home/u", ".vmrun/supervisor/env-1", "code/1", made=5)

    monkeypatch.setattr(deploy, "prepare", prepare)
    ahead = deploy.Ahead(settings, entry, store=True, tools=False)
    failing = deploy.Ahead(settings, entry, store=True, tools=True)
    release.set()  # the caller went on while both were held
    assert ahead.wait().made == 5
    with pytest.raises(RemoteError) as caught:
        failing.wait()
    assert caught.value.code == "supervisor-failed"
    assert sorted(seen) == [
        ("supervisor-prepare", "/opt/py/bin/python3", True, False),
        ("supervisor-prepare", "/opt/py/bin/python3", True, True),
    ]


def test_the_supervisor_follows_every_node_or_names_the_one_it_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that did not answer when the follow began was left unfollowed, and its later
    loss went unseen: every node is asked again within the silence rule, and one still
    missing is a failure naming it, never a run followed on its master alone."""
    from types import SimpleNamespace

    from vmrun.errors import RemoteError
    from vmrun.operations import supervise

    settings = SimpleNamespace(keepalive_interval=0.01, keepalive_count_max=3)
    answers = iter([(("h1",), {"h2": OSError()}), (("h1", "h2"), {})])

    class _Backend:
        def __init__(self, answers: Any) -> None:
            self.answers, self.asked = answers, 0

        def find(self, rid: str) -> Any:
            self.asked += 1
            nodes, unreached = next(self.answers)
            return SimpleNamespace(nodes=nodes, unreached=unreached)

    late = _Backend(answers)
    ref = supervise._found_everywhere(late, "r1", ["h1", "h2"], settings)  # type: ignore[arg-type]
    assert ref.nodes == ("h1", "h2") and late.asked == 2
    never = _Backend(iter([(("h1",), {"h2": OSError()})] * 100))
    with pytest.raises(RemoteError) as info:
        supervise._found_everywhere(never, "r1", ["h1", "h2"], settings)  # type: ignore[arg-type]
    assert info.value.host == "h2" and "did not answer" in info.value.message
    assert never.asked >= 2


def test_a_follow_that_lost_only_its_streams_is_followed_again_and_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's own network blipped (every stream lost) while the run still runs
    on every node: no recovery is decided, journaled or counted; it follows again."""
    from vmrun.config import load_settings
    from vmrun.operations import supervise
    from vmrun.reporting import Recorder

    alive = "NOW 100\nRUN r1\nBEGAN 50\nALIVE 1\n"

    _listing(monkeypatch, tmp_path, {"h1": alive, "h2": alive})
    found = supervise._failure("r1", ["h1", "h2"], object())  # type: ignore[arg-type]
    assert found.running and not found.lost

    state = tmp_path / "state"
    state.mkdir()
    Spec(run_id="r1", nodes=["h1", "h2"], store="s3://b/runs").save(state / "spec.json")
    follows = iter([found, None])
    monkeypatch.setattr(supervise, "_follow", lambda *args: next(follows))
    monkeypatch.setattr(supervise, "_finish", lambda st, sp, se, nodes, out, code: code)
    settings = load_settings(
        {"keepalive_interval": 0.01}, cwd=tmp_path, environ={"HOME": str(tmp_path)}
    )
    said = Recorder()
    assert supervise.supervise(state, settings, said) == 0
    assert Journal(state / "events.jsonl").events() == []
    assert any("still runs on every node" in line for line in said.lines)
