"""The supervisor's own check of a run's nodes (vmrun.recovery.heartbeat), driven with fake
answers: a node silent past the rule is declared lost once, within the rule and a period;
a node that answers, or is silent for less, never is; a failed connection is forgotten so
the next ask dials anew. The real path (a link cut and left cut, a paused host) is
tests/test_train_recover.py's."""

from __future__ import annotations

import threading
import time

from vmrun.recovery.heartbeat import Heartbeat


class _Nodes:
    """Answers `ask` as each node does now: `silent` ones raise at once, or hang until the
    ask's own deadline (`hanging`: a paused host's connection accepts and says nothing)."""

    def __init__(self) -> None:
        self.silent: set[str] = set()
        self.hanging: set[str] = set()
        self.asked: dict[str, int] = {}
        self.timeouts: list[float] = []
        self.forgotten: list[str] = []
        self.lost: dict[str, tuple[str, float]] = {}
        self.lost_event = threading.Event()

    def ask(self, node: str, timeout: float) -> None:
        self.asked[node] = self.asked.get(node, 0) + 1
        self.timeouts.append(timeout)
        if node in self.hanging:
            threading.Event().wait(timeout)
            raise TimeoutError(node)
        if node in self.silent:
            raise ConnectionError(node)

    def on_lost(self, node: str, why: str) -> None:
        self.lost[node] = (why, time.monotonic())
        self.lost_event.set()


def _wait(condition: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def test_a_node_that_goes_silent_is_lost_once_within_the_rule() -> None:
    nodes = _Nodes()
    beat = Heartbeat(
        ["a", "b"],
        nodes.ask,
        nodes.on_lost,
        period=0.05,
        lost_after=0.3,
        forget=nodes.forgotten.append,
    )
    with beat:
        _wait(lambda: nodes.asked.get("b", 0) >= 2, 5)
        went = time.monotonic()
        nodes.silent.add("b")
        assert nodes.lost_event.wait(5)
        found = nodes.lost["b"][1] - went
        _wait(lambda: nodes.asked.get("a", 0) >= 20, 5)
    assert beat.lost["b"] >= 0.3  # never before the rule
    assert found <= 0.3 + 2.0, found  # the rule, a period and a loaded machine: not forever
    assert list(nodes.lost) == ["b"] and "did not answer the supervisor" in nodes.lost["b"][0]
    assert "b" in nodes.forgotten and "a" not in nodes.forgotten
    asked_b = nodes.asked["b"]
    time.sleep(0.2)
    assert nodes.asked["b"] == asked_b  # a lost node is not asked again, once told


def test_a_silence_shorter_than_the_rule_is_not_a_loss() -> None:
    nodes = _Nodes()
    with Heartbeat(["a"], nodes.ask, nodes.on_lost, period=0.05, lost_after=0.6):
        _wait(lambda: nodes.asked.get("a", 0) >= 2, 5)
        nodes.silent.add("a")
        _wait(lambda: nodes.asked["a"] >= 5, 5)
        nodes.silent.discard("a")  # back before the rule: a hiccup
        _wait(lambda: nodes.asked["a"] >= 25, 5)
    assert nodes.lost == {}


def test_a_host_that_accepts_and_says_nothing_is_lost_at_the_rule_not_later() -> None:
    """A paused host: each ask waits out its deadline, which is what is left of the rule,
    so the loss is found at the rule, not at the rule plus a whole ask's timeout."""
    nodes = _Nodes()
    with Heartbeat(["a"], nodes.ask, nodes.on_lost, period=0.05, lost_after=0.5):
        _wait(lambda: nodes.asked.get("a", 0) >= 1, 5)
        went = time.monotonic()
        nodes.hanging.add("a")
        assert nodes.lost_event.wait(5)
    assert nodes.lost["a"][1] - went <= 0.5 + 1.0 + 2.0  # an ask lasts 1 s at least


def test_leaving_the_block_stops_the_checks() -> None:
    nodes = _Nodes()
    with Heartbeat(["a"], nodes.ask, nodes.on_lost, period=0.02, lost_after=0.2):
        _wait(lambda: nodes.asked.get("a", 0) >= 2, 5)
    nodes.silent.add("a")
    time.sleep(0.4)
    assert nodes.lost == {}


def test_a_replaced_node_that_answers_again_is_told_once_and_never_lost() -> None:
    """A node an earlier recovery replaced (`retired`) is asked until it answers: then
    `on_back` (the supervisor stops its replaced attempt), once; its silence is no loss."""
    nodes = _Nodes()
    nodes.silent.add("old")
    back: list[str] = []
    with Heartbeat(
        ["a"],
        nodes.ask,
        nodes.on_lost,
        period=0.02,
        lost_after=0.1,
        retired=["old"],
        on_back=back.append,
    ):
        _wait(lambda: nodes.asked.get("old", 0) >= 10, 5)  # 0.2 s of silence: past the rule
        assert back == [] and nodes.lost == {}
        nodes.silent.discard("old")
        _wait(lambda: back, 5)
        asked = nodes.asked["old"]
        _wait(lambda: nodes.asked["a"] >= 20, 5)
    assert back == ["old"] and nodes.asked["old"] == asked  # told once, then left alone
