"""The Backend protocol's contract (vmrun.backends.api), the same scenarios on every backend:
start, find, state, follow, read_log, runs, outputs, files_at, stop, and resume (or its
refusal before anything starts). A new backend gets a harness here and passes these; that
is its checklist (docs/development.md). What a backend cannot do is said by its
capabilities, and a scenario takes the other branch by them (a run on this machine lives in
its terminal: `detach` lacking, it is started in another one).

Quick tier, over fakes at each backend's transport only: the hosts backend's host scripts
run here, each "host" a home of its own (contract_hosts.py); the Slurm backend's login-node
scripts run here against a small fake scheduler (contract_slurm.py); the local backend's
runs are this machine's own (contract_local.py). The real paths are in
the netns tier (test_cli_train_remote.py, test_cli_slurm.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from contract_harness import Harness, wait_for

from vmrun.backends.api import RunRef, StartOptions
from vmrun.errors import UsageError, VmrunError, code_of
from vmrun.reporting import Recorder
from vmrun.runs.state import RunState


@pytest.fixture(params=["hosts", "slurm", "local"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "hosts":
        from contract_hosts import HostsHarness as made
    elif request.param == "slurm":
        from contract_slurm import SlurmHarness as made  # type: ignore[assignment]
    else:
        from contract_local import LocalHarness as made  # type: ignore[assignment]
    with made(tmp_path) as harness:
        yield harness


def _started(harness: Harness, how: StartOptions | None = None) -> RunRef:
    """A run going on: started by the backend (it detaches), else in a terminal of its own
    (a run that lives in its terminal: `vmrun train --local` there), found from here."""
    if harness.backend.capabilities.lacks("detach"):
        return harness.start_elsewhere(how or StartOptions())
    said = Recorder()
    ref = harness.backend.start(harness.plan(), how or StartOptions(), said)
    assert ref.run_id and ref.nodes, said.lines
    assert any(ref.run_id in line for line in said.lines)  # the start names the run
    return ref


def _running(harness: Harness, ref: RunRef) -> None:
    """Once the script has printed its first line (it then waits for its gate)."""
    wait_for(lambda: harness.began(ref), 30, "the script's first line")


def test_a_run_is_found_followed_to_its_end_and_its_files_are_located(harness: Harness) -> None:
    backend = harness.backend
    ref = _started(harness)
    _running(harness, ref)
    found = backend.find(None)
    assert found.run_id == ref.run_id and found.nodes == ref.nodes
    assert backend.find(ref.run_id, running_only=True).run_id == ref.run_id
    assert backend.state(found)[0] in (RunState.PENDING, RunState.RUNNING)
    harness.release(0)
    lines = Recorder()
    assert backend.follow(found, lines) == 0
    assert b"step 1" in lines.data and b"done" in lines.data
    assert backend.state(backend.find(ref.run_id)) == (RunState.DONE, 0)
    log = Recorder()
    backend.read_log(backend.find(ref.run_id), log)
    assert b"step 1" in log.data
    rows, unanswered = backend.runs()
    assert [r.id for r in rows] == [ref.run_id] and not unanswered
    assert rows[0].state == RunState.DONE and rows[0].exit_code == 0 and rows[0].attempts == 1
    where = backend.outputs(backend.find(ref.run_id))
    assert set(where) == set(ref.nodes)
    assert all(loc.run_id == ref.run_id for loc in where.values())
    assert harness.exists(where[ref.nodes[0]].record_dir)
    if backend.capabilities.files_elsewhere:
        at = backend.files_at(backend.find(ref.run_id))
        assert at.node in ref.nodes and at.location == where[at.node] and at.python
        assert at.selector.split()[0] in ("-H", "-C")
    else:  # its files are here: nothing to reach, and the user is told where they are
        with pytest.raises(UsageError) as here:
            backend.files_at(backend.find(ref.run_id))
        assert where[ref.nodes[0]].out_dir in here.value.message
    assert harness.exists(backend.code_dir(harness.project))


def test_start_returns_with_the_run_going_on_or_at_its_end(harness: Harness) -> None:
    """A backend that detaches returns at once, the run going on; one whose run lives in
    the caller's terminal returns at its end, with its lines said and its code kept."""
    backend, said = harness.backend, Recorder()
    if backend.capabilities.detach:
        ref = backend.start(harness.plan(), StartOptions(), said)
        _running(harness, ref)
        assert backend.state(ref)[0] in (RunState.PENDING, RunState.RUNNING)
        harness.release(0)
        assert backend.follow(backend.find(ref.run_id), Recorder()) == 0
    else:
        harness.release(0)  # its gate open: it ends within its start
        ref = backend.start(harness.plan(), StartOptions(), said)
        assert b"step 1" in said.data and b"done" in said.data
        assert backend.follow(ref, Recorder()) == 0
    assert ref.run_id and any(ref.run_id in line for line in said.lines)
    assert backend.state(backend.find(ref.run_id)) == (RunState.DONE, 0)
    assert [r.id for r in backend.runs()[0]] == [ref.run_id]


def test_a_stopped_run_leaves_nothing_running_and_a_second_stop_finds_it_ended(
    harness: Harness,
) -> None:
    backend = harness.backend
    ref = _started(harness)
    _running(harness, ref)
    outcomes = backend.stop(backend.find(ref.run_id), grace=5)
    assert [o.host for o in outcomes] == list(ref.nodes)
    assert all(o.error is None and o.value is not None and o.value.signalled for o in outcomes)
    assert not harness.alive(ref)
    state, code = backend.state(backend.find(ref.run_id))
    assert state == RunState.STOPPED and code != 0, code  # a stop is no success
    with pytest.raises(UsageError) as none:
        backend.find(None, running_only=True)
    assert code_of(none.value) == "run-not-found"
    again = backend.stop(backend.find(ref.run_id), grace=5)
    assert all(o.value is not None and o.value.signalled == 0 for o in again)


def test_an_unknown_run_is_not_found(harness: Harness) -> None:
    with pytest.raises(UsageError) as none:
        harness.backend.find("nosuchrun-20260101-000000-abcd")
    assert code_of(none.value) == "run-not-found"


def test_a_failed_run_raises_its_code_and_resume_continues_it_or_is_refused_up_front(
    harness: Harness,
) -> None:
    backend = harness.backend
    ref = _started(harness)
    _running(harness, ref)
    harness.release(3)
    with pytest.raises(VmrunError) as failed:
        backend.follow(backend.find(ref.run_id), Recorder())
    assert code_of(failed.value) == "run-failed"
    assert backend.state(backend.find(ref.run_id)) == (RunState.FAILED, 3)
    if not harness.resumes:
        with pytest.raises(UsageError) as refused:
            backend.start(harness.plan(), StartOptions(resume=ref.run_id), Recorder())
        assert code_of(refused.value) == "flags-conflict"
        assert [r.id for r in backend.runs()[0]] == [ref.run_id]  # nothing new was started
        return
    harness.reset_gate()
    again = backend.start(harness.plan(), StartOptions(resume=ref.run_id), Recorder())
    assert again.run_id == ref.run_id
    _running(harness, again)
    harness.release(0)
    assert backend.follow(backend.find(ref.run_id), Recorder()) == 0
    (row,) = backend.runs()[0]
    assert row.attempts == 2 and row.state == RunState.DONE
