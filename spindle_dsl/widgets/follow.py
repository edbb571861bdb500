"""The full search behind the quick plan: one background search at a time, the newest wins.

A slider move must redraw within half a second, so the widget shows the plan of a short
search first; the planner's full search then runs in the background (``Pipeline.refine``, a
process of its own in the real pipeline, so the kernel stays responsive) and its plan is
handed back for the session to adopt. A newer move makes the search in flight worthless: the
``Follower`` abandons it (``Pipeline.abandon_refine``) and searches for the newest settings.

One daemon thread does the searching. Its result reaches the caller through ``post``: the
kernel's asyncio loop where there is one (widget messages must be sent from its thread),
else the thread itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from spindle_dsl.metagraph import MetaGraph
from spindle_dsl.plan.model import Plan
from spindle_dsl.widgets.state import PlanOptions, Refinement

log = logging.getLogger(__name__)

Deliver = Callable[[Refinement, Plan], None]


def _post_here(fn: Callable[[], None]) -> None:
    """Deliver on the search's own thread (no loop to post to), which a failing delivery must
    not end: the next search still needs it."""
    try:
        fn()
    except Exception:
        log.exception("showing the full search's plan failed")


class Follower:
    """Runs ``refine`` for the newest request in a background thread and gives its plan to
    that request's ``deliver``; requests it has not finished when a newer one comes are
    abandoned (``abandon``) and never delivered."""

    def __init__(
        self,
        refine: Callable[[MetaGraph, PlanOptions], Plan],
        abandon: Callable[[], None] | None = None,
    ) -> None:
        self._refine = refine
        self._abandon = abandon
        self._changed = threading.Condition()
        self._wanted: tuple[int, Refinement, Deliver, Callable] | None = None
        self._running: int | None = None  # the ticket of the search in flight
        self._ticket = 0
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """Whether a search is waiting or running."""
        with self._changed:
            return self._wanted is not None or self._running is not None

    def follow(self, refinement: Refinement, deliver: Deliver) -> None:
        """Search ``refinement`` in the background (the one in flight abandoned) and call
        ``deliver(refinement, plan)`` when done, on the caller's asyncio loop if it has one."""
        try:
            post = asyncio.get_running_loop().call_soon_threadsafe
        except RuntimeError:
            post = _post_here
        with self._changed:
            self._ticket += 1
            self._wanted = (self._ticket, refinement, deliver, post)
            self._stop_running()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def cancel(self) -> None:
        """Drop the waiting search and abandon the one in flight: nothing is delivered."""
        with self._changed:
            self._ticket += 1
            self._wanted = None
            self._stop_running()
            self._changed.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait until no search is waiting or running (scripts, tests); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._wanted is None and self._running is None, timeout_s
            )

    def _stop_running(self) -> None:
        """(under the lock) abandon the search in flight, which is now stale."""
        if self._running is not None and self._abandon is not None:
            self._abandon()

    def _loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._wanted is not None)
                assert self._wanted is not None
                ticket, refinement, deliver, post = self._wanted
                self._wanted, self._running = None, ticket
            plan = self._search(refinement)
            with self._changed:
                current = ticket == self._ticket
            # (a request that a newer one outdates between here and the delivery still gets
            # a plan right for its own settings: the session caches it under them)
            if plan is not None and current:
                post(lambda d=deliver, r=refinement, p=plan: d(r, p))
            with self._changed:
                self._running = None
                self._changed.notify_all()

    def _search(self, refinement: Refinement) -> Plan | None:
        """The full search's plan, or None where it failed or was abandoned (the quick plan
        stays: the search may only improve what is shown)."""
        try:
            return self._refine(refinement.graph, refinement.options)
        except Exception as exc:  # abandoned, or the search itself failed
            log.debug("the full search ended without a plan: %s", exc)
            return None
