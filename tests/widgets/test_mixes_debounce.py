"""Generated mix blocks and the debouncer (driven by a manual clock, no sleeps)."""

from __future__ import annotations

import pytest

from spindle_dsl.errors import SpecError
from spindle_dsl.widgets.debounce import Debouncer
from spindle_dsl.widgets.mixes import MixInfo, custom_mix_text, format_weight

BASE = MixInfo("pretrain", 1024, (("image_chat", 0.4), ("audio_chat", 0.3), ("text_chat", 0.2)))


@pytest.mark.parametrize(
    "w, text", [(3.0, "3"), (0.4, "0.4"), (0.125, "0.125"), (1e-5, "0.00001"), (2.5e-7, "0")]
)
def test_format_weight_has_no_exponent(w, text):
    assert format_weight(w) == text


def test_unchanged_weights_need_no_generated_mix():
    assert custom_mix_text("x\n", BASE, {"image_chat": 0.4}) is None
    assert custom_mix_text("x\n", BASE, {}) is None


def test_generated_mix_keeps_order_batch_and_avoids_taken_names():
    text, name = custom_mix_text(
        "spec", BASE, {"text_chat": 0.0, "av_chat": 1.5}, taken=["custom", "pretrain"]
    )
    assert name == "custom_2"
    assert text.startswith("spec\n\n# weights set in the planner widget")
    assert text.endswith(
        "mix custom_2 {\n  global_batch = 1024\n  image_chat = 0.4\n  audio_chat = 0.3\n"
        "  av_chat = 1.5\n}\n"
    )


def test_bad_weights_are_spec_errors():
    with pytest.raises(SpecError, match="weight 0"):
        custom_mix_text("", BASE, {t: 0 for t, _ in BASE.weights})
    with pytest.raises(SpecError, match="'audio_chat' must be a number >= 0"):
        custom_mix_text("", BASE, {"audio_chat": float("nan")})


class ManualClock:
    """A timer factory whose timers fire only when the test advances time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[list] = []  # [due, fn, cancelled]

    def __call__(self, delay, fn):
        timer = [self.now + delay, fn, False]
        self.timers.append(timer)

        class Handle:
            def cancel(_self):
                timer[2] = True

        return Handle()

    def advance(self, dt: float) -> None:
        self.now += dt
        for t in list(self.timers):
            if not t[2] and t[0] <= self.now:
                t[2] = True
                t[1]()


def test_a_burst_of_triggers_runs_once_with_the_latest_arguments():
    clock, seen = ManualClock(), []
    d = Debouncer(seen.append, 0.3, clock)
    for ch in "abc":
        d.trigger(ch)
        clock.advance(0.1)
    assert seen == [] and d.pending
    clock.advance(0.25)
    assert seen == ["c"] and not d.pending and d.calls == 1
    d.trigger("d")
    clock.advance(0.31)
    assert seen == ["c", "d"]


def test_flush_and_cancel():
    clock, seen = ManualClock(), []
    d = Debouncer(seen.append, 0.3, clock)
    d.trigger("x")
    assert d.flush() and seen == ["x"]
    clock.advance(1)
    assert seen == ["x"]  # the timer that was waiting does not fire again
    d.trigger("y")
    d.cancel()
    clock.advance(1)
    assert seen == ["x"] and not d.flush()


def test_zero_wait_runs_at_once_and_negative_wait_is_refused():
    seen = []
    d = Debouncer(seen.append, 0)
    d.trigger(1)
    assert seen == [1]
    with pytest.raises(ValueError):
        Debouncer(seen.append, -1)


def test_default_timer_fires_on_a_thread_without_an_event_loop():
    import threading

    done = threading.Event()
    d = Debouncer(lambda: done.set(), 0.01)
    d.trigger()
    assert done.wait(2.0)


def test_default_timer_uses_the_running_event_loop():
    import asyncio
    import threading

    seen = []

    async def main():
        d = Debouncer(lambda: seen.append(threading.get_ident()), 0.01)
        d.trigger()
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert seen == [threading.get_ident()]  # ran on the loop's own thread
