"""`vmrun doctor` on the multi-node test hosts: every check against real sshd, real sockets,
real torchrun (gloo); a port dropped by nftables inside one host is found and named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Client, error_in
from testbed import TestHost

from vmrun.backends.hosts.netfacts import NodeFacts
from vmrun.doctor import _Host, _same_versions
from vmrun.ssh.hosts import HostSpec
from vmrun.ssh.inventory import HostEntry


def rows(stdout: str) -> dict[tuple[str, str], tuple[str, str]]:
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"(\S+)\s+(\S+(?: -> \S+)?)\s+(OK|WARN|FAIL|SKIP)\s+(.*)", line)
        if match:
            found[(match.group(1), match.group(2))] = (match.group(3), match.group(4))
    return found


@pytest.mark.timeout(900)  # its own deadlines: two doctor runs of 300 s, and more
def test_doctor_passes_every_check_on_healthy_hosts(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    before = {h: _logins(cluster[h]) for h in ("n1", "n2")}
    done = multi.vmrun("doctor", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # one connection per host serves every check, the all-reduce run and its clean-up
    assert {h: _logins(cluster[h]) - n for h, n in before.items()} == {"n1": 1, "n2": 1}
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


def _logins(host: TestHost) -> int:
    """SSH logins the host's sshd has accepted so far."""
    return host.sshd_log().count("Accepted publickey")


def _doctor_processes(host: TestHost) -> list[int]:
    """The host user's live processes that belong to a doctor all-reduce run."""
    found = []
    for pid in host.user_pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"VMRUN_RUN_ID=doctor-allreduce" in environ:
            found.append(pid)
    return found


@pytest.mark.timeout(600)
def test_a_hung_all_reduce_is_stopped_at_its_deadline(
    cluster: dict[str, TestHost], multi: Client
) -> None:
    """The all-reduce has a deadline (VMRUN_DOCTOR_ALLREDUCE_TIMEOUT, 300 s by default); one
    too short for torch to even start stands in for a collective that hangs: doctor fails the
    check, stops the run on every host, and leaves nothing behind."""
    done = multi.vmrun("doctor", env={"VMRUN_DOCTOR_ALLREDUCE_TIMEOUT": "0.5"}, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict, detail = rows(done.stdout)[("allreduce", "all")]
    assert verdict == "FAIL" and detail == "no result within 0.5 s; the run was stopped", detail
    assert _doctor_processes(cluster["n1"]) == [] and _doctor_processes(cluster["n2"]) == []
    assert "doctor-allreduce" not in multi.vmrun("status").stdout


def test_doctor_names_the_pair_a_blocked_port_separates(
    cluster: dict[str, TestHost], multi: Client
) -> None:
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


def test_doctor_refuses_a_master_that_is_not_one_of_the_hosts(client: Client) -> None:
    """Like `vmrun train --master`: an unknown name is an error, before any host is contacted
    (these hosts do not exist, so a check of them would fail differently and slowly)."""
    bad = client.vmrun("doctor", "-H", "a.invalid", "-H", "b.invalid", "--master", "c.invalid")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    code, said = error_in(bad.stderr)
    assert code == "usage" and said.startswith("--master c.invalid")
    assert "ssh" not in bad.stdout  # no check ran


def _host(label: str, python: str, torch: str = "2.13.0") -> _Host:
    data = {"python": python, "torch": torch, "cuda": None, "nccl": None, "gpu_names": []}
    return _Host(HostEntry(HostSpec(label)), recorded=True, facts=NodeFacts(label, data=data))


def test_doctor_compares_python_by_major_minor_as_train_does() -> None:
    """3.11.2 vs 3.11.7 trains (a warning); 3.10 vs 3.11 is refused by train (a failure)."""
    patch = _same_versions([_host("a", "3.11.2"), _host("b", "3.11.7")])
    assert [(c.name, c.verdict) for c in patch] == [("versions", "warn")]
    assert patch[0].detail == "Python patch level differs: 3.11.2 on a; 3.11.7 on b"
    minor = _same_versions([_host("a", "3.10.12"), _host("b", "3.11.7")])
    assert [(c.name, c.verdict) for c in minor] == [("versions", "fail")]
    assert minor[0].detail == "Python differs: 3.10.12 on a; 3.11.7 on b"
    same = _same_versions([_host("a", "3.11.7"), _host("b", "3.11.7")])
    assert [(c.name, c.verdict) for c in same] == [("versions", "ok")]
    torch = _same_versions([_host("a", "3.11.2"), _host("b", "3.11.7", torch="2.12.0")])
    assert [c.verdict for c in torch] == ["warn", "fail"]
