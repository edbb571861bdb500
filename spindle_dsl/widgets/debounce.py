"""Debouncing: run a callback once the user has stopped typing for a moment.

A spec text area fires a change on every keystroke; compiling and re-planning on each one would
queue work the user has already typed past, and flash an error for every half-typed word. A
``Debouncer`` holds the latest call and runs it ``wait_s`` after the last trigger, so a burst of
keystrokes costs one compile.

Timers come from a ``TimerFactory`` so that the widget can use the kernel's asyncio loop (where
widget messages must be sent from) while tests inject a manual clock and stay deterministic and
free of sleeps. With ``wait_s == 0`` a trigger runs at once, which is what plain-pytest widget
tests and scripts want.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol


class Cancellable(Protocol):
    """What a timer factory returns: something that can be told not to fire."""

    def cancel(self) -> None: ...


TimerFactory = Callable[[float, Callable[[], None]], Cancellable]
"""``factory(delay_s, fn)`` arranges for ``fn()`` to run once after ``delay_s`` seconds."""


def default_timer(delay_s: float, fn: Callable[[], None]) -> Cancellable:
    """Schedule on the running asyncio loop when there is one (a Jupyter or Voila kernel), so
    that the callback runs on the thread that owns the widgets' comms; otherwise on a thread."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        return loop.call_later(delay_s, fn)
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True
    timer.start()
    return timer


class Debouncer:
    """Coalesce bursts of calls into one call of ``fn`` with the latest arguments."""

    def __init__(
        self,
        fn: Callable[..., Any],
        wait_s: float,
        timer: TimerFactory = default_timer,
    ) -> None:
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self._fn = fn
        self.wait_s = wait_s
        self._timer_factory = timer
        self._timer: Cancellable | None = None
        self._pending: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self.calls = 0  # how many times fn actually ran (for tests and the status line)

    @property
    def pending(self) -> bool:
        """True while a call is waiting for the quiet period to end."""
        return self._pending is not None

    def trigger(self, *args: Any, **kwargs: Any) -> None:
        """Ask for ``fn(*args, **kwargs)``; any earlier call still waiting is dropped."""
        if self.wait_s == 0:
            self.cancel()
            self._run(args, kwargs)
            return
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._pending = (args, kwargs)
            self._timer = self._timer_factory(self.wait_s, self._fire)

    def flush(self) -> bool:
        """Run the waiting call now (if any); returns whether one ran."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        self._run(*pending)
        return True

    def cancel(self) -> None:
        """Drop the waiting call, if any."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = None
            self._pending = None

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
            pending, self._pending = self._pending, None
        if pending is not None:
            self._run(*pending)

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        self._fn(*args, **kwargs)
