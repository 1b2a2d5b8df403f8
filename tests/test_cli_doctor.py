"""`vmrun doctor` on the multi-node test hosts: every check against real sshd, real sockets,
real torchrun (gloo); a port dropped by nftables inside one host is found and named."""

from __future__ import annotations

import re

from conftest import Client
from testbed import TestHost


def rows(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"(\S+)\s+(\S+(?: -> \S+)?)\s+(OK|WARN|FAIL|SKIP)\s+(.*)", line)
        if match:
            found[(match.group(1), match.group(2))] = (match.group(3), match.group(4))
    return found


def test_doctor_passes_every_check_on_healthy_hosts(
        cluster: dict[str, TestHost], multi: Client) -> None:
    done = multi.vmrun("doctor", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = rows(done.stdout)
    for host in ("n1", "n2"):
        for check in ("ssh", "python", "gpus", "disk", "clock"):
            assert found[(check, host)][0] in ("OK", "WARN"), (check, host, done.stdout)
        assert "torch 2.13.0" in found[("python", host)][1]
        assert found[("gpus", host)][1] == "none: CPU processes, gloo"
    assert found[("versions", "all")][0] == "OK"
    assert found[("network", "all")] == ("OK", "all 2 host pairs connect on port 29400")
    assert found[("rendezvous", "n1")][0] == "OK"
    verdict, detail = found[("allreduce", "all")]
    pattern = r"world 4, 16 MiB x 10: .* busbw \d+\.\d+ GB/s \(gloo, cpu\)"
    assert verdict == "OK" and re.match(pattern, detail), detail
    assert "0 failed" in done.stderr
    # doctor leaves no run behind for `status` or `fetch` to find
    assert "doctor-allreduce" not in multi.vmrun("status").stdout
    alone = multi.vmrun("doctor", "-H", "n2", timeout=300)  # one host: its own processes
    assert alone.returncode == 0, alone.stdout + alone.stderr
    verdict, detail = rows(alone.stdout)[("allreduce", "n2")]
    assert verdict == "OK" and detail.startswith("world 2,"), detail
    assert not any(check == "network" for check, _ in rows(alone.stdout))


def test_doctor_names_the_pair_a_blocked_port_separates(
        cluster: dict[str, TestHost], multi: Client) -> None:
    cluster["n2"].block_port(29400)
    done = multi.vmrun("doctor", timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    found = rows(done.stdout)
    verdict, detail = found[("network", "n1 -> n2")]
    assert verdict == "FAIL" and ":29400 (timed out" in detail, done.stdout
    assert ("network", "n2 -> n1") not in found  # that direction works
    assert found[("rendezvous", "n1")][0] == "OK"  # n2 reaches the master; n1 is not reached
    assert found[("allreduce", "all")] == ("SKIP", "fix the failures above first")
    assert re.search(r"\b1 failed\b", done.stderr)
