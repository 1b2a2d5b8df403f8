"""Many hosts at once, end to end: 64 real sshd hosts, faults among them, a bastion that keeps
OpenSSH's default-sized MaxStartups, and one sshd that drops handshakes past its limit."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Client, errors_in, slow_fixture
from testbed import ClientKeys, NetnsBed, skip_reason_no_netns

WIDE = 64
BEHIND = 16
ALIASES = 16
BLACK_HOLED = ["h30", "h31", "h32", "h33"]
WRONG_KEY = ["h10", "h11"]
NO_LOGIN = ["h20", "h21"]


@pytest.fixture(scope="module")
@slow_fixture
def fleet(tmp_path_factory: pytest.TempPathFactory, client_keys: ClientKeys) -> Iterator[NetnsBed]:
    """h00..h63 on one network (h20, h21 refuse every login); `gate`, a bastion whose sshd
    takes 2 unauthenticated connections at once (stricter than OpenSSH's default 10), with
    b00..b15 behind it; `crowded`, an sshd that takes 1 (reached under 16 aliases)."""
    reason = skip_reason_no_netns()
    if reason:
        pytest.skip(f"multi-host test bed unavailable: {reason}")
    with NetnsBed(tmp_path_factory.mktemp("fleet"), client_keys) as bed:
        for i in range(WIDE):
            name = f"h{i:02d}"
            bed.add_host(name, login_user="u", authorized=name not in NO_LOGIN)
        bed.add_host("gate", networks=("main", "inner"), sshd_extra_config="MaxStartups 2\n")
        for i in range(BEHIND):
            bed.add_host(f"b{i:02d}", networks=("inner",), login_user="u")
        bed.add_host("crowded", sshd_extra_config="MaxStartups 1\n")
        yield bed


def _client_for(fleet: NetnsBed, client: Client) -> Client:
    """The fleet in ~/.ssh/config and known_hosts (WRONG_KEY hosts known by another host's
    key), and vmrun.toml's groups: all (h00..h63), behind (b00..b15), crowd (16 aliases)."""
    crowded = fleet["crowded"]
    aliases = [f"c{i:02d}" for i in range(ALIASES)]
    config = fleet.ssh_config_text() + "".join(crowded.ssh_config_block(a) for a in aliases)
    (client.ssh_dir / "config").write_text(config)
    other = fleet["h40"].host_key_pub_lines
    known = []
    for host in fleet.hosts():
        keys = other if host.name in WRONG_KEY else host.host_key_pub_lines
        known += [f"{host.addr} {key}" for key in keys]
    (client.ssh_dir / "known_hosts").write_text("\n".join(known) + "\n")
    groups = {
        "all": [f"h{i:02d}" for i in range(WIDE)],
        "behind": [f"b{i:02d}" for i in range(BEHIND)],
        "crowd": aliases,
    }
    toml = "".join(
        f'[[hosts]]\naddress = "{name}"\ngroups = ["{group}"]\n'
        for group, names in groups.items()
        for name in names
    )
    (client.cwd / "vmrun.toml").write_text(toml)
    return client


def _timed_lines(proc: subprocess.Popen[str]) -> tuple[list[tuple[float, str]], str]:
    """stdout's lines with when each came (seconds from now), and all of stderr."""
    began = time.monotonic()
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    lines = [(time.monotonic() - began, line.rstrip("\n")) for line in proc.stdout]  # type: ignore[union-attr]
    proc.wait(timeout=60)
    reader.join(timeout=10)
    return lines, "".join(err)


def test_64_hosts_with_faults_each_named_once(fleet: NetnsBed, client: Client) -> None:
    """4 hosts black-holed, 2 with a key other than the known one, 2 refusing logins: the
    other 56 answer at their own speed, streamed before the dead ones' deadline; every
    failed host is named once, in host order, with its own code; the command ends at the
    connect deadline, not a multiple of it."""
    _client_for(fleet, client)
    deadline = 20  # 64 handshakes on 2 cores beside the other worker's tests: 5-13 s
    for name in BLACK_HOLED:
        fleet[name].cut_link()
    try:
        began = time.monotonic()
        proc = client.popen(
            "exec", "-H", "@all", "--connect-timeout", str(deadline), "--", "hostname"
        )
        lines, err = _timed_lines(proc)
        took = time.monotonic() - began
    finally:
        for name in BLACK_HOLED:
            fleet[name].heal_link()
    failed = BLACK_HOLED + WRONG_KEY + NO_LOGIN
    answered = {line.split()[0].strip("[]"): (at, line) for at, line in lines}
    good = [f"h{i:02d}" for i in range(WIDE) if f"h{i:02d}" not in failed]
    assert sorted(answered) == sorted(good), err
    for name in good:
        assert answered[name][1].split()[-1] == fleet[name].hostname
    # streamed as they answered: the last good host well before the dead ones gave up
    assert max(at for at, _ in answered.values()) < deadline - 1, lines
    assert took < deadline * 2, f"took {took:.1f} s: dead hosts waited in turn"
    codes = {
        "host-unreachable": BLACK_HOLED,
        "host-key-changed": WRONG_KEY,
        "auth-failed": NO_LOGIN,
    }
    per_host = [(code, msg.split(":", 1)[0]) for code, msg in errors_in(err)]
    named = [host for _, host in per_host if host.startswith("h")]
    assert named == sorted(failed), err  # each once, in host order
    for code, hosts in codes.items():
        assert sorted(h for c, h in per_host if c == code) == hosts, err
    assert ("hosts-failed", f"{len(failed)} of {WIDE} hosts failed") in errors_in(err)
    assert proc.returncode == 12  # the worst host's: unreachable


def test_hosts_behind_a_strict_bastion_share_one_connection(
    fleet: NetnsBed, client: Client
) -> None:
    """16 hosts behind a bastion that takes 2 handshakes at once: all reached, over one
    connection to it (its sshd logs one login), and none reported dead."""
    _client_for(fleet, client)
    gate = fleet["gate"]
    logins_before = gate.sshd_log().count("Accepted publickey")
    done = client.vmrun("exec", "-H", "@behind", "--", "hostname", timeout=120)
    assert done.returncode == 0, done.stderr
    got = sorted(line.split()[-1] for line in done.stdout.splitlines())
    assert got == sorted(fleet[f"b{i:02d}"].hostname for i in range(BEHIND))
    assert gate.sshd_log().count("Accepted publickey") - logins_before == 1


def test_handshakes_dropped_past_maxstartups_are_tried_again(
    fleet: NetnsBed, client: Client
) -> None:
    """16 connections at once to an sshd that takes one unauthenticated connection: those it
    drops before its banner are tried again, and every one gets through."""
    _client_for(fleet, client)
    crowded = fleet["crowded"]
    drops_before = crowded.sshd_log().count("past MaxStartups")
    done = client.vmrun("exec", "-H", "@crowd", "--", "true", timeout=120)
    assert done.returncode == 0, done.stderr
    assert crowded.sshd_log().count("Accepted publickey") >= ALIASES
    assert crowded.sshd_log().count("past MaxStartups") > drops_before  # it did drop some


def test_parallel_bounds_the_hosts_worked_on_at_once(fleet: NetnsBed, client: Client) -> None:
    """--parallel 4: never more than 4 hosts run the command at once (each host notes its
    start and end in a file on a shared path: its home, read here)."""
    _client_for(fleet, client)
    names = [f"h{i:02d}" for i in range(40, 52)]
    script = "date +%s.%N > began; sleep 0.3; date +%s.%N > ended"
    done = client.vmrun(
        "exec",
        *[a for n in names for a in ("-H", n)],
        "--parallel",
        "4",
        "--",
        "sh",
        "-c",
        script,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    spans = [
        (float((fleet[n].home / "began").read_text()), float((fleet[n].home / "ended").read_text()))
        for n in names
    ]
    busiest = max(sum(1 for b, e in spans if b <= t < e) for t, _ in spans)
    assert busiest <= 4
    assert busiest >= 2  # and it did work in parallel


def test_check_setup_and_status_over_64_hosts_name_each_failure_once(
    fleet: NetnsBed, client: Client, tmp_path: Path
) -> None:
    """`hosts --check`, `setup --json`, `exec --json` and `status --json` over the 64: the 60
    good hosts answer; the 2 with a key other than the known one and the 2 refusing logins
    are each named once, in host order, with their own code and exit status (10: host key,
    11: login)."""
    _client_for(fleet, client)
    names = [f"h{i:02d}" for i in range(WIDE)]
    failed = {
        **dict.fromkeys(WRONG_KEY, "host-key-changed"),
        **dict.fromkeys(NO_LOGIN, "auth-failed"),
    }
    good = [n for n in names if n not in failed]

    check = client.vmrun("hosts", "--check", "-H", "@all", timeout=120)
    assert check.returncode == 11, check.stderr
    assert sorted(line.split()[0] for line in check.stdout.splitlines()) == good
    said = errors_in(check.stderr)
    assert [(msg.split(":")[0], code) for code, msg in said[:-1]] == sorted(failed.items())
    assert said[-1] == ("hosts-failed", f"{len(failed)} of {WIDE} hosts failed")

    book = tmp_path / "book.yaml"
    book.write_text('name: tiny\nsteps:\n  - name: mark\n    apply: echo set > "$HOME/marked"\n')
    done = client.vmrun(
        "setup", "-H", "@all", "--playbook", str(book), "--json", "--no-record", timeout=600
    )
    assert done.returncode == 11, done.stderr
    document = json.loads(done.stdout)  # stdout is the document alone
    assert [h["host"] for h in document["hosts"]] == names
    assert {h["host"]: h["error"]["code"] for h in document["hosts"] if not h["ok"]} == failed
    for item in document["hosts"]:
        if item["ok"]:
            assert ("mark", "ran") in [(s["name"], s["status"]) for s in item["steps"]], item
    assert document["failed"] == len(failed)
    assert all((fleet[n].home / "marked").exists() for n in good)

    ran = client.vmrun("exec", "-H", "@all", "--json", "--", "hostname", timeout=120)
    assert ran.returncode == 11, ran.stderr
    document = json.loads(ran.stdout)  # the lines went to stderr
    assert [h["host"] for h in document["hosts"]] == names
    codes = {"host-key-changed": 10, "auth-failed": 11}
    for item in document["hosts"]:
        if item["host"] in failed:
            assert item["exit_status"] == codes[failed[item["host"]]], item
            assert item["error"]["code"] == failed[item["host"]]
        else:
            assert item["exit_status"] == 0 and item["error"] is None, item
            assert item["stdout_tail"].strip() == fleet[item["host"]].hostname
    assert document["failed"] == len(failed) and document["exit_code"] == 11

    status = client.vmrun("status", "-H", "@all", "--json", timeout=120)
    places = [o for o in json.loads(status.stdout) if o.get("error")]
    assert sorted((o["hosts"][0], o["error"]["code"]) for o in places) == sorted(failed.items())
