"""The replicas' generation lanes drawn from their request spans (``separate_async`` runs)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rl_trace_observer.analysis.report.load import Span, TraceData
from rl_trace_observer.analysis.report.request_work import ENGINE_SPAN, REQUEST_CATEGORY, replica_generation


@st.composite
def served(draw: st.DrawFn) -> list[Span]:
    """One replica's server spans on slot lanes as the capture gives them: a request takes the lowest
    free slot (tid 10 + slot), so every busy interval starts on slot 0."""
    spans, t = [], 0
    for _ in range(draw(st.integers(1, 4))):  # busy intervals, apart
        t += draw(st.integers(1, 1_000))
        ends: list[int] = []  # per slot: when it is free again
        start = t
        for _ in range(draw(st.integers(1, 6))):
            slot = next((i for i, end in enumerate(ends) if end <= start), len(ends))
            end = start + draw(st.integers(1, 500))
            if slot == len(ends):
                ends.append(end)
            else:
                ends[slot] = end
            spans.append(
                Span(ENGINE_SPAN, REQUEST_CATEGORY, 7, 10 + slot, start, end - start, {"replica": 0})
            )
            start += draw(st.integers(0, 100))
            if start >= max(ends):  # nothing in flight: the next request would open a new interval
                break
        t = max(ends)
    return spans


@settings(max_examples=150, deadline=None)
@given(served(), st.randoms(use_true_random=False))
def test_each_busy_interval_is_on_the_replicas_first_slot_whatever_part_is_loaded(
    spans: list[Span], rnd: object
) -> None:
    """A live watch loads one step's piece, the report the whole run, in other orders: the lane a
    replica's generation is drawn on must not depend on that (seen: the watch and the post-hoc report
    named different tracks for the same interval)."""
    whole = replica_generation(TraceData("whole", spans=list(spans)))
    assert {s.tid for s in whole} == {10}
    shuffled = list(spans)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert replica_generation(TraceData("piece", spans=shuffled[len(shuffled) // 2 :] + shuffled)) == whole
