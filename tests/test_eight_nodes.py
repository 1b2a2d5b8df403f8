"""Eight nodes, 1 process each, on real network-namespace hosts: c10d rendezvous, the merged
log, a node killed mid-run reported and resumed from the newest snapshot on all eight (the
final weights those of one uninterrupted process), and doctor's all-reduce over the eight
(real torchrun, gloo)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Client, clean_host, error_in, run_pids, template_out, wait_for
from testbed import NetnsBed, TestHost
from train_helpers import Gate, assert_matches_one_process, train_then_fault

NODES = [f"e{i}" for i in range(1, 9)]


@pytest.fixture(scope="module")
def eight(bed: NetnsBed) -> dict[str, TestHost]:
    hosts = {}
    for name in NODES:
        try:
            hosts[name] = bed[name]
        except KeyError:
            hosts[name] = bed.add_host(name, hosts_file_loopback_hostname=True)
    return hosts


@pytest.fixture
def octet(
    bed: NetnsBed, eight: dict[str, TestHost], client: Client, host_python: Path
) -> Iterator[Client]:
    """A project whose vmrun.toml lists e1..e8; afterwards nothing of a run is left on them."""
    (client.ssh_dir / "config").write_text(bed.ssh_config_text())
    (client.ssh_dir / "known_hosts").write_text(bed.known_hosts_text())
    (client.cwd / "vmrun.toml").write_text(
        "".join(f'[[hosts]]\naddress = "{n}"\npython = "{host_python}"\n\n' for n in NODES)
    )
    client.extra_env["OMP_NUM_THREADS"] = "1"
    yield client
    first: BaseException | None = None
    for host in eight.values():
        steps: list[Callable[[], object]] = [host.heal_link, functools.partial(clean_host, host)]
        if host.sshd_pid() is None:
            steps.insert(0, host.start_sshd)
        for step in steps:
            try:
                step()
            except BaseException as exc:
                first = first or exc
    if first is not None:
        raise first


def _ranks(stdout: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for line in stdout.splitlines():
        match = re.match(r"\[(\w+) rank(\d+)\] started: pid \d+ local_rank 0 world_size 8", line)
        if match:
            found.setdefault(match.group(1), set()).add(int(match.group(2)))
    return found


@pytest.mark.timeout(1200)
def test_a_killed_node_is_reported_and_the_resume_on_all_eight_matches_one_process(
    eight: dict[str, TestHost], octet: Client, gate: Gate, tmp_path: Path
) -> None:
    """8 x 1 process, deterministic. e5 dies (every process of the host killed, as a crash
    does) after a snapshot: the run fails naming e5, within the usual bound, and leaves
    nothing on the other seven; with e5 back, --resume continues from the newest snapshot on
    every node: one world of eight in one merged log, the master (e1) holding rank 0, and
    the final weights those of one uninterrupted process with the same global batch. The
    ranks hold after epoch 2's snapshot (a trainer hook) until the resume, so the run
    cannot end first."""
    e1, e5 = eight["e1"], eight["e5"]
    args = ["4", "2", "--batch-size", "4", "--dataset-size", "256", "--deterministic"]
    train = ["--nproc-per-node", "1", *gate.options(2), "--", *args]
    run = train_then_fault(octet, e1.home, train, e5.stop_sshd, snapshot_s=300, end_s=180)
    rid, log, err = run.rid, run.log, run.stderr
    assert run.returncode not in (0, None), err
    print(f"e5's death reported {run.took:.1f} s after it")
    assert run.took < 60, f"the failure took {run.took:.0f} s to report"
    code, said = error_in(err)
    assert code == "run-failed" and "e5" in said, err
    for name in NODES:
        if name != "e5":
            wait_for(lambda h=eight[name]: run_pids(h, rid) == [], 30, f"no run left on {name}")
    assert b"epoch 4/4" not in log.read_bytes()
    gate.open()
    e5.start_sshd()
    again = octet.vmrun("train", "--resume", rid, *gate.options(2), timeout=600)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "8 nodes x 1 process(es)" in again.stderr
    resumed = re.findall(
        r"^\[(e\d) rank\d\] resumed from snapshot at epoch (\d+)", again.stdout, re.M
    )
    assert sorted({h for h, _ in resumed}) == NODES, again.stdout
    assert len({e for _, e in resumed}) == 1 and int(resumed[0][1]) >= 2
    ranks = _ranks(again.stdout)
    assert sorted(ranks) == NODES, again.stdout
    assert sorted(r for found in ranks.values() for r in found) == list(range(8))
    assert ranks["e1"] == {0}
    final = template_out(e1, octet, rid) / "finalmodel.pt"
    metrics = [json.loads(x) for x in (final.parent / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == list(range(1, 5))
    assert {m["world_size"] for m in metrics} == {8}
    one = ["4", "2", "--batch-size", "32", "--dataset-size", "256", "--deterministic"]
    assert_matches_one_process(final, one, tmp_path / "single")
    assert all(run_pids(h) == [] for h in eight.values())


@pytest.mark.timeout(900)
def test_doctor_all_reduces_over_eight_nodes(octet: Client) -> None:
    done = octet.vmrun("doctor", "--size-mib", "1", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        match = re.match(r"(\S+)\s+(\S+(?: -> \S+)?)\s+(OK|WARN|FAIL|SKIP)\s+(.*)", line)
        if match:
            rows[(match.group(1), match.group(2))] = (match.group(3), match.group(4))
    assert rows[("network", "all")] == ("OK", "all 56 host pairs connect on port 29400"), rows
    verdict, detail = rows[("allreduce", "all")]
    assert verdict == "OK" and re.match(r"world (8|16), 1 MiB x \d+: ", detail), detail
