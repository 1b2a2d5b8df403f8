"""group: fan-out over real hosts; one failing host never stops or hides the others."""

from __future__ import annotations

import pytest
from conftest import Client
from testbed import NetnsBed

from vmrun.errors import ExitCode, HostsFailed, UnreachableError
from vmrun.ssh.group import Group, raise_for_failures, worst_exit_code
from vmrun.ssh.hosts import parse_host
from vmrun.ssh.inventory import HostEntry


def test_outcomes_come_back_in_host_order_with_errors_kept(
    bed: NetnsBed, bed_client: Client
) -> None:
    dead = bed["h1"].addr.rsplit(".", 1)[0] + ".252"
    entries = [
        HostEntry(parse_host("h3")),
        HostEntry(parse_host(f"x@{dead}")),
        HostEntry(parse_host("h1"), name="first"),
    ]
    settings = bed_client.settings(connect_timeout=2)
    with Group(entries, settings) as group:
        outcomes = group.map(lambda entry, conn: conn.run(["hostname"], check=True))
    assert [o.host for o in outcomes] == ["h3", f"x@{dead}", "first"]
    assert outcomes[0].value.stdout_tail.strip() == bed["h3"].hostname
    assert outcomes[2].value.stdout_tail.strip() == bed["h1"].hostname
    assert isinstance(outcomes[1].error, UnreachableError)
    assert worst_exit_code(outcomes) == ExitCode.UNREACHABLE
    with pytest.raises(HostsFailed) as info:
        raise_for_failures(outcomes)
    assert info.value.one_line().startswith(f"1 of 3 hosts failed: x@{dead}: ")
    assert info.value.exit_code == ExitCode.UNREACHABLE


def test_each_host_keeps_one_connection_across_map_calls(bed: NetnsBed, bed_client: Client) -> None:
    entries = [HostEntry(parse_host(n)) for n in ("h1", "h2")]
    before = {n: bed[n].sshd_log().count("Accepted publickey") for n in ("h1", "h2")}
    with Group(entries, bed_client.settings()) as group:
        for _ in range(3):
            outcomes = group.map(lambda entry, conn: conn.run(["true"], check=True))
            assert all(o.ok for o in outcomes)
    after = {n: bed[n].sshd_log().count("Accepted publickey") for n in ("h1", "h2")}
    assert {n: after[n] - before[n] for n in after} == {"h1": 1, "h2": 1}


def test_worst_exit_code_prefers_the_highest_code() -> None:
    from vmrun.ssh.group import Outcome
    from vmrun.ssh.result import CommandResult

    def result(code: int) -> CommandResult:
        return CommandResult("h", ("x",), code, "", "", 0.1)

    assert worst_exit_code([Outcome("a", result(0), None, 0.1)]) == 0
    assert (
        worst_exit_code([Outcome("a", result(3), None, 0.1), Outcome("b", result(1), None, 0.1)])
        == 3
    )
    assert (
        worst_exit_code(
            [Outcome("a", result(127), None, 0.1), Outcome("b", None, UnreachableError("x"), 0.1)]
        )
        == 127
    )
