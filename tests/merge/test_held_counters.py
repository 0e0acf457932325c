"""A window cut by time keeps each counter track's value held at the window's start.

Samplers write a series only when it changes, so the last sample of a track can lie long before a
window; the merge's time filter (``transform.passes.filter_events``) then keeps a copy of it at the
window's start. Property: inside every window, every track reads the same value from the kept
events as from all of them."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.merge.timeline.model import Event
from rl_trace_observer.merge.transform.passes import HELD_COUNTERS, PassContext, filter_events


def _value(v: int) -> msgspec.Raw:
    return msgspec.Raw(b'{"value":%d}' % v)


def _value_at(events: list[Event], track: str, t: int) -> int | None:
    pts = sorted(
        (e.ts, int(bytes(e.args)[9:-1])) for e in events if e.ph == "C" and e.name == track and e.ts <= t
    )  # type: ignore[arg-type, operator]
    return pts[-1][1] if pts else None


samples = st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 100), st.integers(0, 9)), max_size=30)
windows = st.lists(st.tuples(st.integers(0, 100), st.integers(0, 30)), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(samples, windows)
def test_every_track_reads_the_same_inside_each_window(
    points: list[tuple[str, int, int]], wins: list[tuple[int, int]]
) -> None:
    # one sample per (track, time), as a sampler writes
    seen: dict[tuple[str, int], int] = {}
    for track, ts, v in points:
        seen.setdefault((track, ts), v)
    events = [
        Event(ph="C", name=k, pid=1, tid=0, ts=ts, args=_value(v))
        for (k, ts), v in sorted(seen.items(), key=lambda kv: kv[0][1])
    ]
    events.append(Event(ph="X", name="work", pid=1, tid=1, ts=50, dur=5))
    spans = tuple((lo, lo + width) for lo, width in wins)
    ctx = PassContext(windows=spans)
    kept = filter_events(list(events), ctx)
    for lo, hi in spans:
        for t in range(lo, hi + 1):
            for track in "ab":
                assert _value_at(kept, track, t) == _value_at(events, track, t), (track, t)
    for track in "ab":  # each track in time order, as the source wrote it
        times = [e.ts for e in kept if e.ph == "C" and e.name == track]
        assert times == sorted(times)
    held = [e for e in kept if e.ph == "C" and not any(e is x for x in events)]
    assert ctx.stats.get(HELD_COUNTERS, 0) == len(held)
    assert all(any(e.ts == lo for lo, _ in spans) for e in held)  # only ever at a window's start


def test_a_track_sampled_at_the_window_start_gets_no_copy() -> None:
    events = [Event(ph="C", name="g", pid=1, tid=0, ts=t, args=_value(t)) for t in (0, 10, 20)]
    ctx = PassContext(windows=((10, 15),))
    assert [e.ts for e in filter_events(list(events), ctx)] == [10]
    ctx = PassContext(windows=((12, 15),))
    kept = filter_events(list(events), ctx)
    assert [(e.ts, bytes(e.args)) for e in kept] == [(12, b'{"value":10}')] and ctx.stats[HELD_COUNTERS] == 1
