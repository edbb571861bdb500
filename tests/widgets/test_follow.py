"""The background full search: one at a time, the newest wins, nothing stale delivered."""

from __future__ import annotations

import threading

from spindle_dsl.widgets.follow import Follower
from spindle_dsl.widgets.state import PlanOptions, Refinement

WAIT_S = 10.0


class GatedSearch:
    """A full search that runs until its gate opens, answering with the graph it was given,
    or until it is abandoned, when it raises (as a call into a killed process does)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.killed: set[str] = set()
        self.running = threading.Event()

    def refine(self, graph, options):
        self.started.append(graph)
        gate = self.gates.setdefault(graph, threading.Event())
        self.running.set()
        if not gate.wait(WAIT_S) or graph in self.killed:
            raise RuntimeError("abandoned")
        return f"plan of {graph}"

    def abandon(self) -> None:
        for graph, gate in self.gates.items():
            if not gate.is_set():
                self.killed.add(graph)
                gate.set()


def wanted(graph: str) -> Refinement:
    return Refinement((graph,), graph, PlanOptions(time_limit_s=10.0))  # type: ignore[arg-type]


def test_a_newer_request_abandons_the_search_in_flight():
    search = GatedSearch()
    follower = Follower(search.refine, search.abandon)
    got: list[tuple[str, str]] = []
    follower.follow(wanted("four"), lambda r, p: got.append((r.graph, p)))
    assert search.running.wait(WAIT_S) and follower.busy
    follower.follow(wanted("eight"), lambda r, p: got.append((r.graph, p)))
    assert search.killed == {"four"}
    while "eight" not in search.gates:
        threading.Event().wait(0.01)
    search.gates["eight"].set()
    assert follower.wait(WAIT_S) and not follower.busy
    assert search.started == ["four", "eight"] and got == [("eight", "plan of eight")]


def test_cancel_delivers_nothing():
    search = GatedSearch()
    follower = Follower(search.refine, search.abandon)
    got: list[str] = []
    follower.follow(wanted("four"), lambda r, p: got.append(p))
    assert search.running.wait(WAIT_S)
    follower.cancel()
    assert follower.wait(WAIT_S) and got == [] and search.killed == {"four"}


def test_a_failed_search_leaves_the_quick_plan():
    def fails(graph, options):
        raise ValueError("no plan fits")

    follower = Follower(fails)
    got: list[str] = []
    follower.follow(wanted("four"), lambda r, p: got.append(p))
    assert follower.wait(WAIT_S) and got == []
    follower.follow(wanted("eight"), lambda r, p: got.append(p))  # the thread lives on
    assert follower.wait(WAIT_S) and got == []


def test_a_failing_delivery_leaves_the_follower_working():
    follower = Follower(lambda graph, options: f"plan of {graph}")
    got: list[str] = []

    def breaks(r, p):
        raise RuntimeError("a drawing failed")

    follower.follow(wanted("four"), breaks)
    assert follower.wait(WAIT_S)
    follower.follow(wanted("eight"), lambda r, p: got.append(p))
    assert follower.wait(WAIT_S) and got == ["plan of eight"]
